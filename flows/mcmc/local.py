r"""Local kernels: random-walk Metropolis, MALA and HMC, with step sizes tuned by dual averaging."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flows._kernels import hmc_proposal, metropolis_accept
from flows._validation import check_count
from flows.mcmc.adaptation import DualAveraging
from flows.mcmc.base import Kernel, State, StepInfo, _keep_rejected
from flows.targets.base import EnergyTarget

__all__ = ["HMC", "MALA", "RandomWalk"]


def _row_sum(t: Tensor) -> Tensor:
    """Sum over each chain's event, ``(chains,)``."""
    return t.reshape(t.shape[0], -1).sum(-1)


class _StepSizeKernel(Kernel):
    """A kernel with a positive step size, optionally tuned by dual averaging during warm-up.

    One constructor for the three kernels: they differ in their defaults (class attributes), not
    in their arguments. ``step_size=None`` takes the kernel's :attr:`default_step_size`.
    """

    default_step_size = 0.1
    default_target_accept = 0.5

    def __init__(
        self,
        target: EnergyTarget,
        step_size: float | None = None,
        *,
        adapt_step_size: bool = True,
        target_accept: float | None = None,
    ) -> None:
        super().__init__(target)
        step_size = self.default_step_size if step_size is None else step_size
        if not (isinstance(step_size, (int, float)) and step_size > 0 and math.isfinite(step_size)):
            raise ValueError(f"{type(self).__name__}: expected a positive finite step_size, got {step_size!r}")
        self.register_buffer("step_size", torch.tensor(float(step_size), dtype=torch.float64))
        self.adapt_step_size = adapt_step_size
        self.adaptation = DualAveraging(self.default_target_accept if target_accept is None else target_accept)

    def _finish(self, new: State, accept_prob: Tensor, accepted: Tensor, adapt: bool) -> tuple[State, StepInfo]:
        """The step's result; during warm-up (``adapt``) the step size moves towards the target acceptance."""
        info = StepInfo(accept_prob, accepted)
        if adapt and self.adapt_step_size:
            self.step_size.fill_(self.adaptation.update(float(self.step_size), float(info.accept_prob.mean())))
        return new, info

    def end_adaptation(self) -> None:
        if self.adapt_step_size and self.adaptation.count > 0:
            self.step_size.fill_(self.adaptation.final())
            self.adaptation.reset()

    def extra_repr(self) -> str:
        return f"step_size={float(self.step_size):.4g}, adapt_step_size={self.adapt_step_size}"


class RandomWalk(_StepSizeKernel):
    r"""Random-walk Metropolis: an isotropic Gaussian proposal, accepted by the Metropolis rule.

    .. math:: y = x + \sigma\xi,\ \xi \sim \mathcal N(0, I),\qquad \alpha = \min\bigl(1, \pi(y)/\pi(x)\bigr).

    One target evaluation (no gradient) per step. The scale :math:`\sigma` is tuned towards an
    acceptance of 0.234 (optimal for product targets in high dimension) when ``adapt_step_size``.

    References:
        Metropolis, Rosenbluth, Rosenbluth, Teller, Teller (1953), "Equation of State
        Calculations by Fast Computing Machines", J. Chem. Phys. 21. Roberts, Gelman, Gilks
        (1997), "Weak convergence and optimal scaling of random walk Metropolis algorithms",
        Ann. Appl. Probab. 7.

    Args:
        target: the energy target.
        step_size: proposal scale :math:`\sigma` (default 0.5).
        adapt_step_size, target_accept: tune :math:`\sigma` by dual averaging during warm-up,
            towards this acceptance (default 0.234).

    Example:
        >>> import torch
        >>> from flows.mcmc import sample
        >>> from flows.targets import Gaussian
        >>> kernel = RandomWalk(Gaussian(2), step_size=1.0)
        >>> trace = sample(kernel, torch.zeros(8, 2), 20, warmup=10)
        >>> trace.samples.shape
        torch.Size([20, 8, 2])
    """

    default_step_size = 0.5
    default_target_accept = 0.234

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        x = state.x
        y = torch.add(x, torch.randn_like(x), alpha=float(self.step_size))
        with torch.no_grad():
            log_prob_y = -self.target.energy(y)
        accept_prob, accepted = metropolis_accept(log_prob_y - state.log_prob)
        new = State(_keep_rejected(accepted, y, x), torch.where(accepted, log_prob_y, state.log_prob))
        return self._finish(new, accept_prob, accepted, adapt)


class _GradientKernel(_StepSizeKernel):
    r"""A step-size kernel whose state caches :math:`\nabla\log\pi` at the current positions (MALA, HMC)."""

    def _initial_state(self, x: Tensor) -> State:
        return self._with_grad(State(x, torch.empty(0)))


