r"""Step-size adaptation by dual averaging (Nesterov 2009, as adapted to HMC by Hoffman and Gelman 2014)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["DualAveraging"]


class DualAveraging(nn.Module):
    r"""Tune a step size so that the mean acceptance probability approaches ``target_accept``.

    After the :math:`t`-th warm-up step with mean acceptance statistic :math:`\alpha_t`,

    .. math::
        \bar H_t = \Bigl(1 - \frac{1}{t + t_0}\Bigr)\bar H_{t-1} + \frac{\delta - \alpha_t}{t + t_0},\quad
        \log\varepsilon_t = \mu - \frac{\sqrt t}{\gamma}\bar H_t,\quad
        \log\bar\varepsilon_t = t^{-\kappa}\log\varepsilon_t + (1 - t^{-\kappa})\log\bar\varepsilon_{t-1},

    with :math:`\mu = \log(10\,\varepsilon_0)`. The iterate :math:`\varepsilon_t` is used during
    warm-up and the average :math:`\bar\varepsilon` afterwards. The statistics are buffers, so an
    adapting kernel can be saved and restored mid-warm-up.

    References:
        Hoffman, Gelman (2014), "The No-U-Turn Sampler: Adaptively Setting Path Lengths in
        Hamiltonian Monte Carlo", JMLR 15, arXiv:1111.4246 (Algorithm 5).

    Args:
        target_accept: the acceptance probability :math:`\delta` to aim for, in ``(0, 1)``.
        gamma: shrinkage :math:`\gamma` towards :math:`\mu`.
        t0: iteration offset :math:`t_0` that damps the first steps.
        kappa: averaging exponent :math:`\kappa \in (0.5, 1]`.

    Example:
        >>> adapt = DualAveraging(0.6)
        >>> step = 1.0
        >>> for _ in range(200):  # a toy acceptance curve: alpha = exp(-step)
        ...     step = adapt.update(step, math.exp(-step))
        >>> abs(adapt.final() - math.log(1 / 0.6)) < 0.05
        True
    """

    def __init__(self, target_accept: float, *, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75) -> None:
        super().__init__()
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"DualAveraging: expected target_accept in (0, 1), got {target_accept}")
        if not 0.5 < kappa <= 1.0:
            raise ValueError(f"DualAveraging: expected kappa in (0.5, 1], got {kappa}")
        if gamma <= 0 or t0 < 0:
            raise ValueError(f"DualAveraging: expected gamma > 0 and t0 >= 0, got gamma={gamma}, t0={t0}")
        self.target_accept, self.gamma, self.t0, self.kappa = target_accept, gamma, t0, kappa
        for name in ("count", "h_bar", "mu", "log_step_bar"):
            self.register_buffer(name, torch.zeros((), dtype=torch.float64))

    def update(self, step_size: float, accept_prob: float) -> float:
        """Record one warm-up step's mean acceptance probability; return the next step size."""
        if self.count == 0:
            self.mu.fill_(math.log(10.0 * step_size))
        accept_prob = 0.0 if math.isnan(accept_prob) else min(accept_prob, 1.0)
        t = float(self.count) + 1.0
        self.count.fill_(t)
        w = 1.0 / (t + self.t0)
        h_bar = (1.0 - w) * float(self.h_bar) + w * (self.target_accept - accept_prob)
        self.h_bar.fill_(h_bar)
        log_step = float(self.mu) - math.sqrt(t) / self.gamma * h_bar
        eta = t ** (-self.kappa)
        self.log_step_bar.fill_(eta * log_step + (1.0 - eta) * float(self.log_step_bar))
        return math.exp(log_step)

    def final(self) -> float:
        r"""The averaged step size :math:`\bar\varepsilon` to use after warm-up."""
        if self.count == 0:
            raise RuntimeError("DualAveraging: final() called before any update")
        return math.exp(float(self.log_step_bar))

    def reset(self) -> None:
        """Forget the statistics (start a new adaptation window)."""
        for buffer in (self.count, self.h_bar, self.mu, self.log_step_bar):
            buffer.zero_()

    def extra_repr(self) -> str:
        return f"target_accept={self.target_accept}, gamma={self.gamma}, t0={self.t0}, kappa={self.kappa}"
