"""Helpers shared by the ``flows`` commands: run files, data fingerprints, output paths, pictures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

__all__: list[str] = []


def _class_index(model: torch.nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """The context of a class-conditional flow for integer ``labels`` ``(N,)``: the class index as a float ``(N, 1)``.

    What :meth:`flows.TarFlow.class_context` returns, on the CPU (the trainer moves batches to its device).
    """
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
    return labels.detach().cpu().to(dtype).reshape(-1, 1)


def _num_classes(model: torch.nn.Module) -> int:
    """The number of classes of a class-conditional flow (0 for a flow without classes)."""
    return int(getattr(model, "num_classes", 0) or 0)


def _cycling_classes(model: torch.nn.Module, n: int) -> torch.Tensor | None:
    """A context of ``n`` class indices ``0, 1, ..., K-1, 0, ...`` for a class-conditional flow (else ``None``)."""
    classes = _num_classes(model)
    return None if not classes else _class_index(model, torch.arange(n) % classes)


def _pictures(model: torch.nn.Module, data, directory: Path, name: str = "samples", n: int = 64) -> list[Path]:
    """Pictures of samples: an image grid, 2-D density contours, or a corner plot, by data kind.

    A class-conditional flow draws its samples cycling through the classes (``0, 1, ..., K-1, 0, ...``).
    """
    from flows.flow import evaluating
    from flows.plot import plot_corner, plot_density_2d, plot_image_grid
    from flows.train._atomic import atomic_path

    written = []
    with evaluating(model), torch.no_grad():
        if data.image_shape is not None:
            context = _cycling_classes(model, n)
            samples = model.sample((n,)) if context is None else model.sample(context=context.to(model.device))
            path = directory / f"{name}.png"
            by_class = "" if context is None else f", classes 0..{_num_classes(model) - 1} in turn"
            with atomic_path(path) as temporary:
                plot_image_grid(
                    samples, temporary, image_shape=data.image_shape, title=f"samples ({data.name}{by_class})"
                )
            written.append(path)
        elif data.features == 2:
            path = directory / "density.png"
            with atomic_path(path) as temporary:
                plot_density_2d(
                    model,
                    data.test if data.test is not None else data.train,
                    temporary,
                    title=f"density ({data.name})",
                    labels=data.columns,
                )
            written.append(path)
        else:
            samples = model.sample((2000,))
            reference = data.test if data.test is not None else data.train
            path = directory / "corner.png"
            with atomic_path(path) as temporary:
                plot_corner(
                    samples, reference[:2000], temporary, title=f"samples vs data ({data.name})", labels=data.columns
                )
            written.append(path)
    return written


class DataChanged(ValueError):
    """The data a command loaded no longer matches the fingerprint its run recorded."""


def _verify_fingerprint(info: dict, now: dict, where: Path, command: str, *, refuse: bool, how: str = "") -> None:
    """Compare the data fingerprint recorded in a checkpoint's ``info`` with the data loaded now.

    Runs written before fingerprints were recorded have none and are not checked. A mismatch
    raises :class:`DataChanged` when ``refuse``, else prints a one-line warning.
    """
    recorded = info.get("data_fingerprint") if isinstance(info, dict) else None
    if not isinstance(recorded, dict) or "sha256" not in recorded or recorded["sha256"] == now["sha256"]:
        return
    message = (
        f"the data changed since the run in {str(where)!r} was trained: expected data with sha256 "
        f"{recorded['sha256'][:16]}... (recorded by the run), got {now['sha256'][:16]}..."
    )
    if recorded.get("file_sha256") and now.get("file_sha256") and recorded["file_sha256"] != now["file_sha256"]:
        message += f" (the file {now.get('file', '')!r} was modified)"
    if refuse:
        raise DataChanged(f"{message}; {how}" if how else message)
    print(f"flows {command}: warning: {message}", file=sys.stderr)


def _check_writable_directory(path: Path, what: str) -> None:
    """Fail early, before any work, when ``path`` cannot be (or become) a writable directory."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what}: expected a directory, got the file {str(path)!r}")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{what}: cannot create {str(path)!r}: {str(existing)!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{what}: cannot write to {str(path)!r}: {str(existing)!r} is not writable")


def _check_output_file(path: Path, what: str) -> None:
    """Fail early when ``path`` is a directory or lies where no file can be written."""
    if path.is_dir():
        raise IsADirectoryError(f"{what}: expected a file path, got the directory {str(path)!r}")
    _check_writable_directory(path.parent, what)
