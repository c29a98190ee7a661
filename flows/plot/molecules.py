"""Molecular Boltzmann generators: Ramachandran plots of reference, flow and reweighted samples side by side."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from flows.plot._figure import new_figure, save_figure

__all__ = ["plot_ramachandran"]


def plot_ramachandran(
    panels: Sequence[tuple[str, Tensor, Tensor | None]],
    path: str | os.PathLike | None = None,
    *,
    bins: int = 100,
    decades: float = 5.0,
    title: str | None = None,
) -> Any:
    r"""Ramachandran histograms :math:`(\phi, \psi)` side by side, one panel per sample set, log colour scale.

    The standard picture of the field (reference, flow samples, reweighted flow samples): each
    panel is a ``bins`` × ``bins`` histogram on :math:`[-\pi, \pi]^2`, normalised to a probability
    per bin, drawn with one shared logarithmic colour scale spanning ``decades`` decades below the
    largest bin of all panels, so that panels compare; bins below that (a reweighted histogram
    carried by a few samples leaves most bins at 1e-100 and less) and empty bins are blank.

    Args:
        panels: ``(title, angles, log_w)`` triples: ``angles`` ``(N, 2)`` in radians (φ, ψ),
            ``log_w`` ``(N,)`` log weights or ``None`` (equal weights).
        path: where to save the picture (``None``: only return the figure).
        bins: bins per axis.
        decades: the span of the colour scale.
        title: figure title.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: for no panels, angles that are not ``(N, 2)``, or weights of another length.

    Example:
        >>> import torch
        >>> a = torch.rand(500, 2) * 6 - 3
        >>> fig = plot_ramachandran([("uniform", a, None), ("reweighted", a, torch.zeros(500))])
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['uniform', 'reweighted']
    """
    from matplotlib.colors import LogNorm

    if not panels:
        raise ValueError("plot_ramachandran: expected at least one (title, angles, log_w) panel, got none")
    hists = [(name, _histogram(name, angles, log_w, bins)) for name, angles, log_w in panels]
    if not (isinstance(decades, (int, float)) and 0 < decades < 300):
        raise ValueError(f"plot_ramachandran: expected decades in (0, 300), got {decades!r}")
    vmax = max(float(h.max()) for _, h in hists) or 1.0
    vmin = vmax * 10.0 ** (-decades)
    figure = new_figure(4.0 * len(hists) + 0.8, 3.8)
    extent = (-math.pi, math.pi, -math.pi, math.pi)
    image = None
    for k, (name, h) in enumerate(hists):
        ax = figure.add_subplot(1, len(hists), k + 1)
        masked = torch.where(h >= vmin, h, torch.tensor(math.nan, dtype=h.dtype)).T.numpy()
        image = ax.imshow(
            masked, origin="lower", extent=extent, norm=LogNorm(vmin, vmax), cmap="viridis", aspect="equal"
        )
        ax.set_title(name)
        ax.set_xlabel("φ (rad)")
        if k == 0:
            ax.set_ylabel("ψ (rad)")
    figure.colorbar(image, ax=figure.axes, label="probability per bin", shrink=0.85)
    if title:
        figure.suptitle(title)
    save_figure(figure, path, dpi=110)
    return figure


def _histogram(name: str, angles: Tensor, log_w: Tensor | None, bins: int) -> Tensor:
    """The ``bins`` × ``bins`` histogram of one panel's ``(φ, ψ)``, weighted and normalised to sum to 1."""
    if not isinstance(angles, Tensor) or angles.dim() != 2 or angles.shape[-1] != 2:
        raise ValueError(
            f"plot_ramachandran: expected angles (N, 2) for {name!r}, got {getattr(angles, 'shape', angles)}"
        )
    angles = angles.detach().double().cpu()
    if log_w is None:
        w = torch.full((len(angles),), 1.0 / len(angles), dtype=torch.float64)
    else:
        if log_w.shape != angles.shape[:1]:
            raise ValueError(
                f"plot_ramachandran: expected log_w of shape ({len(angles)},) for {name!r}, got {tuple(log_w.shape)}"
            )
        w = torch.softmax(torch.nan_to_num(log_w.detach().double().cpu(), nan=-math.inf), 0)
    h = torch.histogramdd(angles, bins=[bins, bins], range=[-math.pi, math.pi] * 2, weight=w).hist
    return h / h.sum().clamp_min(1e-300)