class MALA(_GradientKernel):
    r"""Metropolis-adjusted Langevin algorithm: a Langevin proposal with a Metropolis–Hastings test.

    With step size :math:`\varepsilon` and :math:`g = \nabla\log\pi`,

    .. math::
        y = x + \varepsilon g(x) + \sqrt{2\varepsilon}\,\xi,\qquad
        \log\alpha = \log\pi(y) - \log\pi(x)
        - \frac{\|x - y - \varepsilon g(y)\|^2}{4\varepsilon} + \frac{\|\xi\|^2}{2}.

    The state caches :math:`\log\pi` and :math:`g` at the current positions, so a step costs
    **one** gradient evaluation (at the proposal). The step size is tuned towards an acceptance
    of 0.574 when ``adapt_step_size``.

    References:
        Roberts, Tweedie (1996), "Exponential convergence of Langevin distributions and their
        discrete approximations", Bernoulli 2. Roberts, Rosenthal (1998), "Optimal scaling of
        discrete approximations to Langevin diffusions", JRSS B 60.

    Args:
        target: the energy target (differentiable).
        step_size: the Langevin time step :math:`\varepsilon` (default 0.1).
        adapt_step_size, target_accept: tune :math:`\varepsilon` by dual averaging during warm-up,
            towards this acceptance (default 0.574).

    Example:
        >>> import torch
        >>> from flows.mcmc import sample
        >>> from flows.targets import Gaussian
        >>> trace = sample(MALA(Gaussian(3)), torch.zeros(16, 3), 50, warmup=50)
        >>> 0.3 < trace.acceptance_rate() < 0.9
        True
    """

    default_step_size = 0.1
    default_target_accept = 0.574

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        state = self._with_grad(state)
        eps = float(self.step_size)
        x, grad = state.x, state.grad
        noise = torch.randn_like(x)
        y = torch.add(x, grad, alpha=eps).add_(noise, alpha=math.sqrt(2.0 * eps))
        log_prob_y, grad_y = self._log_prob_and_grad(y)
        # log q(x|y) - log q(y|x) with x - y - eps g(y) = -sqrt(2 eps) xi - eps s, s = g(x) + g(y):
        # = -sqrt(eps/2) xi.s - (eps/4)|s|^2 = -sqrt(eps/2) s.(xi + sqrt(eps/8) s)   (4 passes over x,
        # in place on the step's own temporaries)
        s = torch.add(grad, grad_y)
        c = math.sqrt(0.5 * eps)
        log_ratio = (log_prob_y - state.log_prob).sub_(_row_sum(s.mul_(noise.add_(s, alpha=0.5 * c))), alpha=c)
        accept_prob, accepted = metropolis_accept(log_ratio)
        # y and grad_y belong to this step: rejected chains' rows are copied back into them
        new = State(
            _keep_rejected(accepted, y, x),
            torch.where(accepted, log_prob_y, state.log_prob),
            _keep_rejected(accepted, grad_y, grad),
        )
        return self._finish(new, accept_prob, accepted, adapt)


class HMC(_GradientKernel):
    r"""Hamiltonian Monte Carlo with a leapfrog integrator and unit mass.

    With momentum :math:`p \sim \mathcal N(0, I)` and :math:`H(x, p) = u(x) + \tfrac12\|p\|^2`,
    ``leapfrog_steps`` leapfrog steps of size :math:`\varepsilon`

    .. math::
        p \leftarrow p + \tfrac{\varepsilon}{2}\nabla\log\pi(x),\quad
        x \leftarrow x + \varepsilon p,\quad
        p \leftarrow p + \tfrac{\varepsilon}{2}\nabla\log\pi(x)

    map :math:`(x, p)` to :math:`(y, p')`, accepted with :math:`\alpha = \min(1, e^{H(x,p) - H(y,p')})`.
    The gradient at the current positions is cached, so a step costs ``leapfrog_steps`` gradient
    evaluations. Divergent trajectories (non-finite energy) are rejected. The step size is tuned
    towards an acceptance of 0.65 by dual averaging during warm-up.

    References:
        Duane, Kennedy, Pendleton, Roweth (1987), "Hybrid Monte Carlo", Phys. Lett. B 195.
        Neal (2011), "MCMC using Hamiltonian dynamics", Handbook of MCMC, arXiv:1206.1901.
        Hoffman, Gelman (2014), arXiv:1111.4246 (dual averaging).

    Args:
        target: the energy target (differentiable).
        step_size: leapfrog step :math:`\varepsilon` (default 0.1).
        leapfrog_steps: leapfrog steps per move (the name of
            :class:`~flows.bijections.stochastic.HMCBlock`'s).
        adapt_step_size, target_accept: tune :math:`\varepsilon` by dual averaging during warm-up,
            towards this acceptance (default 0.65).

    Example:
        >>> import torch
        >>> from flows.mcmc import sample
        >>> from flows.targets import Gaussian
        >>> kernel = HMC(Gaussian(3), step_size=0.3, leapfrog_steps=5)
        >>> sample(kernel, torch.zeros(4, 3), 10).samples.shape
        torch.Size([10, 4, 3])
    """

    default_step_size = 0.1
    default_target_accept = 0.65

    def __init__(
        self,
        target: EnergyTarget,
        step_size: float | None = None,
        leapfrog_steps: int = 10,
        *,
        adapt_step_size: bool = True,
        target_accept: float | None = None,
    ) -> None:
        super().__init__(target, step_size, adapt_step_size=adapt_step_size, target_accept=target_accept)
        check_count("HMC", "leapfrog_steps", leapfrog_steps)
        self.leapfrog_steps = leapfrog_steps

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        state = self._with_grad(state)
        y, log_prob_y, grad_y, log_ratio = hmc_proposal(
            state.x,
            state.log_prob,
            state.grad,
            self._log_prob_and_grad,
            step_size=float(self.step_size),
            steps=self.leapfrog_steps,
            event_ndim=state.x.dim() - 1,
        )
        accept_prob, accepted = metropolis_accept(log_ratio)
        new = State(
            _keep_rejected(accepted, y, state.x),
            torch.where(accepted, log_prob_y, state.log_prob),
            _keep_rejected(accepted, grad_y, state.grad),
        )
        return self._finish(new, accept_prob, accepted, adapt)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, leapfrog_steps={self.leapfrog_steps}"
