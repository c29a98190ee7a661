"""Particle Boltzmann generators: energy and pair-distance histograms of flow, reweighted and reference samples."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from flows.plot._figure import new_figure, save_figure

if TYPE_CHECKING:
    from flows.targets import ParticleSystem

__all__ = ["plot_particle_histograms"]


def plot_particle_histograms(
    target: ParticleSystem,
    reference: Tensor,
    samples: Tensor,
    log_w: Tensor | None = None,
    path: str | os.PathLike | None = None,
    *,
    bins: int = 60,
    title: str | None = None,
) -> Any:
    r"""Energy and interatomic-distance histograms in one figure (the standard Boltzmann-generator picture).

    Left: densities of :math:`u(x)` for the reference data, the flow samples and the flow samples
    reweighted by :math:`w \propto e^{-u - \log q}`; right: the same for all pair distances
    :math:`d_{ij}`. The energy axis spans the reference's 0.1 %–99.9 % quantiles widened by a quarter
    (flow samples of very high energy fall outside, as in the literature's figures).

    Args:
        target: a particle target with ``energy(x)`` and ``distances(x)`` (e.g. :class:`~flows.targets.DW4`).
        reference: reference configurations ``(M, n·d)``.
        samples: flow samples ``(N, n·d)``.
        log_w: their log importance weights ``(N,)`` (``None``: no reweighted histogram).
        path: where to save the picture (``None``: only return the figure).
        bins: histogram bins per panel.
        title: figure title.

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> from flows.targets import DW4
        >>> x = torch.randn(200, 8) * 2
        >>> fig = plot_particle_histograms(DW4(), x, x + 0.1, torch.zeros(200))
        >>> [ax.get_xlabel() for ax in fig.axes]
        ['energy u(x)', 'interatomic distance']
    """
    if samples.dim() != 2 or reference.dim() != 2 or samples.shape[1] != reference.shape[1]:
        raise ValueError(
            "plot_particle_histograms: expected reference (M, D) and samples (N, D), "
            f"got {tuple(reference.shape)} and {tuple(samples.shape)}"
        )
    if log_w is not None and log_w.shape != samples.shape[:1]:
        raise ValueError(
            f"plot_particle_histograms: expected log_w of shape ({samples.shape[0]},), got {tuple(log_w.shape)}"
        )
    with torch.no_grad():
        dtype = next((b.dtype for b in target.buffers() if b.is_floating_point()), torch.float32)
        reference, samples = reference.to(dtype), samples.to(dtype)
        u_ref, u_flow = target.energy(reference).double(), target.energy(samples).double()
        d_ref, d_flow = target.distances(reference).double(), target.distances(samples).double()
    weights = None
    if log_w is not None:
        weights = torch.softmax(torch.nan_to_num(log_w.double(), nan=-torch.inf), 0)
    low, high = torch.quantile(u_ref, torch.tensor([0.001, 0.999], dtype=torch.float64)).tolist()
    pad = 0.25 * (high - low)
    energy_range = (low - pad, high + pad)
    figure = new_figure(10.0, 3.6)
    panels = (
        ("energy u(x)", u_ref, u_flow, energy_range, 1),
        ("interatomic distance", d_ref.flatten(), d_flow.flatten(), None, d_flow.shape[1]),
    )
    for k, (label, ref, flow, limits, per_sample) in enumerate(panels):
        ax = figure.add_subplot(1, 2, k + 1)
        _histogram_panel(ax, ref, flow, limits, weights, per_sample, bins)
        ax.set_xlabel(label)
        ax.set_ylabel("density")
        if k == 0:
            ax.legend()
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure


def _histogram_panel(
    ax: Any,
    ref: Tensor,
    flow: Tensor,
    limits: tuple[float, float] | None,
    weights: Tensor | None,
    per_sample: int,
    bins: int,
) -> None:
    """One panel: the reference, the flow samples inside ``limits`` and, with weights, the reweighted samples."""
    if limits is None:
        limits = (min(ref.min().item(), flow.min().item()), max(ref.max().item(), flow.max().item()))
    style = {"bins": bins, "range": limits, "density": True, "histtype": "step", "linewidth": 1.5}
    inside = torch.isfinite(flow) & (flow >= limits[0]) & (flow <= limits[1])
    ax.hist(ref.numpy(), label="reference data", color="black", **style)
    if inside.any():  # an empty histogram cannot be normalised
        ax.hist(flow[inside].numpy(), label="flow samples", color="tab:blue", **style)
    if weights is not None:
        w = weights.repeat_interleave(per_sample)[inside]
        if w.sum() > 0:
            ax.hist(flow[inside].numpy(), weights=w.numpy(), label="reweighted", color="tab:red", **style)
