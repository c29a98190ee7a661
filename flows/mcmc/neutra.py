r"""NeuTra: local MCMC on the flow's latent space, where the target is (nearly) a standard normal.

Our flows map data to latent (:math:`z = f(x)`), so the transport map of NeuTra is
:math:`T = f^{-1}` (``flow.transform.inverse``) and the pulled-back target is

.. math:: \log\tilde\pi(z) = \log\pi(T z) + \log|\det J_T(z)|.

Sampling :math:`\tilde\pi` and mapping through :math:`T` samples :math:`\pi` exactly, whatever
the flow (an exact change of variables); a good flow only makes the latent target easier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from flows._validation import check_like
from flows.flow import Flow
from flows.mcmc.base import FlowWatch, Kernel, State, StepInfo, check_flow_matches
from flows.mcmc.local import MALA
from flows.targets.base import EnergyTarget, as_target

__all__ = ["NeuTra", "PullbackTarget"]


class PullbackTarget(EnergyTarget):
    r"""The target pulled back to a flow's latent space: :math:`\tilde u(z) = u(T z) - \log|\det J_T(z)|`.

    :math:`T = f^{-1}` is the flow's inverse transform. The normalising constant is unchanged
    (:math:`\log\tilde Z = \log Z`); exact latent samples are :math:`f(x)` of exact target samples.
    :meth:`log_prob_and_grad` (and :meth:`energy_and_grad`, its negation) uses the target's own
    :meth:`~flows.targets.EnergyTarget.log_prob_and_grad` (analytic gradients are kept) and one
    vector-Jacobian product through :math:`T`:
    :math:`\nabla_z\tilde u = J_T^\top \nabla_x u - \nabla_z \log|\det J_T|`.
    The flow is evaluated in eval mode.

    References:
        Hoffman, Sountsov, Dillon, Langmore, Tran, Vasudevan (2019), "NeuTra-lizing Bad Geometry
        in Hamiltonian Monte Carlo Using Neural Transport", arXiv:1903.03704.

    Args:
        target: the energy target on the data side.
        flow: an unconditional :class:`~flows.Flow` on the target's event shape.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.targets import EnergyTarget
        >>> class Gaussian(EnergyTarget):  # N(3, 1)
        ...     def energy(self, x):
        ...         return 0.5 * (x - 3).square().sum(-1)
        >>> latent = PullbackTarget(Gaussian(2), Flow(Affine(2, shift=-3.0), StandardNormal(2)))
        >>> latent.energy(torch.zeros(1, 2)).tolist()  # a perfect flow: the latent target is N(0, I)
        [0.0]
    """

    def __init__(self, target: EnergyTarget, flow: Flow) -> None:
        target = as_target(target, "PullbackTarget")
        check_flow_matches(flow, target.event_shape, "PullbackTarget")
        super().__init__(tuple(target.event_shape))
        self.target = target
        self.flow = flow
        self.watch = FlowWatch(flow)

    @property
    def log_Z(self) -> float | None:  # type: ignore[override]
        r"""The target's :math:`\log Z` (a change of variables keeps the integral)."""
        return self.target.log_Z

    def to_data(self, z: Tensor) -> tuple[Tensor, Tensor]:
        r"""Map latent ``z`` to data: returns :math:`x = T z` and :math:`\log|\det J_T(z)|`."""
        with self.watch.evaluating():
            return self.flow.transform.inverse_and_log_det(z)

    def energy(self, z: Tensor) -> Tensor:
        self._check_input(z)
        x, ladj = self.to_data(z)
        return self._overflow_to_inf(self.target.energy(x) - ladj, z)

    def energy_and_grad(self, z: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        if create_graph:
            return super().energy_and_grad(z, create_graph=True)
        log_prob, grad = self.log_prob_and_grad(z)
        return -log_prob, grad.neg_()

    def log_prob_and_grad(self, z: Tensor) -> tuple[Tensor, Tensor]:
        self._check_input(z)
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            x, ladj = self.to_data(z)
            log_prob, grad_x = self.target.log_prob_and_grad(x.detach())
            (grad,) = torch.autograd.grad((x * grad_x).sum() + ladj.sum(), z)
        return log_prob + ladj.detach(), grad

    def sample(self, sample_shape: Sequence[int] | int = (), **options: object) -> Tensor:
        with torch.no_grad(), self.watch.evaluating():
            return self.flow.transform(self.target.sample(sample_shape, **options))

    @property
    def has_exact_sampler(self) -> bool:
        """Whether the target has an exact sampler."""
        return self.target.has_exact_sampler


class NeuTra(Kernel):
    r"""Run a local kernel (MALA by default, or HMC, random walk) on the flow's latent space.

    The inner kernel targets the pulled-back density :math:`\tilde\pi` (:class:`PullbackTarget`);
    its moves :math:`z \to z'` are mapped to data by :math:`x' = T z'`. The chains (and the
    recorded samples) live on the data side; the latent state is cached and rebuilt from
    :math:`z = f(x)` if the flow changes. The chain targets :math:`\pi` exactly for any flow, but,
    being local, it crosses energy barriers no better than the inner kernel does on
    :math:`\tilde\pi`: an imperfect flow leaves the modes separated in latent space.

    Cost per step: the inner kernel's gradient evaluations (each a target gradient plus a
    vector-Jacobian product through the flow) and one flow pass for the accepted chains.

    References:
        Hoffman, Sountsov, Dillon, Langmore, Tran, Vasudevan (2019), "NeuTra-lizing Bad Geometry
        in Hamiltonian Monte Carlo Using Neural Transport", arXiv:1903.03704.

    Args:
        target: the energy target.
        flow: an unconditional :class:`~flows.Flow` on the target's event shape.
        inner: the local kernel class (or any callable ``(latent_target, **options) -> Kernel``).
        **options: passed to ``inner`` (e.g. ``step_size``, ``leapfrog_steps``).

    Example:
        >>> import torch
        >>> from flows import Flow, LULinear, StandardNormal
        >>> from flows.mcmc import HMC, sample
        >>> from flows.targets import Gaussian
        >>> kernel = NeuTra(Gaussian(2), Flow(LULinear(2), StandardNormal(2)), inner=HMC, leapfrog_steps=3)
        >>> sample(kernel, torch.zeros(4, 2), 5).samples.shape
        torch.Size([5, 4, 2])
    """

    def __init__(
        self,
        target: EnergyTarget,
        flow: Flow,
        inner: Callable[..., Kernel] = MALA,
        **options: object,
    ) -> None:
        super().__init__(target)
        check_flow_matches(flow, self.event_shape, "NeuTra")
        self.flow = flow
        self.latent = PullbackTarget(target, flow)
        kernel = inner(self.latent, **options)
        if not isinstance(kernel, Kernel):
            raise TypeError(f"NeuTra: expected inner to build a Kernel, got {type(kernel).__name__}")
        self.inner = kernel

    def _cache_key(self) -> str:
        return f"latent@{id(self)}"

    def init(self, x: Tensor) -> State:
        self.check_positions(x)
        check_like(x, self.flow, "NeuTra", "positions")
        state = super().init(x)
        return State(state.x, state.log_prob, None, {self._cache_key(): (self.latent.watch.version(), self._pull(x))})

    def _pull(self, x: Tensor) -> State:
        with torch.no_grad(), self.latent.watch.evaluating():
            z = self.flow.transform(x)
        return self.inner.init(z)

    def latent_state(self, state: State) -> State:
        """The inner kernel's state at :math:`z = f(x)` (cached while the flow is unchanged)."""
        cached = state.cache.get(self._cache_key())
        if cached is not None and cached[0] == self.latent.watch.version():
            return cached[1]
        return self._pull(state.x)

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        latent, info = self.inner.step(self.latent_state(state), adapt=adapt)
        accepted = info.accepted
        x, log_prob = state.x, state.log_prob
        if bool(accepted.all()):
            with torch.no_grad():
                x, ladj = self.latent.to_data(latent.x)
            log_prob = latent.log_prob - ladj
        elif bool(accepted.any()):
            rows = accepted.nonzero().squeeze(-1)
            with torch.no_grad():
                x_rows, ladj = self.latent.to_data(latent.x[rows])
            x = x.index_copy(0, rows, x_rows)
            log_prob = log_prob.index_copy(0, rows, latent.log_prob[rows] - ladj)
        new = State(x, log_prob, None, {self._cache_key(): (self.latent.watch.version(), latent)})
        return new, info

    def end_adaptation(self) -> None:
        self.inner.end_adaptation()

    def extra_repr(self) -> str:
        return ""
