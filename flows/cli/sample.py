"""``flows sample``: draw from a run into a ``.npy`` file and a picture, never overwriting."""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

import numpy as np
import torch

from flows.cli._common import _check_output_file, _class_index, _cycling_classes, _num_classes
from flows.train._atomic import atomic_path, atomic_write_bytes

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
    from flows.cli.evaluate import load_run_model
    from flows.plot import plot_corner, plot_image_grid

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
    model, data = load_run_model(args, "sample", refuse=False)  # samples do not depend on the data: warn only
    options, context, what = _conditioning(args, model)
    samples = _draw(model, args.num, args.seed, context, options)
    finite = torch.isfinite(samples.reshape(len(samples), -1)).all(dim=1)
    if not bool(finite.all()):
        print(
            f"flows sample: warning: {int((~finite).sum())} of {args.num} samples have non-finite values "
            "(kept in the .npy file, left out of the picture)",
            file=sys.stderr,
        )
    buffer = io.BytesIO()
    np.save(buffer, samples.numpy())
    atomic_write_bytes(out, buffer.getbuffer())  # a full disk leaves the earlier file whole, and names it
    shown = samples[finite]
    if len(shown) == 0:
        print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} (no picture: none is finite)")
        return 0
    with atomic_path(picture) as temporary:
        if data is not None and data.image_shape is not None:
            plot_image_grid(shown, temporary, image_shape=data.image_shape, title=f"{len(shown)} samples{what}")
        else:
            labels = None if data is None else data.columns
            reference = None if data is None else data.test
            plot_corner(shown, reference, temporary, title=f"{len(shown)} samples{what}", labels=labels)
    print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} and a picture to {picture}")
    return 0


def _conditioning(args: argparse.Namespace, model: torch.nn.Module) -> tuple[dict, torch.Tensor | None, str]:
    """The ``model.sample`` keywords, class context and title words of ``--class/--guidance/--schedule/--denoise``.

    The context is ``None`` for a model without classes; the words say in the picture's title what was drawn.

    Raises:
        ValueError: for ``--class`` or ``--guidance`` on a model without classes, a class out of range,
            ``--schedule`` without ``--guidance``, or ``--denoise`` on a model that records no ``noise_std``.
    """
    label, guidance = getattr(args, "label", None), getattr(args, "guidance", None)
    schedule, denoise = getattr(args, "schedule", None), getattr(args, "denoise", False)
    classes = _num_classes(model)
    for flag, value in (("--class", label), ("--guidance", guidance)):
        if value is not None and not classes:
            raise ValueError(
                f"{flag} {value}: expected a class-conditional model (flows fit --labels), got "
                f"{type(model).__name__} without classes"
            )
    if label is not None and not 0 <= label < classes:
        raise ValueError(f"--class {label}: expected a class in 0..{classes - 1}, got {label}")
    if schedule is not None and guidance is None:
        raise ValueError(f"--schedule {schedule}: expected it with --guidance (it ramps the guidance weight), got none")
    if denoise and not getattr(model, "noise_std", None):
        raise ValueError(
            f"--denoise: expected a model trained with noise augmentation (a recorded noise_std), got "
            f"{type(model).__name__} with none"
        )
    options: dict[str, object] = {}
    if guidance is not None:
        options.update(guidance=guidance, schedule=schedule or "constant")
    if denoise:
        options["denoise"] = True
    if not classes:
        return options, None, " (denoised)" if denoise else ""
    context = (
        _cycling_classes(model, args.num)
        if label is None
        else _class_index(model, torch.full((args.num,), label, dtype=torch.int64))
    )
    what = f" of class {label}" if label is not None else f", classes 0..{classes - 1} in turn"
    if guidance is not None:
        what += f", guidance {guidance:g}" + (" (linear)" if schedule == "linear" else "")
    return options, context, what + (", denoised" if denoise else "")


def _draw(
    model: torch.nn.Module, num: int, seed: int, context: torch.Tensor | None = None, options: dict | None = None
) -> torch.Tensor:
    """``num`` samples of ``model`` from ``seed``, refusing a count whose samples cannot fit in memory.

    One sample gives the size of a row; ``-n`` is refused (naming it and its value) when the rows
    would need more than the machine's memory, and an allocation failure during sampling is
    reported the same way rather than as the allocator's message. A class-conditional model draws
    one sample per row of ``context``; ``options`` are the further keywords of ``model.sample``.
    """
    from flows.flow import evaluating

    options = options or {}
    context = None if context is None else context.to(next(iter(model.parameters())).device)

    def draw(n: int) -> torch.Tensor:
        if context is None:
            return model.sample((n,), **options)
        return model.sample(context=context[:n], **options)

    torch.manual_seed(seed)
    with evaluating(model), torch.no_grad():
        row = draw(1)
    need = num * row[0].numel() * row.element_size()
    have = _physical_memory()
    if have is not None and need > have // 2:
        raise ValueError(
            f"-n/--num {num}: expected a number of samples that fits in memory, got {num} x "
            f"{tuple(row.shape[1:])} values = {need / 2**30:.3g} GiB (this machine has {have / 2**30:.3g} GiB); "
            "draw fewer (several runs with different --seed)"
        )
    torch.manual_seed(seed)
    try:
        with evaluating(model), torch.no_grad():
            return draw(num).cpu()
    except (MemoryError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and "memory" not in str(error).lower() and "alloc" not in str(error):
            raise
        raise ValueError(
            f"-n/--num {num}: expected a number of samples that fits in memory, got out of memory while drawing "
            f"{num} x {tuple(row.shape[1:])} values; draw fewer"
        ) from None


def _physical_memory() -> int | None:
    """The machine's physical memory in bytes (``None`` where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def _check_picture_format(path: Path) -> None:
    """The picture's suffix is a format matplotlib writes (checked before sampling, not after)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ValueError(
            f"--picture: expected a file name ending in one of {', '.join('.' + f for f in sorted(formats))}, "
            f"got {str(path)!r}"
        )
