r"""The Metropolis test and the leapfrog integrator, once, below the samplers and the stochastic layers.

:mod:`flows.mcmc` (the HMC, MALA, random-walk and independence kernels) and
:mod:`flows.bijections.stochastic` (the SNF blocks) make the same two moves: accept a proposal
with probability :math:`\min(1, e^{r})`, and integrate :math:`H(x, p) = -\log\pi(x) + \tfrac12\|p\|^2`
with leapfrog steps. The layers may not import the samplers (``docs/architecture.md``), so both
import them from here.

References:
    Metropolis, Rosenbluth, Rosenbluth, Teller, Teller (1953), "Equation of state calculations by
    fast computing machines", J. Chem. Phys. 21, 1087. Neal (2011), "MCMC using Hamiltonian
    dynamics", Handbook of MCMC, arXiv:1206.1901.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["hmc_proposal", "metropolis_accept"]

#: ``x -> (log π(x), ∇ log π(x))``, each of the batch shape and of ``x``'s shape.
LogProbAndGrad = Callable[[Tensor], tuple[Tensor, Tensor]]


def metropolis_accept(log_ratio: Tensor) -> tuple[Tensor, Tensor]:
    r"""Metropolis–Hastings decision from the log acceptance ratio, per chain.

    :math:`\alpha = \min(1, e^{r})`; a chain accepts when :math:`U < \alpha`, :math:`U \sim
    \mathcal U(0, 1)`. A NaN ratio (a proposal with an undefined energy) is rejected with
    :math:`\alpha = 0`.

    Args:
        log_ratio: :math:`r`, shape ``(chains,)`` (any batch shape).

    Returns:
        ``(accept_prob, accepted)``, both the shape of ``log_ratio``.

    Example:
        >>> import torch
        >>> prob, accepted = metropolis_accept(torch.tensor([0.0, float("-inf"), float("nan")]))
        >>> prob.tolist(), accepted.tolist()
        ([1.0, 0.0, 0.0], [True, False, False])
    """
    accept_prob = torch.exp(log_ratio.clamp(max=0.0))
    accepted = torch.rand_like(accept_prob) < accept_prob  # False for NaN
    return accept_prob.nan_to_num_(0.0), accepted


def _event_sum(t: Tensor, event_ndim: int) -> Tensor:
    """Sum over the last ``event_ndim`` dimensions (the event), keeping the batch shape."""
    return t.sum(dim=tuple(range(-event_ndim, 0))) if event_ndim else t


def hmc_proposal(
    x: Tensor,
    log_prob: Tensor,
    grad: Tensor,
    log_prob_and_grad: LogProbAndGrad,
    *,
    step_size: float,
    steps: int,
    event_ndim: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""One HMC proposal with unit mass: fresh momenta, ``steps`` leapfrog steps, the log acceptance ratio.

    Draws :math:`p_0 \sim \mathcal N(0, I)` (one ``randn_like(x)``), integrates Hamilton's equations
    for :math:`H = -\log\pi(x) + \tfrac12\|p\|^2` with the leapfrog scheme (half kick, ``steps``
    drifts with full kicks between them, half kick), and returns

    .. math:: r = \log\pi(y) - \log\pi(x) - \tfrac12\bigl(\|p\|^2 - \|p_0\|^2\bigr).

    Costs ``steps`` calls of ``log_prob_and_grad`` (the gradient at ``x`` is the caller's). The
    operations are differentiable, so a caller that builds a graph through ``x`` (an SNF block)
    gets one through the proposal.

    Args:
        x: current positions, ``(*batch, *event)``.
        log_prob: :math:`\log\pi(x)`, ``batch``.
        grad: :math:`\nabla\log\pi(x)`, the shape of ``x``.
        log_prob_and_grad: ``y -> (log π(y), ∇ log π(y))``.
        step_size: the leapfrog step :math:`\varepsilon`.
        steps: leapfrog steps (at least 1).
        event_ndim: the number of trailing event dimensions of ``x``.

    Returns:
        ``(y, log_prob_y, grad_y, log_ratio)``: the proposal, its log density and gradient, and
        :math:`r` (NaN where an energy is undefined: :func:`metropolis_accept` rejects it).

    Example:
        >>> import torch
        >>> gauss = lambda y: (-0.5 * y.square().sum(-1), -y)
        >>> x = torch.randn(4, 2)
        >>> y, log_p, g, r = hmc_proposal(x, *gauss(x), gauss, step_size=0.1, steps=5, event_ndim=1)
        >>> y.shape, r.shape, bool((r.abs() < 0.1).all())  # leapfrog nearly conserves H
        (torch.Size([4, 2]), torch.Size([4]), True)
    """
    momentum0 = torch.randn_like(x)
    p = torch.add(momentum0, grad, alpha=0.5 * step_size)
    y = x
    for i in range(steps):
        y = torch.add(y, p, alpha=step_size)
        log_prob_y, grad_y = log_prob_and_grad(y)
        kick = step_size if i < steps - 1 else 0.5 * step_size
        p = p.add(grad_y, alpha=kick) if p.requires_grad else p.add_(grad_y, alpha=kick)  # in place off the graph
    kinetic = _event_sum(p * p, event_ndim) - _event_sum(momentum0 * momentum0, event_ndim)
    return y, log_prob_y, grad_y, (log_prob_y - log_prob) - 0.5 * kinetic
