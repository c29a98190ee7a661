"""Densities and marginals: 2-D density contours against data, corner plots of samples against data."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from flows.plot._figure import new_figure, save_figure

__all__ = ["plot_corner", "plot_density_2d"]


@torch.no_grad()
def plot_density_2d(
    model: nn.Module,
    data: Tensor | None = None,
    path: str | os.PathLike | None = None,
    *,
    bounds: tuple[float, float, float, float] | None = None,
    grid: int = 150,
    max_points: int = 2000,
    title: str | None = None,
    labels: Sequence[str] | None = None,
) -> Any:
    """Filled contours of a 2-D model density :math:`p(x)` with data points on top.

    The density is evaluated in eval mode (``flows.evaluating``) on a ``grid × grid`` lattice;
    the panel title reports the mass on the plotted window (close to 1 when the window covers the
    model and its log-determinants are right).

    Args:
        model: anything with ``log_prob(x)`` for ``x`` of shape ``(N, 2)``.
        data: points to overlay (``(N, 2)``).
        path: where to save the picture.
        bounds: ``(xmin, xmax, ymin, ymax)`` (default: the data's range with a margin, else ±4).
        grid: lattice points per axis.
        max_points: at most this many data points are drawn.
        title: figure title.
        labels: names of the two axes, e.g. a CSV file's column names (default ``x0``, ``x1``).

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> fig = plot_density_2d(Flow(Affine(2), StandardNormal(2)), torch.randn(50, 2), bounds=(-5, 5, -5, 5))
        >>> fig.axes[0].get_title(), fig.axes[0].get_xlabel()
        ('mass on window: 1.000', 'x0')
    """
    from flows.flow import evaluating

    anchor = next(iter(model.parameters()), None)
    dtype = anchor.dtype if anchor is not None else torch.get_default_dtype()
    device = anchor.device if anchor is not None else torch.device("cpu")
    if bounds is None:
        if data is not None and len(data):
            low, high = data.amin(0).double(), data.amax(0).double()
            margin = 0.15 * (high - low) + 1e-3
            bounds = (
                float(low[0] - margin[0]),
                float(high[0] + margin[0]),
                float(low[1] - margin[1]),
                float(high[1] + margin[1]),
            )
        else:
            bounds = (-4.0, 4.0, -4.0, 4.0)
    xs = torch.linspace(bounds[0], bounds[1], grid, dtype=torch.float64)
    ys = torch.linspace(bounds[2], bounds[3], grid, dtype=torch.float64)
    mesh = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2)
    with evaluating(model):
        log_p = torch.cat([model.log_prob(chunk.to(device, dtype)).double().cpu() for chunk in mesh.split(8192)])
    density = log_p.exp().nan_to_num(0.0).reshape(grid, grid)
    cell = float((xs[1] - xs[0]) * (ys[1] - ys[0]))
    figure = new_figure(5.0, 4.5)
    ax = figure.add_subplot(1, 1, 1)
    ax.contourf(xs.numpy(), ys.numpy(), density.numpy(), levels=20, cmap="viridis")
    if data is not None:
        points = data[:max_points].detach().cpu().double()
        ax.scatter(points[:, 0].numpy(), points[:, 1].numpy(), s=2, c="white", alpha=0.5, linewidths=0)
    ax.set_xlim(bounds[0], bounds[1])
    ax.set_ylim(bounds[2], bounds[3])
    ax.set_title(f"mass on window: {float(density.sum()) * cell:.3f}")
    x_label, y_label = list(labels) if labels is not None else ["x0", "x1"]
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure


def _range(values: Tensor, reference: Tensor | None) -> tuple[float, float]:
    """The 0.5 % and 99.5 % quantiles of the values and the reference together: a panel's axis range."""
    pool = torch.cat([values, reference]) if reference is not None else values
    return torch.quantile(pool, 0.005).item(), torch.quantile(pool, 0.995).item()


def _corner_panel(ax: Any, samples: Tensor, ref: Tensor | None, col: int, row: int, bins: int) -> None:
    """One panel of a corner plot: the marginal of ``col`` (diagonal) or the pair ``(col, row)`` (below)."""
    a = samples[:, col]
    lo, hi = _range(a, ref[:, col] if ref is not None else None)
    if row == col:
        if ref is not None:
            ax.hist(ref[:, col].numpy(), bins=bins, range=(lo, hi), density=True, color="0.6", label="data")
        ax.hist(a.numpy(), bins=bins, range=(lo, hi), density=True, histtype="step", color="C0", label="model")
        ax.set_yticks([])
        return
    b = samples[:, row]
    lo_b, hi_b = _range(b, ref[:, row] if ref is not None else None)
    if ref is not None:
        ax.scatter(ref[:, col].numpy(), ref[:, row].numpy(), s=1, c="0.6", alpha=0.3, linewidths=0)
    ax.hist2d(a.numpy(), b.numpy(), bins=bins // 2, range=((lo, hi), (lo_b, hi_b)), cmap="Blues", cmin=1, alpha=0.8)


def plot_corner(
    samples: Tensor,
    data: Tensor | None = None,
    path: str | os.PathLike | None = None,
    *,
    dims: Sequence[int] | None = None,
    max_dims: int = 5,
    labels: Sequence[str] | None = None,
    bins: int = 40,
    title: str | None = None,
) -> Any:
    """Corner plot: 1-D marginals on the diagonal, pairwise 2-D histograms below, samples against data.

    Args:
        samples: model samples ``(N, D)``.
        data: reference data ``(M, D)`` drawn in grey beside the samples.
        path: where to save the picture.
        dims: which dimensions to show (default: the first ``max_dims``).
        max_dims: cap on the number of dimensions shown by default.
        labels: names of every feature (e.g. a CSV file's column names) or of the shown dimensions.
        bins: histogram bins.
        title: figure title.

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> fig = plot_corner(torch.randn(500, 3), torch.randn(500, 3))
        >>> len(fig.axes)  # 3 diagonal + 3 lower panels
        6
    """
    samples = samples.detach().cpu().double().reshape(len(samples), -1)
    dims = list(dims) if dims is not None else list(range(min(max_dims, samples.shape[1])))
    ref = data.detach().cpu().double().reshape(len(data), -1) if data is not None else None
    if labels is None:
        labels = [f"x{d}" for d in dims]
    elif len(labels) == samples.shape[1]:  # one name per feature (e.g. a CSV header): those of the shown ones
        labels = [labels[d] for d in dims]
    elif len(labels) != len(dims):
        raise ValueError(
            f"plot_corner: expected {len(dims)} labels (or {samples.shape[1]}, one per feature), got {len(labels)}"
        )
    k = len(dims)
    figure = new_figure(2.0 * k + 0.5, 2.0 * k + 0.3)
    for row in range(k):
        for col in range(row + 1):
            ax = figure.add_subplot(k, k, row * k + col + 1)
            _corner_panel(ax, samples, ref, dims[col], dims[row], bins)
            if row == k - 1:
                ax.set_xlabel(labels[col])
            if col == 0 and row > 0:
                ax.set_ylabel(labels[row])
    if ref is not None and k:
        figure.axes[0].legend(fontsize="small")
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure
