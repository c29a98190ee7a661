r"""Stochastic blocks of Stochastic Normalizing Flows: Langevin, Metropolis and HMC steps inside a flow.

A stochastic block moves a batch of configurations with a Markov kernel :math:`K` that leaves
:math:`e^{-u}` invariant (or nearly so), for an energy :math:`u` such as
:math:`u_\lambda = (1-\lambda)u_0 + \lambda u_1` (:class:`~flows.targets.InterpolatedEnergy`).
It fits the transform contract with the second output carrying the **path term** of
Wu, Köhler, Noé (2020) instead of a log-determinant. Both directions run the same kernel and
return, for the realised move ``in → out``,

.. math:: \Delta S = \log K(\text{out} \to \text{in}) - \log K(\text{in} \to \text{out}),

summed over the block's steps. In the sampling direction (``inverse_and_log_det``, latent → data)
this is the paper's :math:`\Delta S_t`; in the density direction (``forward_and_log_det``,
data → latent) it is :math:`-\Delta S_t` of the path run backwards, exactly as a deterministic
layer's inverse log-determinant is minus its forward one. Consequently, for a
:class:`~flows.flow.Flow` whose transform mixes deterministic layers and stochastic blocks:

* ``x, log_q = flow.sample_and_log_prob(n)`` gives **exact** importance weights
  :math:`\log w = -u_1(x) - \log q = -u_1(x) + u_0(z) + \sum_t \Delta S_t + \log Z_0`: no
  marginalisation over the noise is needed, :math:`\mathbb E[w] = Z_1/Z_0`;
* ``flow.log_prob(x)`` is a stochastic lower bound on :math:`\log p(x)` (the ML loss of SNF),
  exact when every block is in detailed balance with the density at its position.

For kernels in detailed balance with :math:`e^{-u}` (Metropolis, MALA, HMC), the ratio is
:math:`e^{-u(\text{in})}/e^{-u(\text{out})}`, so :math:`\Delta S = u(\text{out}) - u(\text{in})`
(0 for a rejected move). For unadjusted overdamped Langevin it is
:math:`\tfrac12\|\eta\|^2 - \tfrac12\|\tilde\eta\|^2` with the forward and backward noises.

Gradients flow through accepted positions (reparameterised proposals) and, for Langevin and HMC
in training, through the forces (second order); accept/reject decisions are not differentiated.
These blocks are not bijections: they cannot pass :func:`~flows.testing.check_bijection` and are
tested against exact invariance and detailed-balance oracles instead (``tests/test_stochastic.py``;
Wu, Köhler, Noé 2020, *Stochastic Normalizing Flows*).

References:
    Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flows._energy import Energy
from flows._kernels import _event_sum, hmc_proposal, metropolis_accept
from flows._validation import check_count
from flows.bijections.base import Bijection

__all__ = ["HMCBlock", "LangevinBlock", "MetropolisBlock", "StochasticBlock"]


class StochasticBlock(Bijection):
    """Base class of stochastic blocks: an energy, a number of steps and a step size.

    Subclasses implement :meth:`_move` (``x -> (y, path_term)``). ``forward_and_log_det`` and
    ``inverse_and_log_det`` both run it (see the module docstring for why this is right). The
    acceptance rate of the last call (a float in ``[0, 1]``, ``nan`` before any call) is kept in
    :attr:`last_acceptance` for tuning; it plays no part in any computation.

    Args:
        energy: the energy :math:`u` the kernel targets (any :class:`~flows.targets.EnergyTarget`, or
            any object with the :class:`~flows.targets.Energy` members).
        steps: number of kernel applications per call.
        step_size: the kernel's step size (positive).
    """

    def __init__(self, energy: Energy, *, steps: int = 1, step_size: float = 0.1) -> None:
        name = type(self).__name__
        if not isinstance(energy, Energy):
            raise TypeError(
                f"{name}: expected an energy (an EnergyTarget, or any object with event_shape, energy and "
                f"energy_and_grad), got {type(energy).__name__}"
            )
        check_count(name, "steps", steps)
        if not step_size > 0 or not math.isfinite(step_size):
            raise ValueError(f"{name}: expected a positive finite step_size, got {step_size!r}")
        super().__init__(tuple(energy.event_shape))
        self.energy = energy
        self.steps, self.step_size = steps, float(step_size)
        self.last_acceptance = float("nan")

    def _energy_has_trainable_parameters(self) -> bool:
        """Whether the energy is a module with a parameter that requires a gradient (a plain object has none)."""
        parameters = getattr(self.energy, "parameters", None)
        return callable(parameters) and any(p.requires_grad for p in parameters())

    @property
    def _event_ndim(self) -> int:
        return len(self.event_shape)

    def _energy_and_grad(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Energy and force, differentiable when the caller is building a graph through ``x``."""
        create_graph = torch.is_grad_enabled() and x.requires_grad
        return self.energy.energy_and_grad(x, create_graph=create_graph)

    def _log_prob_and_grad(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(-u, -∇u)``: the log density of :math:`e^{-u}` up to a constant, and its gradient."""
        u, g = self._energy_and_grad(x)
        return -u, -g

    def _accept(self, log_ratio: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Metropolis test per sample: returns the new states and the boolean acceptance mask."""
        _, accept = metropolis_accept(log_ratio.detach())
        mask = accept.reshape(*accept.shape, *([1] * self._event_ndim))
        return torch.where(mask, y, x), accept

    def _move(self, x: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._move(x)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._move(z)

    def extra_repr(self) -> str:
        return f"steps={self.steps}, step_size={self.step_size}"


class MetropolisBlock(StochasticBlock):
    r"""Random-walk Metropolis steps on :math:`e^{-u}`.

    Each step proposes :math:`y = x + \sigma\xi`, :math:`\xi \sim \mathcal N(0, I)`, and accepts it with
    probability :math:`\min(1, e^{u(x) - u(y)})`.

    Path term (exact, detailed balance): :math:`\Delta S = u(\text{out}) - u(\text{in})`, which is 0
    for a sample whose every proposal was rejected. The SNF double-well experiments use 20 steps
    of size 0.25 per block.

    References:
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707
        (``MetropolisMCFlow``). Metropolis, Rosenbluth, Rosenbluth, Teller, Teller (1953),
        "Equation of state calculations by fast computing machines", J. Chem. Phys. 21, 1087.

    Args:
        energy: the energy :math:`u` (e.g. an :class:`~flows.targets.InterpolatedEnergy`).
        steps: Metropolis steps per call.
        step_size: standard deviation :math:`\sigma` of the Gaussian proposal.

    Example:
        >>> import torch
        >>> from flows.targets import DoubleWell
        >>> block = MetropolisBlock(DoubleWell(), steps=10, step_size=0.25)
        >>> x = torch.randn(5, 2)
        >>> y, delta_s = block.inverse_and_log_det(x)
        >>> torch.allclose(delta_s, DoubleWell().energy(y) - DoubleWell().energy(x), atol=1e-5)
        True
    """

    def _move(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # The output is x plus the sum of the accepted proposal noises, so ∂out/∂in = I whatever
        # was accepted: the chain runs without a graph and the output is reattached as
        # x + (out − x).detach(), which gives the same gradients as differentiating every step.
        with torch.no_grad():
            y = x.detach()
            u_y = self.energy.energy(y)
            accepted = torch.zeros((), dtype=x.dtype, device=x.device)
            for _ in range(self.steps):
                proposal = y + self.step_size * torch.randn_like(y)
                u_proposal = self.energy.energy(proposal)
                y, accept = self._accept(u_y - u_proposal, y, proposal)
                u_y = torch.where(accept, u_proposal, u_y)
                accepted = accepted + accept.to(x.dtype).mean()
            shift = y - x.detach()
        self.last_acceptance = float(accepted / self.steps)
        if not (torch.is_grad_enabled() and (x.requires_grad or self._energy_has_trainable_parameters())):
            return y, u_y - self.energy.energy(x)
        out = x + shift
        return out, self.energy.energy(out) - self.energy.energy(x)


class LangevinBlock(StochasticBlock):
    r"""Overdamped Langevin steps, optionally Metropolis-adjusted (MALA).

    Each step moves :math:`y = x - \varepsilon\nabla u(x) + \sqrt{2\varepsilon}\,\eta` with
    :math:`\eta \sim \mathcal N(0, I)`.

    Unadjusted (the default, SNF's ``BrownianFlow``): per step, with the backward noise
    :math:`\tilde\eta = (x - y + \varepsilon\nabla u(y))/\sqrt{2\varepsilon}`,

    .. math:: \Delta S = \tfrac12\|\eta\|^2 - \tfrac12\|\tilde\eta\|^2 .

    With ``metropolize=True`` each step is a MALA step (accepted with probability
    :math:`\min(1, e^{u(x) - u(y) + \Delta S_{\text{step}}})`), in detailed balance with
    :math:`e^{-u}`, so :math:`\Delta S = u(\text{out}) - u(\text{in})`.

    References:
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707.
        Roberts, Tweedie (1996), "Exponential convergence of Langevin distributions and their
        discrete approximations", Bernoulli 2(4), 341–363.

    Args:
        energy: the energy :math:`u`.
        steps: Langevin steps per call.
        step_size: the time step :math:`\varepsilon`.
        metropolize: add the Metropolis test (MALA).

    Example:
        >>> import torch
        >>> from flows.targets import Gaussian
        >>> block = LangevinBlock(Gaussian(3), steps=5, step_size=0.01)
        >>> y, delta_s = block.inverse_and_log_det(torch.randn(4, 3))
        >>> y.shape, delta_s.shape
        (torch.Size([4, 3]), torch.Size([4]))
    """

    def __init__(self, energy: Energy, *, steps: int = 1, step_size: float = 0.01, metropolize: bool = False) -> None:
        super().__init__(energy, steps=steps, step_size=step_size)
        self.metropolize = bool(metropolize)

    def _move(self, x: Tensor) -> tuple[Tensor, Tensor]:
        eps = self.step_size
        scale = math.sqrt(2 * eps)
        u_x, g_x = self._energy_and_grad(x)
        u_start = u_x
        path = None
        accepted = torch.zeros((), dtype=x.dtype, device=x.device)
        for _ in range(self.steps):
            noise = torch.randn_like(x)
            y = x - eps * g_x + scale * noise
            u_y, g_y = self._energy_and_grad(y)
            back = (x - y + eps * g_y) / scale
            step = 0.5 * _event_sum(noise.square() - back.square(), self._event_ndim)
            if self.metropolize:
                x_new, accept = self._accept(u_x - u_y + step, x, y)
                mask = accept.reshape(*accept.shape, *([1] * self._event_ndim))
                u_x, g_x, x = torch.where(accept, u_y, u_x), torch.where(mask, g_y, g_x), x_new
                accepted = accepted + accept.to(x.dtype).mean()
            else:
                x, u_x, g_x = y, u_y, g_y
                path = step if path is None else path + step
        if self.metropolize:
            self.last_acceptance = float(accepted / self.steps)
            return x, u_x - u_start
        self.last_acceptance = 1.0
        return x, path

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, metropolize={self.metropolize}"


class HMCBlock(StochasticBlock):
    r"""Hamiltonian Monte Carlo steps: fresh momenta, ``leapfrog_steps`` leapfrog steps, a Metropolis test.

    Each step draws :math:`v \sim \mathcal N(0, I)`, integrates :math:`H(x, v) = u(x) + \tfrac12\|v\|^2`
    with ``leapfrog_steps`` leapfrog steps of size :math:`\varepsilon` and accepts with probability
    :math:`\min(1, e^{H(x, v) - H(x', v')})`. The kernel on :math:`x` is in detailed balance with
    :math:`e^{-u}`, so the path term is exact: :math:`\Delta S = u(\text{out}) - u(\text{in})`.

    (The unadjusted underdamped Langevin block of the SNF code carries the velocities as extra
    state between blocks; that does not fit a transform on :math:`x` alone, so the adjusted
    HMC kernel stands in for it here.)

    References:
        Duane, Kennedy, Pendleton, Roweth (1987), "Hybrid Monte Carlo", Physics Letters B 195, 216.
        Neal (2011), "MCMC using Hamiltonian dynamics", Handbook of MCMC, arXiv:1206.1901.
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707.

    Args:
        energy: the energy :math:`u`.
        steps: HMC steps (momentum refreshments) per call.
        step_size: leapfrog step size :math:`\varepsilon`.
        leapfrog_steps: leapfrog steps per HMC step.

    Example:
        >>> import torch
        >>> from flows.targets import Gaussian
        >>> block = HMCBlock(Gaussian(2), steps=2, step_size=0.2, leapfrog_steps=5)
        >>> x = torch.randn(6, 2)
        >>> y, delta_s = block.inverse_and_log_det(x)
        >>> torch.allclose(delta_s, Gaussian(2).energy(y) - Gaussian(2).energy(x), atol=1e-5)
        True
    """

    def __init__(self, energy: Energy, *, steps: int = 1, step_size: float = 0.1, leapfrog_steps: int = 10) -> None:
        super().__init__(energy, steps=steps, step_size=step_size)
        check_count("HMCBlock", "leapfrog_steps", leapfrog_steps)
        self.leapfrog_steps = leapfrog_steps

    def _move(self, x: Tensor) -> tuple[Tensor, Tensor]:
        nd = self._event_ndim
        log_p, grad = self._log_prob_and_grad(x)
        log_p_start = log_p
        accepted = torch.zeros((), dtype=x.dtype, device=x.device)
        for _ in range(self.steps):
            y, log_p_y, grad_y, log_ratio = hmc_proposal(
                x,
                log_p,
                grad,
                self._log_prob_and_grad,
                step_size=self.step_size,
                steps=self.leapfrog_steps,
                event_ndim=nd,
            )
            x_new, accept = self._accept(log_ratio, x, y)
            mask = accept.reshape(*accept.shape, *([1] * nd))
            log_p, grad, x = torch.where(accept, log_p_y, log_p), torch.where(mask, grad_y, grad), x_new
            accepted = accepted + accept.to(x.dtype).mean()
        self.last_acceptance = float(accepted / self.steps)
        return x, log_p_start - log_p  # u(out) - u(in)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, leapfrog_steps={self.leapfrog_steps}"
