r"""Evaluation of particle Boltzmann generators as in the literature: test NLL in both conventions, importance weights.

Conventions: the normalised NLL is :math:`-\frac1N\sum \log q(x_i)` with :math:`q` a density on the
:math:`(n-1)d`-dimensional zero-centre-of-mass subspace (Satorras et al. 2021; Midgley et al.
2023). The bgflow-based code (Köhler et al. 2020; Klein et al. 2023) leaves the mean-free
Gaussian's constant out: :math:`\text{NLL}_\text{bgflow} = \text{NLL} - \tfrac{(n-1)d}{2}\log 2\pi`
(DW4: −5.51 nats, LJ13: −33.08 nats).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from flows._validation import check_count, check_samples
from flows.flow import Flow, evaluating
from flows.metrics.importance import (
    MAX_SAMPLE_ENTRIES,
    kish_ess,
    log_importance_weights,
    log_z_estimate,
    reweighted_mean,
)
from flows.nn._particles import _check_sizes
from flows.targets.base import EnergyTarget

__all__ = ["BoltzmannEvaluation", "boltzmann_evaluation", "nll_conventions", "particle_nll"]


def nll_conventions(nll: float, n_particles: int, spatial_dim: int) -> dict[str, float]:
    r"""A normalised NLL in both conventions: ``{"normalised": nll, "bgflow": nll − ½(n−1)d log 2π}``.

    Example:
        >>> {k: round(v, 2) for k, v in nll_conventions(7.21, 4, 2).items()}  # Klein et al.'s DW4
        {'normalised': 7.21, 'bgflow': 1.7}
    """
    _check_sizes(n_particles, spatial_dim, "nll_conventions")
    if isinstance(nll, bool) or not isinstance(nll, (int, float, Tensor)):
        raise TypeError(f"nll_conventions: expected nll to be a number, got {type(nll).__name__}")
    constant = 0.5 * (n_particles - 1) * spatial_dim * math.log(2 * math.pi)
    return {"normalised": float(nll), "bgflow": float(nll) - constant}


def _chunks(total: int, size: int, progress: bool, what: str) -> list[tuple[int, int]] | object:
    """``(start, length)`` of each chunk, wrapped in a tqdm bar counting rows when ``progress``."""
    check_count(what, "n", total, minimum=0)
    check_count(what, "batch_size", size)
    if not isinstance(progress, bool):
        raise TypeError(f"{what}: expected progress to be True or False, got {progress!r}")
    chunks = [(k, min(size, total - k)) for k in range(0, total, size)]
    if not progress:
        return chunks
    from tqdm.auto import tqdm  # imported on first use: keeps `import flows` fast

    return tqdm(chunks, desc=what, unit="chunk", total=len(chunks), leave=False)


def _check_flow(flow: object, dtype: object, who: str) -> None:
    if not isinstance(flow, Flow):
        raise TypeError(f"{who}: expected a Flow, got {type(flow).__name__}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{who}: expected a floating-point dtype, got {dtype!r}")


@torch.no_grad()
def particle_nll(
    flow: Flow, x: Tensor, *, batch_size: int = 1000, dtype: torch.dtype = torch.float64, progress: bool = False
) -> Tensor:
    r"""Per-sample :math:`-\log q(x)` in eval mode (the flow's exact trace), in ``dtype`` (float64 by default).

    The flow is converted to ``dtype`` for the evaluation and back afterwards.

    Args:
        flow: the flow (e.g. :class:`~flows.particles.EquivariantCNF`).
        x: test configurations ``(N, n·d)``.
        batch_size: rows per solve.
        dtype: evaluation dtype.
        progress: show a progress bar over the solves.

    Returns:
        ``(N,)`` negative log-likelihoods (normalised convention).
    """
    _check_flow(flow, dtype, "particle_nll")
    x = check_samples(x, "particle_nll", "x", layout="(N, n·d)", min_ndim=2, empty_batch=True)
    old = flow.dtype
    flow.to(dtype)
    try:
        with evaluating(flow):
            chunks = _chunks(len(x), batch_size, progress, "particle_nll")
            out = [-flow.log_prob(x[k : k + m].to(dtype)) for k, m in chunks] or [x.new_zeros(0, dtype=dtype)]
    finally:
        flow.to(old)
    return torch.cat(out)


@dataclass
class BoltzmannEvaluation:
    r"""Importance-sampling summary of a flow against an energy target (see :func:`boltzmann_evaluation`).

    Attributes:
        samples: flow samples ``(N, n·d)``.
        log_w: log importance weights ``(N,)`` (:math:`-u - \log q`).
        energy: target energies of the samples ``(N,)``.
        ess: Kish ESS in ``[1/N, 1]``.
        log_z: log Z estimate (on the subspace) and its standard error.
        mean_energy: reweighted :math:`\langle u \rangle` and its standard error (delta method).
        seconds: wall time of drawing the samples with their log-densities.
    """

    samples: Tensor
    log_w: Tensor
    energy: Tensor
    ess: float
    log_z: tuple[float, float]
    mean_energy: tuple[float, float]
    seconds: float


@torch.no_grad()
def boltzmann_evaluation(
    flow: Flow,
    target: EnergyTarget,
    n: int,
    *,
    batch_size: int = 1000,
    dtype: torch.dtype = torch.float64,
    progress: bool = False,
) -> BoltzmannEvaluation:
    r"""Draw ``n`` samples with exact :math:`\log q` and reweight them to the target's Boltzmann distribution.

    :math:`\log w_i = -u(x_i) - \log q(x_i)` (:func:`flows.metrics.log_importance_weights`), Kish
    ESS, :math:`\log Z` with its standard error, and the self-normalised mean energy
    :math:`\sum w_i u_i / \sum w_i` with standard error
    :math:`\sqrt{\sum \bar w_i^2 (u_i - \hat u)^2}` (:math:`\bar w` normalised weights). Samples
    with non-finite energy get zero weight. Everything in ``dtype``; ``progress`` shows a bar over
    the ``batch_size`` chunks.
    """
    _check_flow(flow, dtype, "boltzmann_evaluation")
    features = math.prod(s or 1 for s in flow.event_shape)
    check_count("boltzmann_evaluation", "n", n, maximum=MAX_SAMPLE_ENTRIES // features)
    old = flow.dtype
    flow.to(dtype)
    target = target.to(dtype)
    xs, log_qs = [], []
    start = time.perf_counter()
    try:
        with evaluating(flow):
            for _, m in _chunks(n, batch_size, progress, "boltzmann_evaluation"):
                x, log_q = flow.sample_and_log_prob((m,))
                xs.append(x)
                log_qs.append(log_q)
    finally:
        flow.to(old)
    seconds = time.perf_counter() - start
    x, log_q = torch.cat(xs), torch.cat(log_qs)
    energy = target.energy(x)
    log_w = log_importance_weights(energy, log_q)
    log_w = torch.where(torch.isfinite(log_w), log_w, torch.full_like(log_w, -math.inf))
    log_z, se = log_z_estimate(log_w)
    finite = torch.isfinite(energy)
    u = torch.where(finite, energy, torch.zeros_like(energy))
    mean_u = reweighted_mean(u, log_w)
    w = torch.softmax(log_w, 0)
    # samples of zero weight contribute nothing, even when (u - mean)^2 overflows (0 * inf would be NaN)
    se_u = torch.where(w > 0, w.square() * (u - mean_u).square(), torch.zeros_like(w)).sum().sqrt()
    return BoltzmannEvaluation(
        samples=x,
        log_w=log_w,
        energy=energy,
        ess=float(kish_ess(log_w)),
        log_z=(float(log_z), float(se)),
        mean_energy=(float(mean_u), float(se_u)),
        seconds=seconds,
    )
