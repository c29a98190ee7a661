r"""Importance sampling against energy targets: log weights, Kish ESS, log Z, reweighting, free energies.

For samples :math:`x_i \sim q` of a model with (exact or path-wise, see
:mod:`flows.bijections.stochastic`) log-density :math:`\log q(x_i)` and a target
:math:`\pi \propto e^{-u}`, the log importance weights are

.. math:: \log w_i = -u(x_i) - \log q(x_i), \qquad \mathbb E_q[w] = Z = \int e^{-u}.

Everything here works in log space (weights spanning hundreds of nats are common) and on
tensors of shape ``(N,)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flows._validation import check_count, check_samples
from flows.flow import Flow, evaluating
from flows.targets.base import EnergyTarget

__all__ = [
    "MAX_BINS",
    "MAX_SAMPLE_ENTRIES",
    "FreeEnergyProfile",
    "free_energy_profile",
    "kish_ess",
    "log_importance_weights",
    "log_z_estimate",
    "reweighted_mean",
    "sample_log_weights",
]


MAX_BINS = 10_000_000
"""The most bins :func:`free_energy_profile` accepts (checked before anything is allocated)."""


def _check_log_weights(log_w: Tensor, who: str) -> Tensor:
    log_w = check_samples(log_w, who, "log weights", layout="(N,)", ndim=1, nan="refuse")
    if torch.isposinf(log_w).any():
        raise ValueError(f"{who}: expected log weights without +inf, got {int(torch.isposinf(log_w).sum())}")
    if torch.isneginf(log_w).all():
        raise ValueError(f"{who}: every weight is zero (all log weights are -inf)")
    return log_w


def log_importance_weights(energy: Tensor, log_q: Tensor) -> Tensor:
    r"""Log importance weights :math:`\log w = -u(x) - \log q(x)`.

    Args:
        energy: target energies :math:`u(x_i)`, shape ``batch``.
        log_q: model log-densities :math:`\log q(x_i)` of the same samples, shape ``batch``.

    Example:
        >>> import torch
        >>> log_importance_weights(torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -1.5])).tolist()
        [0.0, -0.5]
    """
    energy = check_samples(energy, "log_importance_weights", "energy", layout="batch")
    log_q = check_samples(log_q, "log_importance_weights", "log_q", layout="batch")
    if energy.shape != log_q.shape:
        raise ValueError(
            f"log_importance_weights: expected energy and log_q of the same shape, got {tuple(energy.shape)} "
            f"and {tuple(log_q.shape)}"
        )
    return -energy - log_q


MAX_SAMPLE_ENTRIES = 1 << 31
"""The most numbers (``n`` times the event size) :func:`sample_log_weights` draws in one call."""


@torch.no_grad()
def sample_log_weights(flow: Flow, target: EnergyTarget, n: int, *, batch_size: int = 10_000) -> tuple[Tensor, Tensor]:
    r"""Draw ``n`` samples from ``flow`` (in eval mode, without gradients) and their log weights against ``target``.

    Works for flows with stochastic blocks: their path terms make the weights exact.

    Returns:
        ``(x, log_w)`` of shapes ``(n, *event_shape)`` and ``(n,)``.

    Raises:
        TypeError: for a flow or target of the wrong kind, or non-integer counts.
        ValueError: for ``n < 1``, ``batch_size < 1``, or more than ``MAX_SAMPLE_ENTRIES`` numbers to hold.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import Gaussian
        >>> x, log_w = sample_log_weights(Flow(Affine(2), StandardNormal(2)), Gaussian(2), 100)
        >>> torch.allclose(log_w, torch.zeros(100), atol=1e-5)  # the model is the target
        True
    """
    if not isinstance(flow, Flow):
        raise TypeError(f"sample_log_weights: expected a Flow, got {type(flow).__name__}")
    if not callable(getattr(target, "energy", None)):
        raise TypeError(f"sample_log_weights: expected an energy target, got {type(target).__name__}")
    size = math.prod(s or 1 for s in flow.event_shape)
    check_count("sample_log_weights", "n", n, maximum=MAX_SAMPLE_ENTRIES // size)
    check_count("sample_log_weights", "batch_size", batch_size)
    xs, ws = [], []
    with evaluating(flow):
        for start in range(0, n, batch_size):
            x, log_q = flow.sample_and_log_prob((min(batch_size, n - start),))
            xs.append(x)
            ws.append(log_importance_weights(target.energy(x), log_q))
    return torch.cat(xs), torch.cat(ws)


def kish_ess(log_w: Tensor) -> Tensor:
    r"""Kish's effective sample size, normalised to :math:`[1/N, 1]`: :math:`(\sum w)^2 / (N \sum w^2)`.

    Example:
        >>> import torch
        >>> kish_ess(torch.zeros(10)).item(), round(kish_ess(torch.tensor([0.0, -1e9])).item(), 6)
        (1.0, 0.5)
    """
    log_w = _check_log_weights(log_w, "kish_ess")
    n = log_w.numel()
    return torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0) - math.log(n))


def log_z_estimate(log_w: Tensor) -> tuple[Tensor, Tensor]:
    r"""Importance-sampling estimate of :math:`\log Z = \log \mathbb E_q[w]` and its standard error.

    :math:`\widehat{\log Z} = \log \frac1N \sum_i w_i`; the standard error is the delta-method
    :math:`\hat\sigma_w / (\sqrt N\, \bar w)` with the unbiased sample standard deviation of the
    weights. :math:`\hat Z` is unbiased; :math:`\widehat{\log Z}` is biased low by about half the
    squared standard error.

    Returns:
        ``(log_z, stderr)``, two scalar tensors.

    Example:
        >>> import torch
        >>> log_z, se = log_z_estimate(torch.full((100,), 2.0))
        >>> round(log_z.item(), 6), se.item()
        (2.0, 0.0)
    """
    log_w = _check_log_weights(log_w, "log_z_estimate")
    n = log_w.numel()
    log_z = torch.logsumexp(log_w, 0) - math.log(n)
    if n < 2:
        return log_z, torch.full_like(log_z, math.inf)
    w = torch.exp(log_w - log_z)  # weights relative to their mean
    stderr = ((w - 1).square().sum() / (n - 1)).sqrt() / math.sqrt(n)
    return log_z, stderr


def reweighted_mean(values: Tensor, log_w: Tensor) -> Tensor:
    r"""Self-normalised importance-sampling estimate :math:`\sum_i w_i f_i / \sum_i w_i`.

    Samples of zero weight (log weight ``-inf``) do not enter, whatever their value (an infinite
    or NaN value there changes nothing); a NaN value of positive weight gives NaN. Integer and
    bool values are promoted to float64 (never the weights to the values' dtype).

    Args:
        values: :math:`f(x_i)`, shape ``(N, *value_shape)``.
        log_w: log weights, shape ``(N,)``.

    Returns:
        the estimate, shape ``value_shape``, in the promoted floating dtype of both inputs.

    Example:
        >>> import torch
        >>> round(reweighted_mean(torch.tensor([1.0, 3.0]), torch.tensor([0.0, math.log(3.0)])).item(), 4)
        2.5
    """
    log_w = _check_log_weights(log_w, "reweighted_mean")
    values = check_samples(values, "reweighted_mean", "values", layout="(N, *value_shape)", min_ndim=1)
    if values.shape[:1] != log_w.shape:
        raise ValueError(f"reweighted_mean: expected values of shape ({log_w.numel()}, ...), got {tuple(values.shape)}")
    dtype = torch.promote_types(values.dtype, log_w.dtype)
    w = torch.softmax(log_w.to(dtype), 0).reshape(-1, *(1,) * (values.dim() - 1))
    terms = torch.where(w > 0, w * values.to(dtype), torch.zeros((), dtype=dtype, device=values.device))
    return terms.sum(0)


def _range(bounds: object) -> tuple[float, float]:
    """``(low, high)`` as two finite floats, or a ``ValueError`` naming what came."""
    try:
        low, high = (float(b) for b in bounds)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"free_energy_profile: expected range (low, high) of two numbers, got {bounds!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"free_energy_profile: expected a finite range (low, high), got ({low}, {high})")
    return low, high


@dataclass
class FreeEnergyProfile:
    r"""A free-energy profile :math:`F(s) = -\log p(s)` (nats) on the bins of a coordinate :math:`s`.

    Attributes:
        centres: bin centres, shape ``(B,)``.
        free_energy: :math:`-\log` of the estimated density in each bin (``inf`` for empty bins).
        stderr: delta-method standard error of ``free_energy`` (``inf`` for empty bins).
        density: the estimated probability density in each bin (integrates to the probability
            mass inside ``range``).
    """

    centres: Tensor
    free_energy: Tensor
    stderr: Tensor
    density: Tensor


def free_energy_profile(
    coordinate: Tensor,
    log_w: Tensor | None = None,
    *,
    bins: int = 50,
    range: Sequence[float] | None = None,
) -> FreeEnergyProfile:
    r"""Free energy along a coordinate, :math:`F(s_b) = -\log \hat p(s_b)`, from (weighted) samples.

    With ``log_w`` the bin probabilities are self-normalised importance estimates
    :math:`\hat P_b = \sum_{i \in b} w_i / \sum_i w_i` (unweighted histogram without), the density
    is :math:`\hat P_b / \Delta`, and the standard error of :math:`F` is
    :math:`\operatorname{se}(\hat P_b)/\hat P_b` with
    :math:`\operatorname{se}(\hat P_b)^2 = \sum_i \tilde w_i^2 (\mathbb 1_b(s_i) - \hat P_b)^2`,
    :math:`\tilde w = w/\sum w`. Probabilities are normalised over **all** samples, so the profile
    is absolute (comparable to an exact :math:`-\log p(s)`), not shifted to a zero minimum.

    Args:
        coordinate: :math:`s(x_i)`, shape ``(N,)``.
        log_w: log weights, shape ``(N,)``, or ``None`` for the unweighted profile.
        bins: number of bins, at most ``MAX_BINS``.
        range: finite ``(low, high)`` with ``low < high``; defaults to the samples' range.

    Raises:
        TypeError: for a non-tensor coordinate or a non-integer ``bins``.
        ValueError: for an empty, NaN or infinite coordinate, bad log weights, ``bins`` out of
            ``[1, MAX_BINS]``, or a range that is not two finite numbers with ``low < high``.

    Example:
        >>> import torch
        >>> profile = free_energy_profile(torch.randn(100_000), bins=5, range=(-1.0, 1.0))
        >>> expected = 0.5 * profile.centres**2 + 0.5 * math.log(2 * math.pi)  # -log N(s; 0, 1)
        >>> bool((profile.free_energy - expected).abs().max() < 0.05)
        True
    """
    coordinate = check_samples(
        coordinate, "free_energy_profile", "coordinate", layout="(N,)", ndim=1, nan="refuse", inf="refuse"
    )
    check_count("free_energy_profile", "bins", bins, maximum=MAX_BINS)
    n = coordinate.numel()
    if log_w is None:
        w = torch.full_like(coordinate, 1.0 / n)
    else:
        log_w = _check_log_weights(log_w, "free_energy_profile")
        if log_w.shape != coordinate.shape:
            raise ValueError(
                f"free_energy_profile: expected log_w of shape {tuple(coordinate.shape)}, got {tuple(log_w.shape)}"
            )
        w = torch.softmax(log_w.to(coordinate.dtype), 0)
    low, high = (float(coordinate.min()), float(coordinate.max())) if range is None else _range(range)
    if not high > low:
        raise ValueError(f"free_energy_profile: expected range (low, high) with low < high, got ({low}, {high})")
    width = (high - low) / bins
    index = ((coordinate - low) / width).floor().long()
    index = torch.where(coordinate == high, bins - 1, index)
    inside = (index >= 0) & (index < bins)
    prob = torch.bincount(index[inside], weights=w[inside], minlength=bins).to(w.dtype)
    sq_in = torch.bincount(index[inside], weights=w[inside].square(), minlength=bins).to(w.dtype)
    # sum_i w_i^2 (1_b(s_i) - P_b)^2, split into the samples inside and outside bin b
    var = sq_in * (1 - prob).square() + (w.square().sum() - sq_in) * prob.square()
    with torch.no_grad():
        free_energy = -(prob / width).log()
        stderr = torch.where(prob > 0, var.sqrt() / prob, torch.full_like(prob, math.inf))
    centres = low + width * (torch.arange(bins, dtype=coordinate.dtype, device=coordinate.device) + 0.5)
    return FreeEnergyProfile(centres, free_energy, stderr, prob / width)
