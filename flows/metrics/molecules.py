r"""Evaluation of molecular Boltzmann generators: torsion-histogram KL, state free energies, basin fractions.

The measures the field reports for alanine dipeptide (Midgley et al. 2023, FAB; Klein et al. 2023),
for samples :math:`x_i` of a model with log importance weights :math:`\log w_i` towards the
Boltzmann density (:func:`~flows.metrics.importance.log_importance_weights`):

* :func:`histogram_kl`: :math:`\mathrm{KL}(p_{\text{ref}} \,\|\, q) = \sum_b p_b \log(p_b / q_b)` of
  histograms of a torsion (FAB: 200 bins on :math:`[-\pi, \pi]`) or of the Ramachandran pair
  :math:`(\phi, \psi)` (FAB: 64 × 64 bins), each histogram normalised and offset by
  :math:`\varepsilon = 10^{-10}` per bin, raw (``log_w=None``) or reweighted;
* :func:`state_free_energy`: :math:`\Delta F = F_B - F_A = -\log(p_B / p_A)` (units of kT) between
  a state :math:`B` and its complement :math:`A` from self-normalised weights, with its
  delta-method standard error and, optionally, a bootstrap one;
* :func:`torsion_periodic_distance`: the wrapped difference of angles.

References:
    Midgley, Stimper, Simm, Schölkopf, Hernández-Lobato (2023), "Flow Annealed Importance Sampling
    Bootstrap", ICLR, arXiv:2208.01893 (the histogram conventions).
    Kong (1992); Owen (2013), "Monte Carlo theory, methods and examples", ch. 9 (the delta method for
    self-normalised importance sampling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flows._validation import check_count, check_number, check_real, check_samples
from flows.metrics.importance import _check_log_weights

__all__ = ["StateFreeEnergy", "histogram_kl", "state_free_energy", "torsion_periodic_distance"]

_ANGLE_RANGE = (-math.pi, math.pi)


def _weights(n: int, log_w: Tensor | None, who: str, name: str, dtype: torch.dtype) -> Tensor:
    """Self-normalised weights ``(n,)`` from ``log_w`` (uniform for ``None``)."""
    if log_w is None:
        return torch.full((n,), 1.0 / n, dtype=dtype)
    log_w = _check_log_weights(log_w, who)
    if log_w.shape != (n,):
        raise ValueError(f"{who}: expected {name} of shape ({n},), got {tuple(log_w.shape)}")
    return torch.softmax(log_w.to(torch.float64), 0).to(dtype)


def _histogram(values: Tensor, weights: Tensor, bins: int, box: Sequence[float]) -> Tensor:
    """Normalised histogram of ``(N,)`` or ``(N, 2)`` values on ``box`` (values outside are dropped)."""
    low, high = float(box[0]), float(box[1])
    index = ((values - low) / (high - low) * bins).floor().long()
    index = torch.where(values == high, bins - 1, index)
    inside = ((index >= 0) & (index < bins)).all(-1) if values.dim() == 2 else (index >= 0) & (index < bins)
    flat = index[inside] if values.dim() == 1 else index[inside, 0] * bins + index[inside, 1]
    size = bins if values.dim() == 1 else bins * bins
    counts = torch.bincount(flat, weights=weights[inside], minlength=size).to(torch.float64)
    total = counts.sum()
    return counts / total if total > 0 else counts


def histogram_kl(
    reference: Tensor,
    samples: Tensor,
    *,
    log_w: Tensor | None = None,
    reference_log_w: Tensor | None = None,
    bins: int = 200,
    range: Sequence[float] = _ANGLE_RANGE,
    eps: float = 1e-10,
) -> float:
    r"""KL divergence :math:`\sum_b p_b \log(p_b/q_b)` of a reference histogram :math:`p` and a model one :math:`q`.

    Both histograms have ``bins`` equal bins on ``range`` (per axis for two-column input: the
    Ramachandran histogram), are normalised over the samples inside, and get ``eps`` added to every
    bin (FAB's convention: 200 bins on :math:`[-\pi, \pi]` for a torsion, 64 per axis for
    :math:`(\phi, \psi)`, :math:`\varepsilon = 10^{-10}`). Samples outside ``range`` are dropped.

    Args:
        reference: reference values ``(N,)`` or ``(N, 2)`` (e.g. MD or umbrella frames).
        samples: model values of the same layout ``(M,)`` or ``(M, 2)``.
        log_w: log importance weights ``(M,)`` of the model samples (``None``: the raw histogram).
        reference_log_w: log weights ``(N,)`` of the reference (e.g. MBAR weights), or ``None``.
        bins: bins per axis.
        range: ``(low, high)`` of every axis.
        eps: the offset added to each normalised bin.

    Returns:
        the KL divergence in nats (a float, ``>= 0`` up to the ``eps`` offset).

    Raises:
        ValueError: for values that are not 1-D or 2-column, NaN values, layouts that differ,
            weights of the wrong shape, ``eps < 0``, or a range with ``low >= high``.

    Example:
        >>> import torch
        >>> x = torch.rand(1000) * 6 - 3
        >>> histogram_kl(x, x) < 1e-12  # the same histogram
        True
    """
    who = "histogram_kl"
    layout = "(N,) or (N, 2)"
    reference = check_samples(reference, who, "reference", layout=layout, min_ndim=1, nan="refuse")
    samples = check_samples(samples, who, "samples", layout=layout, min_ndim=1, nan="refuse")
    for name, v in (("reference", reference), ("samples", samples)):
        if v.dim() > 2 or (v.dim() == 2 and v.shape[-1] != 2):
            raise ValueError(f"{who}: expected {name} of shape (N,) or (N, 2), got {tuple(v.shape)}")
    if reference.dim() != samples.dim():
        raise ValueError(
            f"{who}: expected reference and samples of the same layout, got {tuple(reference.shape)} "
            f"and {tuple(samples.shape)}"
        )
    check_count(who, "bins", bins, maximum=100_000)
    if isinstance(range, (str, bytes)) or not isinstance(range, Sequence) or len(range) != 2:
        raise ValueError(f"{who}: expected range to be a pair (low, high), got {range!r}")
    low, high = (check_number(who, "range", b) for b in range)
    if not low < high:
        raise ValueError(f"{who}: expected a finite range (low, high) with low < high, got {tuple(range)}")
    check_number(who, "eps", eps, minimum=0)
    reference, samples = reference.detach().double().cpu(), samples.detach().double().cpu()
    p_w = _weights(len(reference), reference_log_w, who, "reference_log_w", torch.float64)
    q_w = _weights(len(samples), log_w, who, "log_w", torch.float64)
    p = _histogram(reference, p_w, bins, (low, high)) + eps
    q = _histogram(samples, q_w, bins, (low, high)) + eps
    return float((p * (p / q).log()).sum())


def torsion_periodic_distance(a: Tensor, b: Tensor) -> Tensor:
    r"""Wrapped difference :math:`a - b` of angles, in :math:`[-\pi, \pi)`.

    Example:
        >>> import math, torch
        >>> round(torsion_periodic_distance(torch.tensor(3.0), torch.tensor(-3.0)).item(), 4)
        -0.2832

    Raises:
        TypeError: for inputs that are not real floating-point tensors.
        ValueError: for shapes that do not broadcast.
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"torsion_periodic_distance: expected {name} to be a torch.Tensor, got {type(value).__name__}"
            )
        check_real(value, "torsion_periodic_distance", name)
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise ValueError(
            "torsion_periodic_distance: expected angles of broadcastable shapes, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        ) from None
    return torch.remainder(a - b + math.pi, 2 * math.pi) - math.pi


@dataclass
class StateFreeEnergy:
    r"""The free-energy difference :math:`\Delta F = F_B - F_A = -\log(p_B/p_A)` (kT) of a state and its complement.

    Attributes:
        delta_f: :math:`\Delta F` (``inf`` when no weight falls in :math:`B`, ``-inf`` when all does).
        stderr: its delta-method standard error
            :math:`\operatorname{se}(\hat p_B) / (\hat p_A \hat p_B)`.
        p_b: the estimated probability :math:`\hat p_B`.
        p_b_stderr: :math:`\operatorname{se}(\hat p_B)^2 = \sum_i \tilde w_i^2 (\mathbb 1_B(x_i) - \hat p_B)^2`.
        n_b: the number of samples in :math:`B` (of any weight).
        ess_b: the Kish effective number of samples in :math:`B`, :math:`(\sum_B w)^2 / \sum_B w^2`
            (0 when none).
        bootstrap_stderr: the standard deviation of :math:`\Delta F` over bootstrap resamples
            (``None`` unless asked for; resamples without a sample in one state are left out).
    """

    delta_f: float
    stderr: float
    p_b: float
    p_b_stderr: float
    n_b: int
    ess_b: float
    bootstrap_stderr: float | None = None


def _delta_f(p_b: Tensor) -> Tensor:
    return -(p_b.log() - (1 - p_b).log())


#: The most resampled entries (``bootstrap`` times ``N``) :func:`state_free_energy` draws at once.
MAX_BOOTSTRAP_ENTRIES = 10**8


def state_free_energy(
    in_b: Tensor,
    log_w: Tensor | None = None,
    *,
    bootstrap: int = 0,
    generator: torch.Generator | None = None,
) -> StateFreeEnergy:
    r"""Free-energy difference :math:`\Delta F = F_B - F_A = -\log(\hat p_B / \hat p_A)` from (weighted) samples.

    :math:`\hat p_B = \sum_i \tilde w_i \mathbb 1_B(x_i)` with self-normalised weights
    :math:`\tilde w = w / \sum w` (uniform without ``log_w``) and :math:`\hat p_A = 1 - \hat p_B`.
    The delta method gives :math:`\operatorname{se}(\Delta F) = \operatorname{se}(\hat p_B) /
    (\hat p_A \hat p_B)` with the self-normalised importance-sampling variance
    :math:`\operatorname{se}(\hat p_B)^2 = \sum_i \tilde w_i^2 (\mathbb 1_B(x_i) - \hat p_B)^2`
    (Owen 2013, eq. 9.8; for equal weights the binomial :math:`p(1-p)/N`). With ``bootstrap > 0``
    the samples are also resampled with replacement that many times. Both assume independent
    samples (flow samples are; MD frames are correlated, and their errors are larger).

    Args:
        in_b: boolean membership of each sample in :math:`B`, shape ``(N,)``.
        log_w: log importance weights ``(N,)``, or ``None`` for equally weighted samples.
        bootstrap: number of bootstrap resamples (0: none).
        generator: random generator of the resampling.

    Raises:
        TypeError: for a non-boolean ``in_b``, a non-integer ``bootstrap`` or weights that are not a tensor.
        ValueError: for an ``in_b`` that is not ``(N,)``, weights of another shape, bad weights, or a
            ``bootstrap`` below 0 or above ``MAX_BOOTSTRAP_ENTRIES / N``.

    Example:
        >>> import torch
        >>> result = state_free_energy(torch.tensor([True] + [False] * 9))
        >>> round(result.delta_f, 4), round(result.p_b, 2)  # -log(0.1 / 0.9)
        (2.1972, 0.1)
    """
    who = "state_free_energy"
    if not isinstance(in_b, Tensor) or in_b.dtype != torch.bool:
        raise TypeError(f"{who}: expected a bool tensor in_b, got {getattr(in_b, 'dtype', type(in_b).__name__)}")
    if in_b.dim() != 1 or in_b.numel() == 0:
        raise ValueError(f"{who}: expected in_b of shape (N,) with N >= 1, got {tuple(in_b.shape)}")
    n = in_b.numel()
    check_count(who, "bootstrap", bootstrap, minimum=0, maximum=max(1, MAX_BOOTSTRAP_ENTRIES // n))
    if log_w is not None and not isinstance(log_w, Tensor):
        raise TypeError(f"{who}: expected log_w to be a torch.Tensor or None, got {type(log_w).__name__}")
    in_b = in_b.detach().cpu()
    w = _weights(n, None if log_w is None else log_w.detach().cpu(), who, "log_w", torch.float64)
    member = in_b.double()
    p_b = (w * member).sum()
    se_p = (w.square() * (member - p_b).square()).sum().sqrt()
    delta_f = _delta_f(p_b)
    se = se_p / (p_b * (1 - p_b)) if 0 < p_b < 1 else torch.tensor(math.inf, dtype=torch.float64)
    w_b = w[in_b]
    ess_b = float(w_b.sum().square() / w_b.square().sum()) if bool((w_b > 0).any()) else 0.0
    boot = None
    if bootstrap:
        index = torch.randint(n, (bootstrap, n), generator=generator)
        wb = w[index]
        pb = (wb * member[index]).sum(-1) / wb.sum(-1)
        ok = (pb > 0) & (pb < 1)
        boot = float(_delta_f(pb[ok]).std()) if int(ok.sum()) > 1 else math.inf
    return StateFreeEnergy(float(delta_f), float(se), float(p_b), float(se_p), int(in_b.sum()), ess_b, boot)
