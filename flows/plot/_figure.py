"""Figure creation and saving without pyplot (matplotlib is imported here, lazily)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["new_figure", "save_figure"]


def new_figure(width: float, height: float) -> Any:
    """A matplotlib ``Figure`` of the given size in inches, with an Agg canvas (works headless)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("flows.plot needs matplotlib: pip install matplotlib") from error
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Any, path: str | os.PathLike | None, dpi: int = 100) -> None:
    """Save ``figure`` to ``path`` (parent directories created) when a path is given."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
