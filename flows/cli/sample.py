"""``flows sample``: draw from a run into a ``.npy`` file and a picture, never overwriting."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from flows.cli._common import _check_output_file, _check_run_data

__all__ = ["sample"]


def _unused_names(out: Path, picture: Path) -> tuple[Path, Path]:
    """``out`` and ``picture``, or their ``-2``, ``-3``, ... versions, the first number that neither file has."""
    first_out, first_picture, number = out, picture, 1
    while out.exists() or picture.exists():
        number += 1
        out = first_out.with_name(f"{first_out.stem}-{number}{first_out.suffix}")
        picture = first_picture.with_name(f"{first_picture.stem}-{number}{first_picture.suffix}")
    return out, picture


def sample(args: argparse.Namespace) -> int:
    """``flows sample RUN``: write samples and a picture under unused names; returns 0."""
    from flows.flow import evaluating
    from flows.plot import plot_corner, plot_image_grid
    from flows.train.runs import load_run

    if args.num < 1:
        raise ValueError(f"expected -n/--num >= 1, got {args.num}")
    base = args.run if args.run.is_dir() else args.run.parent
    out = args.out or base / "samples.npy"
    _check_output_file(out, "--out")
    if out.suffix != ".npy":  # what numpy.save would do silently: say it, and report the real path
        out = out.with_name(out.name + ".npy")
    picture = args.picture or out.with_suffix(".png")
    if not args.overwrite:  # earlier samples stay: default names get a number, named files need --overwrite
        if args.out is None and args.picture is None:
            out, picture = _unused_names(out, picture)
        elif taken := [str(p) for p in dict.fromkeys((args.out, out, picture)) if p is not None and p.exists()]:
            raise ValueError(f"expected new output files, got existing {taken}; pass --overwrite to replace them")
    _check_output_file(out, "--out")
    _check_output_file(picture, "--picture")
    _check_picture_format(picture)
    model, data = load_run(args.run)
    if data is not None:
        _check_run_data(args, data, "sample", refuse=False)  # samples do not depend on the data: warn only
    torch.manual_seed(args.seed)
    with evaluating(model), torch.no_grad():
        samples = model.sample((args.num,))
    finite = torch.isfinite(samples.reshape(len(samples), -1)).all(dim=1)
    if not bool(finite.all()):
        print(
            f"flows sample: warning: {int((~finite).sum())} of {args.num} samples have non-finite values "
            "(kept in the .npy file, left out of the picture)",
            file=sys.stderr,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as handle:
        np.save(handle, samples.numpy())
    shown = samples[finite]
    if len(shown) == 0:
        print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} (no picture: none is finite)")
        return 0
    picture.parent.mkdir(parents=True, exist_ok=True)
    if data is not None and data.image_shape is not None:
        plot_image_grid(shown, picture, image_shape=data.image_shape, title=f"{len(shown)} samples")
    else:
        labels = None if data is None else data.columns
        plot_corner(shown, None if data is None else data.test, picture, title=f"{len(shown)} samples", labels=labels)
    print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} and a picture to {picture}")
    return 0


def _check_picture_format(path: Path) -> None:
    """The picture's suffix is a format matplotlib writes (checked before sampling, not after)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ValueError(
            f"--picture: expected a file name ending in one of {', '.join('.' + f for f in sorted(formats))}, "
            f"got {str(path)!r}"
        )
