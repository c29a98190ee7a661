"""Training curves: every metric of a :class:`~flows.train.History` against the epoch."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from flows.plot._figure import new_figure, save_figure

__all__ = ["plot_history"]

_SKIP = ("epoch", "step", "time", "skipped")


def plot_history(history: Any, path: str | os.PathLike | None = None, *, keys: Sequence[str] | None = None) -> Any:
    """Plot training curves: one panel per metric, training and ``val_`` values together.

    Args:
        history: a :class:`~flows.train.History` (or anything with ``records``: a list of dicts).
        path: where to save the picture (``None``: only return the figure).
        keys: metrics to show (default: every metric except epoch, step, time and skipped).

    Returns:
        The matplotlib figure.

    Example:
        >>> from flows.train import History
        >>> h = History()
        >>> for e in range(1, 4):
        ...     h.append({"epoch": e, "loss": 3.0 / e, "val_loss": 3.2 / e, "lr": 1e-3})
        >>> fig = plot_history(h)
        >>> [ax.get_title() for ax in fig.axes]
        ['loss', 'lr']
    """
    records = list(history.records)
    names: list[str] = []
    for record in records:
        names.extend(k for k in record if k not in names)
    if keys is None:
        keys = [k for k in names if k not in _SKIP and not k.startswith("val_")]
        keys += [k[4:] for k in names if k.startswith("val_") and k[4:] not in keys]
    columns = min(3, max(1, len(keys)))
    rows = max(1, math.ceil(len(keys) / columns))
    figure = new_figure(4.0 * columns, 3.0 * rows)
    for i, key in enumerate(keys):
        ax = figure.add_subplot(rows, columns, i + 1)
        for name, label in ((key, "training"), (f"val_{key}", "validation")):
            points = [(r["epoch"], r[name]) for r in records if name in r and r[name] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), "--" if label == "validation" else "-", label=label)
        ax.set_title(key)
        ax.set_xlabel("epoch")
        if key == "lr":
            ax.set_yscale("log")
        if len(ax.lines) > 1:
            ax.legend()
    save_figure(figure, path)
    return figure
