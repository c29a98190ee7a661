r"""MCMC diagnostics: acceptance, effective sample size, split-R̂, mode weights, sliced Wasserstein.

Chain samples are laid out ``(draws, chains, *event_shape)`` (as in :attr:`flows.mcmc.Trace.samples`);
per-coordinate diagnostics return a tensor of shape ``event_shape``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "acceptance_rate",
    "effective_sample_size",
    "integrated_autocorr_time",
    "mode_weight_error",
    "mode_weights",
    "sliced_wasserstein",
    "split_rhat",
]


def _draws_chains(samples: Tensor, who: str, min_draws: int = 4) -> Tensor:
    """Check the ``(draws, chains, *event)`` layout and flatten the event: ``(draws, chains, p)``."""
    if not isinstance(samples, Tensor):
        raise TypeError(f"{who}: expected a torch.Tensor, got {type(samples).__name__}")
    if samples.dim() < 2:
        raise ValueError(f"{who}: expected samples of shape (draws, chains, *event), got {tuple(samples.shape)}")
    if samples.shape[0] < min_draws:
        raise ValueError(f"{who}: expected at least {min_draws} draws, got {samples.shape[0]}")
    if not samples.is_floating_point():
        samples = samples.double()
    return samples.reshape(samples.shape[0], samples.shape[1], -1)


def acceptance_rate(accepted: Tensor) -> Tensor:
    """Per-chain fraction of accepted moves from a ``(steps, chains)`` record (bool or probabilities).

    Example:
        >>> import torch
        >>> acceptance_rate(torch.tensor([[True, False], [True, True]])).tolist()
        [1.0, 0.5]
    """
    if not isinstance(accepted, Tensor) or accepted.dim() != 2:
        shape = tuple(accepted.shape) if isinstance(accepted, Tensor) else type(accepted).__name__
        raise ValueError(f"acceptance_rate: expected a (steps, chains) tensor, got {shape}")
    return accepted.to(torch.float64).mean(0)


def _autocovariance(x: Tensor) -> Tensor:
    """Biased (``1/n``) autocovariance of each chain and coordinate at every lag, by FFT: ``(n, m, p)``."""
    n = x.shape[0]
    centred = x - x.mean(0)
    size = 1 << (2 * n - 1).bit_length()
    spectrum = torch.fft.rfft(centred, n=size, dim=0)
    return torch.fft.irfft(spectrum * spectrum.conj(), n=size, dim=0)[:n] / n


def integrated_autocorr_time(samples: Tensor, *, split: bool = False) -> Tensor:
    r"""Integrated autocorrelation time :math:`\tau` per coordinate, pooled over chains.

    With the multi-chain autocorrelation estimate of Stan (Vehtari et al. 2021, eqs. 10–11),

    .. math::
        \hat\rho_t = 1 - \frac{W - \frac1m\sum_j \hat\gamma_{j,t}}{\widehat{\operatorname{var}}^+},
        \qquad \widehat{\operatorname{var}}^+ = \frac{n-1}{n}W + \frac{B}{n},

    (:math:`\hat\gamma_{j,t}` the lag-:math:`t` autocovariance of chain :math:`j`, :math:`W` the
    mean within-chain variance, :math:`B/n` the variance of the chain means) and Geyer's initial
    monotone sequence: the pair sums :math:`\Gamma_k = \hat\rho_{2k} + \hat\rho_{2k+1}` are kept
    while positive and made non-increasing, :math:`\tau = -1 + 2\sum_k \Gamma_k`, floored at
    :math:`1/\log_{10}(nm)`. Chains that sit in different modes inflate :math:`B` and hence
    :math:`\tau`.

    References:
        Geyer (1992), "Practical Markov Chain Monte Carlo", Statist. Sci. 7. Vehtari, Gelman,
        Simpson, Carpenter, Bürkner (2021), "Rank-normalization, folding, and localization: An
        improved R̂ for assessing convergence of MCMC", Bayesian Analysis 16, arXiv:1903.08008.

    Args:
        samples: ``(draws, chains, *event_shape)``.
        split: split each chain in two halves first (detects drifting chains, as Stan does).

    Returns:
        :math:`\tau` of shape ``event_shape``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> tau = integrated_autocorr_time(torch.randn(1000, 4, 2))  # independent draws: tau ~ 1
        >>> bool(((tau > 0.8) & (tau < 1.2)).all())
        True
    """
    x = _draws_chains(samples, "integrated_autocorr_time")
    event = samples.shape[2:]
    if split:
        half = x.shape[0] // 2
        x = torch.cat([x[:half], x[x.shape[0] - half :]], dim=1)
    n, m = x.shape[0], x.shape[1]
    acov = _autocovariance(x)
    within = acov[0].mean(0) * n / (n - 1)
    var_plus = within * (n - 1) / n
    if m > 1:
        var_plus = var_plus + x.mean(0).var(0)
    rho = 1.0 - (within - acov.mean(1)) / var_plus
    rho[0] = 1.0
    pairs = rho[: 2 * (n // 2)].reshape(n // 2, 2, -1).sum(1)
    positive = torch.cumprod((pairs > 0).to(pairs.dtype), dim=0).bool()
    monotone = torch.cummin(torch.where(positive, pairs, torch.inf), dim=0).values
    tau = -1.0 + 2.0 * torch.where(positive, monotone, 0.0).sum(0)
    tau = tau.clamp(min=1.0 / math.log10(n * m))
    return tau.reshape(event)


def effective_sample_size(samples: Tensor, *, split: bool = False) -> Tensor:
    r"""Effective sample size :math:`\mathrm{ESS} = nm / \tau` per coordinate (see :func:`integrated_autocorr_time`).

    Args:
        samples: ``(draws, chains, *event_shape)``.
        split: split each chain in two halves first.

    Returns:
        ESS of shape ``event_shape`` (out of ``draws · chains``).

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
    tau = integrated_autocorr_time(samples, split=split)
    return samples.shape[0] * samples.shape[1] / tau


