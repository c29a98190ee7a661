"""MCMC pictures: per-chain traces with the acceptance rate, and pairwise scatter plots coloured by chain."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from flows.mcmc.sampler import Trace
from flows.plot._figure import new_figure, save_figure

__all__ = ["plot_chain_pairs", "plot_trace"]


def _chains(samples: Trace | Tensor, who: str) -> Tensor:
    x = samples.samples if isinstance(samples, Trace) else samples
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"{who}: expected a Trace or samples of shape (draws, chains, *event), got {x!r:.80}")
    return x.detach().cpu().double().reshape(x.shape[0], x.shape[1], -1)


def _coordinates(
    x: Tensor, dims: Sequence[int] | None, max_dims: int, labels: Sequence[str] | None
) -> tuple[list[int], list[str]]:
    """The flattened coordinates to show (default: the first ``max_dims``) and their names (default ``x<d>``)."""
    dims = list(dims) if dims is not None else list(range(min(max_dims, x.shape[2])))
    return dims, list(labels) if labels is not None else [f"x{d}" for d in dims]


def _spread(chains: int, most: int) -> list[int]:
    """Up to ``most`` chain indices evenly spaced over ``range(chains)`` (chains are often started in blocks)."""
    if chains <= most:
        return list(range(chains))
    return sorted({round(i * (chains - 1) / (most - 1)) for i in range(most)}) if most > 1 else [0]


def plot_trace(
    samples: Trace | Tensor,
    path: str | os.PathLike | None = None,
    *,
    dims: Sequence[int] | None = None,
    max_dims: int = 4,
    max_chains: int = 8,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """Trace plots: one panel per coordinate, one line per chain; plus the running acceptance of a Trace.

    Chains stuck in different modes show as separated bands; a chain that rarely moves shows as
    a staircase. Given a :class:`~flows.mcmc.Trace`, a last panel shows each step's acceptance
    probability averaged over chains (and the local moves' for a global-local kernel).

    Args:
        samples: a :class:`~flows.mcmc.Trace`, or samples ``(draws, chains, *event_shape)``.
        path: where to save the picture.
        dims: flattened coordinates to show (default: the first ``max_dims``).
        max_dims: cap on the number of coordinates shown by default.
        max_chains: at most this many chains are drawn (evenly spaced over the batch).
        labels: names of the shown coordinates.
        title: figure title.

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> fig = plot_trace(torch.randn(100, 3, 2))
        >>> len(fig.axes)
        2
    """
    x = _chains(samples, "plot_trace")
    dims, labels = _coordinates(x, dims, max_dims, labels)
    trace = samples if isinstance(samples, Trace) else None
    rows = len(dims) + (trace is not None)
    figure = new_figure(7.0, 1.6 * rows + 0.4)
    steps = range(x.shape[0])
    for row, dim in enumerate(dims):
        ax = figure.add_subplot(rows, 1, row + 1)
        for chain in _spread(x.shape[1], max_chains):
            ax.plot(steps, x[:, chain, dim].numpy(), lw=0.7, alpha=0.8)
        ax.set_ylabel(labels[row])
        ax.set_xlim(0, max(x.shape[0] - 1, 1))
    if trace is not None:
        ax = figure.add_subplot(rows, 1, rows)
        ax.plot(trace.accept_prob.detach().double().mean(1).cpu().numpy(), lw=0.8, label="accept prob.")
        for key, value in trace.extras.items():
            if key.endswith("accept_prob"):
                ax.plot(value.detach().double().mean(1).cpu().numpy(), lw=0.8, label=key.replace("_", " "))
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("acceptance")
        ax.legend(fontsize="small", loc="lower right")
    figure.axes[-1].set_xlabel("step")
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure


def plot_chain_pairs(
    samples: Trace | Tensor,
    reference: Tensor | None = None,
    path: str | os.PathLike | None = None,
    *,
    dims: Sequence[int] | None = None,
    max_dims: int = 4,
    max_chains: int = 10,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """Pairwise scatter plots of chain samples, one colour per chain, over reference samples in grey.

    Each chain in its own colour shows at a glance whether chains mix between modes (colours
    interleave) or stay where they started (one colour per blob).

    Args:
        samples: a :class:`~flows.mcmc.Trace`, or samples ``(draws, chains, *event_shape)``.
        reference: exact or reference samples ``(N, *event_shape)`` drawn in grey underneath.
        path: where to save the picture.
        dims: flattened coordinates to show (default: the first ``max_dims``).
        max_dims: cap on the number of coordinates shown by default.
        max_chains: at most this many chains are drawn (evenly spaced over the batch).
        labels: names of the shown coordinates.
        title: figure title.

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> fig = plot_chain_pairs(torch.randn(50, 4, 3), reference=torch.randn(200, 3))
        >>> len(fig.axes)  # the lower triangle of a 3 x 3 grid
        3
    """
    x = _chains(samples, "plot_chain_pairs")
    dims, labels = _coordinates(x, dims, max_dims, labels)
    if len(dims) < 2:
        raise ValueError(f"plot_chain_pairs: expected at least two coordinates, got dims={dims}")
    ref = reference.detach().cpu().double().reshape(len(reference), -1) if reference is not None else None
    k = len(dims) - 1
    figure = new_figure(2.2 * k + 0.5, 2.2 * k + 0.3)
    for row in range(1, len(dims)):
        for col in range(row):
            ax = figure.add_subplot(k, k, (row - 1) * k + col + 1)
            if ref is not None:
                ax.scatter(ref[:, dims[col]].numpy(), ref[:, dims[row]].numpy(), s=1, c="0.75", linewidths=0)
            for chain in _spread(x.shape[1], max_chains):
                ax.scatter(x[:, chain, dims[col]].numpy(), x[:, chain, dims[row]].numpy(), s=2, linewidths=0)
            if row == len(dims) - 1:
                ax.set_xlabel(labels[col])
            if col == 0:
                ax.set_ylabel(labels[row])
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure
