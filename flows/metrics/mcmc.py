r"""MCMC diagnostics: acceptance, effective sample size and R̂ (as ArviZ), mode weights, sliced Wasserstein.

Chain samples are laid out ``(draws, chains, *event_shape)`` (as in :attr:`flows.mcmc.Trace.samples`);
per-coordinate diagnostics return a tensor of shape ``event_shape``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flows._validation import check_count, check_samples

__all__ = [
    "ESS_METHODS",
    "MAX_PROJECTIONS",
    "RHAT_METHODS",
    "acceptance_rate",
    "effective_sample_size",
    "integrated_autocorr_time",
    "mode_weight_error",
    "mode_weights",
    "sliced_wasserstein",
    "split_rhat",
]


def _draws_chains(samples: Tensor, who: str, min_draws: int = 4) -> Tensor:
    """Check the ``(draws, chains, *event)`` layout and flatten the event: ``(draws, chains, p)`` in float64.

    The check is :func:`flows._validation.check_samples` (non-empty, bool/int promoted, NaN kept).
    """
    x = check_samples(samples, who, layout="(draws, chains, *event)", min_ndim=2)
    if x.shape[0] < min_draws:
        raise ValueError(f"{who}: expected at least {min_draws} draws, got {x.shape[0]}")
    return x.to(torch.float64).reshape(x.shape[0], x.shape[1], -1)


def _nan_where_nan(value: Tensor, x: Tensor, event: torch.Size) -> Tensor:
    """``value`` ``(p,)`` with NaN for every coordinate that has a NaN draw in ``x`` ``(n, m, p)``, shaped ``event``.

    A NaN draw makes every diagnostic of its coordinate undefined: ArviZ returns NaN there, and so
    does this module (rank-based methods would otherwise rank the NaN and report a finite,
    converged-looking value).
    """
    return torch.where(torch.isnan(x).any(0).any(0), torch.nan, value).reshape(event)


def _check_flag(value: object, who: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{who}: expected {name} to be True or False, got {value!r}")
    return value


def acceptance_rate(accepted: Tensor) -> Tensor:
    """Per-chain fraction of accepted moves from a ``(steps, chains)`` record (bool or probabilities).

    Example:
        >>> import torch
        >>> acceptance_rate(torch.tensor([[True, False], [True, True]])).tolist()
        [1.0, 0.5]
    """
    x = check_samples(accepted, "acceptance_rate", "accepted", layout="(steps, chains)", ndim=2)
    outside = (x < 0) | (x > 1)
    if bool(outside.any()):
        where = outside.nonzero()[0].tolist()
        raise ValueError(
            f"acceptance_rate: expected acceptances or probabilities in [0, 1], got {x[tuple(where)].item()} "
            f"at index {tuple(where)}"
        )
    return x.to(torch.float64).mean(0)


def _autocovariance(x: Tensor) -> Tensor:
    """Biased (``1/n``) autocovariance of each chain and coordinate at every lag, by FFT: ``(n, m, p)``."""
    n = x.shape[0]
    centred = x - x.mean(0)
    size = 1 << (2 * n - 1).bit_length()
    spectrum = torch.fft.rfft(centred, n=size, dim=0)
    return torch.fft.irfft(spectrum * spectrum.conj(), n=size, dim=0)[:n] / n


def _split(x: Tensor) -> Tensor:
    """Cut each chain into its first and last ``n // 2`` draws: ``(n, m, p)`` → ``(n // 2, 2m, p)``."""
    half = x.shape[0] // 2
    return torch.cat([x[:half], x[x.shape[0] - half :]], dim=1)


def _pooled_quantile(x: Tensor, q: float) -> Tensor:
    """Quantile ``q`` of all draws of all chains per coordinate (linear interpolation, numpy's default): ``(p,)``."""
    return torch.quantile(x.reshape(-1, x.shape[-1]), q, dim=0)


def _z_scale(x: Tensor) -> Tensor:
    r"""Rank-normalise: :math:`z = \Phi^{-1}((r - 3/8) / (S - 1/4))` with :math:`r` the rank among all :math:`S` draws.

    Ties get their average rank (as ``scipy.stats.rankdata``); Blom's offset 3/8. Per coordinate.
    """
    n, m, p = x.shape
    size = n * m
    flat = x.reshape(size, p)
    values, order = flat.sort(dim=0)
    position = torch.arange(size, device=x.device)[:, None].expand(size, p)
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1]
    ends = torch.ones_like(starts)
    ends[:-1] = starts[1:]
    first = torch.cummax(torch.where(starts, position, 0), dim=0).values
    last = torch.cummin(torch.where(ends, position, size).flip(0), dim=0).values.flip(0)
    average_rank = (first + last).to(x.dtype) / 2 + 1
    ranks = torch.empty_like(average_rank).scatter_(0, order, average_rank)
    return torch.special.ndtri((ranks - 0.375) / (size + 0.25)).reshape(n, m, p)