def split_rhat(samples: Tensor) -> Tensor:
    r"""Split potential scale reduction factor :math:`\hat R` per coordinate.

    Each chain is cut into two halves of :math:`n` draws (a middle draw is dropped for odd
    lengths); with :math:`W` the mean within-half variance and :math:`B/n` the variance of the
    half means,

    .. math:: \hat R = \sqrt{\frac{\frac{n-1}{n}W + \frac{B}{n}}{W}}.

    Values near 1 (below about 1.01–1.05) are necessary, not sufficient, for convergence.

    References:
        Gelman, Rubin (1992), "Inference from Iterative Simulation Using Multiple Sequences",
        Statist. Sci. 7. Vehtari et al. (2021), arXiv:1903.08008.

    Args:
        samples: ``(draws, chains, *event_shape)`` with at least 4 draws.

    Returns:
        :math:`\hat R` of shape ``event_shape``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> mixed = torch.randn(500, 4)
        >>> stuck = mixed + torch.tensor([0.0, 0.0, 3.0, 3.0])  # two chains in another mode
        >>> round(split_rhat(mixed).item(), 2), split_rhat(stuck).item() > 1.5
        (1.0, True)
    """
    x = _draws_chains(samples, "split_rhat")
    event = samples.shape[2:]
    n = x.shape[0] // 2
    halves = torch.cat([x[:n], x[x.shape[0] - n :]], dim=1)
    within = halves.var(0).mean(0)
    var_plus = within * (n - 1) / n + halves.mean(0).var(0)
    return torch.sqrt(var_plus / within).reshape(event)


def mode_weights(samples: Tensor, means: Tensor) -> Tensor:
    """Fraction of samples nearest (Euclidean) to each mode centre.

    Args:
        samples: ``(*batch, *event_shape)``, all batch dimensions pooled (e.g. ``(draws, chains, d)``).
        means: mode centres ``(K, *event_shape)``.

    Returns:
        Weights ``(K,)`` summing to one.

    Example:
        >>> import torch
        >>> means = torch.tensor([[-5.0], [5.0]])
        >>> mode_weights(torch.tensor([[-4.0], [-6.0], [4.5], [-5.5]]), means).tolist()
        [0.75, 0.25]
    """
    if not isinstance(means, Tensor) or means.dim() < 2:
        raise ValueError(f"mode_weights: expected means of shape (K, *event), got {getattr(means, 'shape', means)}")
    event_ndim = means.dim() - 1
    if samples.dim() < event_ndim or samples.shape[samples.dim() - event_ndim :] != means.shape[1:]:
        raise ValueError(
            f"mode_weights: expected samples of shape (*batch, {', '.join(map(str, means.shape[1:]))}), "
            f"got {tuple(samples.shape)}"
        )
    flat = samples.reshape(-1, math.prod(means.shape[1:])).to(means.dtype)
    centres = means.reshape(means.shape[0], -1)
    nearest = torch.cdist(flat, centres).argmin(dim=1)
    return torch.bincount(nearest, minlength=means.shape[0]).to(means.dtype) / flat.shape[0]


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

    Example:
        >>> import torch
        >>> means = torch.tensor([[-5.0], [5.0]])
        >>> mode_weight_error(torch.full((10, 1), -5.0), means)
        0.5
    """
    estimate = mode_weights(samples, means)
    if weights is None:
        weights = torch.full_like(estimate, 1.0 / estimate.numel())
    weights = torch.as_tensor(weights, dtype=estimate.dtype, device=estimate.device)
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
        projections: number of random directions.
        p: order :math:`p \ge 1`.
        generator: random generator for the directions (reproducible values).

    Example:
        >>> import torch
        >>> x = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0))
        >>> gen = torch.Generator().manual_seed(1)
        >>> round(sliced_wasserstein(x, x + 2.0, projections=1000, generator=gen), 1)  # ||c|| / sqrt(D) = 2
        2.0
    """
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise TypeError("sliced_wasserstein: expected torch.Tensor samples")
    if x.dim() < 1 or y.dim() < 1 or x.shape[1:] != y.shape[1:]:
        raise ValueError(
            f"sliced_wasserstein: expected samples with the same event shape, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if not isinstance(projections, int) or projections < 1 or p < 1:
        raise ValueError(f"sliced_wasserstein: expected projections >= 1 and p >= 1, got {projections} and {p}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, y = x.reshape(x.shape[0], -1).to(dtype), y.reshape(y.shape[0], -1).to(dtype)
    theta = torch.randn(x.shape[1], projections, generator=generator, dtype=dtype).to(x.device)
    theta = theta / theta.norm(dim=0, keepdim=True)
    px, py = (x @ theta).sort(dim=0).values, (y @ theta).sort(dim=0).values
    if px.shape[0] != py.shape[0]:
        size = max(px.shape[0], py.shape[0])
        levels = (torch.arange(size, dtype=dtype, device=x.device) + 0.5) / size
        px, py = _quantiles(px, levels), _quantiles(py, levels)
    return float((px - py).abs().pow(p).mean().pow(1.0 / p))