def _fold(x: Tensor) -> Tensor:
    """Absolute deviation from the median of all draws, per coordinate.

    The median of an even number of draws is ``(a + b) / 2`` of the middle two, computed as numpy
    does: the two middle draws then tie exactly after folding, as they do in ArviZ.
    """
    values = x.reshape(-1, x.shape[-1]).sort(dim=0).values
    half = values.shape[0] // 2
    median = values[half] if values.shape[0] % 2 else (values[half - 1] + values[half]) / 2
    return (x - median).abs()


def _tau(x: Tensor) -> Tensor:
    r"""Integrated autocorrelation time of ``(n, m, p)`` chains as they are (no split, no ranks): ``(p,)``.

    Multi-chain autocorrelations (Vehtari et al. 2021, eqs. 10-11) and Geyer's initial positive and
    monotone sequences, truncated exactly as Stan and ArviZ do it (the even autocorrelation of the
    first non-positive pair is kept when it is positive).
    """
    n, m, p = x.shape
    acov = _autocovariance(x)
    within = acov[0].mean(0) * n / (n - 1)
    var_plus = within * (n - 1) / n
    if m > 1:
        var_plus = var_plus + x.mean(0).var(0)
    rho = 1.0 - (within - acov.mean(1)) / var_plus
    rho[0] = 1.0
    last_pair = max((n - 3) // 2, 0)  # pairs (rho_2k, rho_2k+1) for k = 0..last_pair are examined
    pairs = rho[: 2 * last_pair + 2].reshape(last_pair + 1, 2, p).sum(1)
    stop = pairs <= 0
    k = torch.where(stop.any(0), stop.to(torch.int8).argmax(0), last_pair)  # first non-positive pair, else the last
    monotone = torch.cummin(pairs, dim=0).values  # Geyer's initial monotone sequence
    kept = torch.arange(last_pair + 1, device=x.device)[:, None] < k
    columns = torch.arange(p, device=x.device)
    even = rho[2 * k, columns]
    tail = torch.where((even > 0) | (pairs[k, columns] >= 0), even, 0.0)
    tau = -1.0 + 2.0 * torch.where(kept, monotone, 0.0).sum(0) + tail
    tau = tau.clamp(min=1.0 / math.log10(n * m))
    constant = (x.amax((0, 1)) - x.amin((0, 1))) < torch.finfo(torch.float64).resolution
    return torch.where(constant, 1.0, tau)


def _ess(x: Tensor) -> Tensor:
    """Effective sample size ``n m / tau`` of ``(n, m, p)`` chains as they are: ``(p,)``."""
    return x.shape[0] * x.shape[1] / _tau(x)


def integrated_autocorr_time(samples: Tensor, *, split: bool = True) -> Tensor:
    r"""Integrated autocorrelation time :math:`\tau` per coordinate, pooled over chains.

    With the multi-chain autocorrelation estimate of Stan (Vehtari et al. 2021, eqs. 10–11),

    .. math::
        \hat\rho_t = 1 - \frac{W - \frac1m\sum_j \hat\gamma_{j,t}}{\widehat{\operatorname{var}}^+},
        \qquad \widehat{\operatorname{var}}^+ = \frac{n-1}{n}W + \frac{B}{n},

    (:math:`\hat\gamma_{j,t}` the lag-:math:`t` autocovariance of chain :math:`j`, :math:`W` the
    mean within-chain variance, :math:`B/n` the variance of the chain means) and Geyer's initial
    positive and monotone sequences: the pair sums :math:`\Gamma_k = \hat\rho_{2k} + \hat\rho_{2k+1}`
    are kept while positive and made non-increasing, :math:`\tau = -1 + 2\sum_k \Gamma_k + \hat\rho_{2K}`
    (the even term of the first non-positive pair :math:`K`, when positive), floored at
    :math:`1/\log_{10}(nm)`, exactly as ArviZ's ``ess(method="mean")`` computes it: ``tau =
    n m / ess``. Chains that sit in different modes inflate :math:`B` and hence :math:`\tau`.

    References:
        Geyer (1992), "Practical Markov Chain Monte Carlo", Statist. Sci. 7. Vehtari, Gelman,
        Simpson, Carpenter, Bürkner (2021), "Rank-normalization, folding, and localization: An
        improved R̂ for assessing convergence of MCMC", Bayesian Analysis 16, arXiv:1903.08008.

    Args:
        samples: ``(draws, chains, *event_shape)`` with at least 4 draws.
        split: split each chain into its two halves first (detects drifting chains; Stan's and
            ArviZ's default). For an odd number of draws the middle draw is dropped.

    Returns:
        :math:`\tau` of shape ``event_shape``, in units of draws.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> tau = integrated_autocorr_time(torch.randn(1000, 4, 2))  # independent draws: tau ~ 1
        >>> bool(((tau > 0.8) & (tau < 1.2)).all())
        True
    """
    _check_flag(split, "integrated_autocorr_time", "split")
    x = _draws_chains(samples, "integrated_autocorr_time")
    return _nan_where_nan(_tau(_split(x) if split else x), x, samples.shape[2:])


MAX_PROJECTIONS = 1_000_000
"""The most directions :func:`sliced_wasserstein` accepts (more is a typo, not a better estimate)."""

ESS_METHODS = ("bulk", "tail", "mean", "sd", "quantile")


def effective_sample_size(
    samples: Tensor, *, method: str = "bulk", prob: float | tuple[float, float] | None = None, split: bool = True
) -> Tensor:
    r"""Effective sample size per coordinate, as ArviZ's ``ess`` (Vehtari et al. 2021).

    Each method applies :func:`integrated_autocorr_time`'s estimator,
    :math:`\mathrm{ESS} = nm/\tau`, to a transform of the (split) chains:

    * ``"bulk"`` (default): rank-normalised draws :math:`z = \Phi^{-1}((r - 3/8)/(S + 1/4))`, with
      :math:`r` the rank of a draw among all :math:`S` draws (ties averaged). Reliable for the
      centre of the distribution, and finite even for heavy tails without a mean.
    * ``"tail"``: the smaller of the ESS of the indicators :math:`I(x \le q_{0.05})` and
      :math:`I(x \le q_{0.95})` (``prob`` changes the two quantile levels; ``prob=p`` means
      ``(p, 1 - p)``): how well the 5 % and 95 % quantiles are estimated.
    * ``"mean"``: the draws themselves (the classic ESS of the mean, Stan before 2.21).
    * ``"sd"``: the squared deviations from the mean.
    * ``"quantile"``: the indicator :math:`I(x \le q_{\text{prob}})` for one level ``prob``.

    Agrees with ``arviz.ess(chains, method=method)`` to rounding (``tests/test_diagnostics_arviz.py``);
    ``split=False`` gives ArviZ's ``"identity"`` for ``"mean"`` (ArviZ has no unsplit bulk ESS).
    Rule of thumb (Vehtari et al.): bulk and tail ESS above 100 per chain before trusting
    the estimates.

    References:
        Vehtari, Gelman, Simpson, Carpenter, Bürkner (2021), "Rank-normalization, folding, and
        localization: An improved R̂ for assessing convergence of MCMC", Bayesian Analysis 16,
        arXiv:1903.08008.

    Args:
        samples: ``(draws, chains, *event_shape)`` with at least 4 draws.
        method: one of ``ESS_METHODS``.
        prob: quantile level(s) for ``"tail"`` (default ``(0.05, 0.95)``) and ``"quantile"`` (required).
        split: split each chain into its two halves first (the default, as in Stan and ArviZ).

    Returns:
        ESS of shape ``event_shape``, float64, out of ``draws · chains``.

    Raises:
        ValueError: for an unknown method, or ``prob`` outside (0, 1) or missing for ``"quantile"``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.zeros(2000, 8)
        >>> for t in range(1, 2000):  # AR(1), phi = 0.5: tau = (1 + phi) / (1 - phi) = 3
        ...     x[t] = 0.5 * x[t - 1] + torch.randn(8) * 0.75**0.5
        >>> ess = effective_sample_size(x)
        >>> bool(16000 / 3 * 0.85 < ess < 16000 / 3 * 1.15)
        True
    """
    if method not in ESS_METHODS:
        raise ValueError(f"effective_sample_size: expected method in {ESS_METHODS}, got {method!r}")
    _check_flag(split, "effective_sample_size", "split")
    x = _draws_chains(samples, "effective_sample_size")
    event = samples.shape[2:]
    if prob is not None and method not in ("tail", "quantile"):
        raise ValueError(f"effective_sample_size: expected prob only with method 'tail' or 'quantile', got {method!r}")
    if method in ("tail", "quantile"):
        levels = _quantile_levels(method, prob)
        ess = [
            _ess(_split(below) if split else below)
            for below in ((x <= _pooled_quantile(x, q)).to(x.dtype) for q in levels)
        ]
        return _nan_where_nan(torch.stack(ess).amin(0), x, event)
    y = (x - x.mean((0, 1))).square() if method == "sd" else x
    if split:
        y = _split(y)
    if method == "bulk":
        y = _z_scale(y)
    return _nan_where_nan(_ess(y), x, event)


def _quantile_levels(method: str, prob: float | tuple[float, float] | None) -> tuple[float, ...]:
    """The quantile levels of the ``"tail"`` and ``"quantile"`` ESS methods, checked."""
    if method == "quantile" and prob is None:
        raise ValueError("effective_sample_size: expected a quantile level prob for method 'quantile', got None")
    if method == "quantile":
        levels = (prob,)
    elif prob is None:
        levels = (0.05, 0.95)
    elif isinstance(prob, (tuple, list)):
        levels = tuple(prob)
    else:
        levels = (prob, 1 - prob)
    if not all(isinstance(q, (int, float)) and 0 < q < 1 for q in levels):
        raise ValueError(f"effective_sample_size: expected quantile levels in (0, 1), got {prob!r}")
    return levels


RHAT_METHODS = ("rank", "split", "folded", "z_scale", "identity")


def split_rhat(samples: Tensor, *, method: str = "rank") -> Tensor:
    r"""Rank-normalised split potential scale reduction factor :math:`\hat R` per coordinate.

    Each chain is cut into two halves of :math:`n` draws (a middle draw is dropped for odd
    lengths); for chains :math:`y` with :math:`W` the mean within-chain variance and :math:`B/n`
    the variance of the chain means,

    .. math:: \hat R(y) = \sqrt{\frac{\frac{n-1}{n}W + \frac{B}{n}}{W}}.

    ``method="rank"`` (default, Vehtari et al. 2021) reports
    :math:`\max(\hat R(z), \hat R(z_{\text{fold}}))`: :math:`z` the rank-normalised split draws
    (see :func:`effective_sample_size`), :math:`z_{\text{fold}}` the rank-normalised absolute
    deviations from the median, which catch chains that differ in scale rather than location.
    ``"split"`` is the classic split-:math:`\hat R` of the raw draws, ``"folded"`` and ``"z_scale"``
    its two rank-normalised halves, ``"identity"`` the unsplit :math:`\hat R` of Gelman and Rubin.
    Agrees with ``arviz.rhat(chains, method=method)`` to rounding, except that ArviZ returns NaN for
    a single chain where the split halves make :math:`\hat R` defined here (as in Stan). Values
    below 1.01 are necessary, not sufficient, for convergence.

    References:
        Gelman, Rubin (1992), "Inference from Iterative Simulation Using Multiple Sequences",
        Statist. Sci. 7. Vehtari, Gelman, Simpson, Carpenter, Bürkner (2021), "Rank-normalization,
        folding, and localization: An improved R̂ for assessing convergence of MCMC", Bayesian
        Analysis 16, arXiv:1903.08008.

    Args:
        samples: ``(draws, chains, *event_shape)`` with at least 4 draws.
        method: one of ``RHAT_METHODS``.

    Returns:
        :math:`\hat R` of shape ``event_shape``, float64.

    Raises:
        ValueError: for an unknown method, or ``"identity"`` with a single chain.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> mixed = torch.randn(500, 4)
        >>> stuck = mixed + torch.tensor([0.0, 0.0, 3.0, 3.0])  # two chains in another mode
        >>> round(split_rhat(mixed).item(), 2), split_rhat(stuck).item() > 1.5
        (1.0, True)
    """
    if method not in RHAT_METHODS:
        raise ValueError(f"split_rhat: expected method in {RHAT_METHODS}, got {method!r}")
    x = _draws_chains(samples, "split_rhat")
    if method == "identity" and x.shape[1] < 2:
        raise ValueError(f"split_rhat: expected at least 2 chains for method 'identity', got {x.shape[1]}")
    event = samples.shape[2:]
    y = x if method == "identity" else _split(x)
    if method == "rank":
        value = torch.maximum(_rhat(_z_scale(y)), _rhat(_z_scale(_fold(y))))
    elif method == "folded":
        value = _rhat(_z_scale(_fold(y)))
    elif method == "z_scale":
        value = _rhat(_z_scale(y))
    else:
        value = _rhat(y)
    return _nan_where_nan(value, x, event)


def _rhat(x: Tensor) -> Tensor:
    """Potential scale reduction of ``(n, m, p)`` chains as they are: ``(p,)``."""
    n = x.shape[0]
    within = x.var(0).mean(0)
    var_plus = within * (n - 1) / n + x.mean(0).var(0)
    return torch.sqrt(var_plus / within)


def mode_weights(samples: Tensor, means: Tensor) -> Tensor:
    """Fraction of samples nearest (Euclidean) to each mode centre.

    Args:
        samples: ``(*batch, *event_shape)``, all batch dimensions pooled (e.g. ``(draws, chains, d)``).
        means: mode centres ``(K, *event_shape)``.

    Returns:
        Weights ``(K,)`` summing to one; all NaN when a sample has a NaN or infinite coordinate
        (such a sample has no nearest mode, and leaving it out would change the fractions).

    Raises:
        ValueError: for empty samples or means, non-finite means, or an event shape other than the means'.

    Example:
        >>> import torch
        >>> means = torch.tensor([[-5.0], [5.0]])
        >>> mode_weights(torch.tensor([[-4.0], [-6.0], [4.5], [-5.5]]), means).tolist()
        [0.75, 0.25]
    """
    means = check_samples(means, "mode_weights", "means", layout="(K, *event)", min_ndim=2, nan="refuse", inf="refuse")
    event_ndim = means.dim() - 1
    layout = f"(*batch, {', '.join(map(str, means.shape[1:]))})"
    samples = check_samples(samples, "mode_weights", layout=layout, min_ndim=event_ndim)
    if samples.shape[samples.dim() - event_ndim :] != means.shape[1:]:
        raise ValueError(f"mode_weights: expected samples of shape {layout}, got {tuple(samples.shape)}")
    dtype = torch.promote_types(samples.dtype, means.dtype)
    flat = samples.reshape(-1, math.prod(means.shape[1:])).to(dtype)
    centres = means.reshape(means.shape[0], -1).to(dtype)
    if not bool(torch.isfinite(flat).all()):
        return torch.full((means.shape[0],), torch.nan, dtype=dtype, device=flat.device)
    nearest = torch.cdist(flat, centres).argmin(dim=1)
    return torch.bincount(nearest, minlength=means.shape[0]).to(dtype) / flat.shape[0]


def mode_weight_error(samples: Tensor, means: Tensor, weights: Tensor | None = None) -> float:
    r"""Largest error of the mode weights: :math:`\max_k |\hat w_k - w_k|`.

    :math:`\hat w_k` is the fraction of samples nearest mode :math:`k` (:func:`mode_weights`) and
    :math:`w_k` the true weight (uniform by default). For the 4-mode mixture, chains that all
    stay in one mode score 0.75.

    References:
        Grenioux, Durmus, Moulines, Gabrié (2023), "On Sampling with Approximate Transport Maps",
        ICML, arXiv:2302.04763 (mode-weight histograms on the Gaussian-mixture benchmark).

    Args:
        samples: ``(*batch, *event_shape)``.
        means: mode centres ``(K, *event_shape)``.
        weights: true mode weights ``(K,)`` (default ``1/K`` each).

    Returns:
        the error, NaN when a sample has a NaN or infinite coordinate (see :func:`mode_weights`).

    Example:
        >>> import torch
        >>> means = torch.tensor([[-5.0], [5.0]])
        >>> mode_weight_error(torch.full((10, 1), -5.0), means)
        0.5
    """
    estimate = mode_weights(samples, means)
    if weights is None:
        weights = torch.full_like(estimate, 1.0 / estimate.numel())
    weights = check_samples(weights, "mode_weight_error", "weights", layout="(K,)", nan="refuse", inf="refuse")
    weights = weights.to(dtype=estimate.dtype, device=estimate.device)
    if bool((weights < 0).any()) or abs(float(weights.sum()) - 1) > 1e-6:
        raise ValueError(f"mode_weight_error: expected non-negative weights summing to one, got {weights.tolist()}")
    if weights.shape != estimate.shape:
        raise ValueError(f"mode_weight_error: expected weights of shape {tuple(estimate.shape)}, got {weights.shape}")
    return float((estimate - weights).abs().max())


def _quantiles(sorted_values: Tensor, levels: Tensor) -> Tensor:
    """Linear-interpolation quantiles of sorted columns ``(n, P)`` at ``levels`` in (0, 1): ``(L, P)``."""
    n = sorted_values.shape[0]
    position = (levels * n - 0.5).clamp(0, n - 1)
    low = position.floor().long()
    high = (low + 1).clamp(max=n - 1)
    frac = (position - low)[:, None].to(sorted_values.dtype)
    return sorted_values[low] * (1 - frac) + sorted_values[high] * frac


def sliced_wasserstein(
    x: Tensor,
    y: Tensor,
    *,
    projections: int = 256,
    p: float = 2.0,
    generator: torch.Generator | None = None,
) -> float:
    r"""Sliced :math:`p`-Wasserstein distance between two samples.

    .. math:: \mathrm{SW}_p(\mu, \nu) = \Bigl(\mathbb E_{\theta \sim \mathcal U(S^{D-1})}
              W_p^p(\theta_\#\mu, \theta_\#\nu)\Bigr)^{1/p},

    estimated with ``projections`` random directions; each 1-D distance compares the sorted
    projections (or, for samples of different sizes, their quantiles on a common grid). For
    :math:`y = x + c`, :math:`\mathrm{SW}_2 \to \|c\| / \sqrt D`.

    References:
        Bonneel, Rabin, Peyré, Pfister (2015), "Sliced and Radon Wasserstein Barycenters of
        Measures", J. Math. Imaging Vis. 51.

    Args:
        x: samples ``(n, *event_shape)``.
        y: reference samples ``(m, *event_shape)``.
        projections: number of random directions (at most ``MAX_PROJECTIONS``).
        p: a finite order :math:`p \ge 1`.
        generator: random generator for the directions (reproducible values).

    Returns:
        the distance; NaN when a sample holds NaN, ``inf`` when one holds an infinite value.

    Raises:
        TypeError: for non-tensor samples or a non-integer ``projections``.
        ValueError: for empty samples, different event shapes, ``p`` not a finite number
            :math:`\ge 1` or ``projections`` out of ``[1, MAX_PROJECTIONS]``.

    Example:
        >>> import torch
        >>> x = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0))
        >>> gen = torch.Generator().manual_seed(1)
        >>> round(sliced_wasserstein(x, x + 2.0, projections=1000, generator=gen), 1)  # ||c|| / sqrt(D) = 2
        2.0
    """
    x = check_samples(x, "sliced_wasserstein", "x", layout="(n, *event)", min_ndim=1)
    y = check_samples(y, "sliced_wasserstein", "y", layout="(m, *event)", min_ndim=1)
    if x.shape[1:] != y.shape[1:]:
        raise ValueError(
            f"sliced_wasserstein: expected samples with the same event shape, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    check_count("sliced_wasserstein", "projections", projections, maximum=MAX_PROJECTIONS)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 1:
        raise ValueError(f"sliced_wasserstein: expected a finite order p >= 1, got {p!r}")
    dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
    x, y = x.reshape(x.shape[0], -1).to(dtype), y.reshape(y.shape[0], -1).to(dtype)
    theta = torch.randn(x.shape[1], projections, generator=generator, dtype=dtype).to(x.device)
    theta = theta / theta.norm(dim=0, keepdim=True)
    size = max(x.shape[0], y.shape[0])
    chunk = max(1, (1 << 22) // size)  # directions per pass: memory stays bounded for many projections
    total = torch.zeros((), dtype=dtype, device=x.device)
    for start in range(0, projections, chunk):
        t = theta[:, start : start + chunk]
        px, py = (x @ t).sort(dim=0).values, (y @ t).sort(dim=0).values
        if px.shape[0] != py.shape[0]:
            levels = (torch.arange(size, dtype=dtype, device=x.device) + 0.5) / size
            px, py = _quantiles(px, levels), _quantiles(py, levels)
        total = total + (px - py).abs().pow(p).sum()
    return float((total / (size * projections)).pow(1.0 / p))
