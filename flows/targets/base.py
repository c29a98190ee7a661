r"""The target interface: unnormalised densities :math:`\pi(x) \propto e^{-u(x)}` given by an energy."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flows._energy import Energy
from flows._validation import as_sample_shape, as_shape, check_event, check_real

__all__ = ["EnergyTarget", "ProtocolTarget", "as_target"]


class EnergyTarget(nn.Module):
    r"""Base class of energy targets :math:`\pi(x) = e^{-u(x)}/Z`.

    Subclasses implement :meth:`energy` (batched over leading dimensions) and, where known, set
    :attr:`log_Z` and override :meth:`sample` with an exact sampler. Constants are buffers so that
    ``.double()`` and ``.to(device)`` work. Energies are at unit temperature (``β = 1``); trainers
    and samplers apply their own temperature.

    The interface shared by trainers, importance weights and MCMC kernels:

    * ``energy(x)``: :math:`u(x)`, shape ``batch``;
    * ``log_prob(x)``: the unnormalised log-density :math:`-u(x)` (minus ``log_Z`` when
      ``normalized=True`` and it is known);
    * ``energy_and_grad(x)``: :math:`u(x)` and :math:`\nabla u(x)` by autograd;
    * ``log_prob_and_grad(x)``: :math:`\log\pi = -u(x)` and :math:`\nabla\log\pi(x)`, the pair
      gradient-based samplers cache;
    * ``log_Z``: :math:`\log Z = \log \int e^{-u}` or ``None`` when unknown;
    * ``sample(n, generator=None)``: exact samples, or :class:`NotImplementedError`.

    Args:
        event_shape: shape of one configuration.
    """

    log_Z: float | None = None

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        self.event_shape = torch.Size(as_shape(event_shape, "event_shape", allow_none=False))
        # Carries the target's dtype and device for sampling; holds no information.
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    @property
    def dim(self) -> int:
        """Number of degrees of freedom (entries of one event)."""
        return math.prod(self.event_shape)

    def energy(self, x: Tensor) -> Tensor:
        r"""Energy :math:`u(x)` of configurations ``(*batch, *event_shape)``, shape ``batch``.

        The library's targets refuse integer and complex inputs (``TypeError``) and wrong event
        shapes (``ValueError``), and return :math:`u = +\infty` (not NaN) where the input has no
        NaN but the energy overflows far out (``1e30``, or ``±inf`` coordinates, or coinciding
        particles of a repulsive potential): every target here is confining, so an overflow is an
        infinite energy, and an importance weight :math:`e^{-u}` there is exactly 0. A NaN input
        gives a NaN energy.
        """
        raise NotImplementedError

    def _check_input(self, x: Tensor) -> None:
        """Raise unless ``x`` is a real floating-point tensor ``(*batch, *event_shape)``."""
        name = type(self).__name__
        check_real(x, name)
        check_event(x, self.event_shape, name)

    def _overflow_to_inf(self, u: Tensor, x: Tensor) -> Tensor:
        r"""``u`` with NaN replaced by ``+inf`` where ``x`` holds no NaN (an overflow far out, e.g. ``inf - inf``).

        Valid for confining energies (:math:`u \to +\infty` as :math:`\|x\| \to \infty`, and
        at the singular points of repulsive pair potentials); a NaN input keeps its NaN.
        """
        n = len(self.event_shape)
        clean = ~torch.isnan(x).flatten(x.dim() - n).any(-1) if n else ~torch.isnan(x)
        return torch.where(torch.isnan(u) & clean, torch.inf, u)

    def log_prob(self, x: Tensor, context: Tensor | None = None, *, normalized: bool = False) -> Tensor:
        r"""Unnormalised log-density :math:`-u(x)`; with ``normalized=True``, :math:`-u(x) - \log Z`.

        Raises:
            ValueError: for ``normalized=True`` on a target whose ``log_Z`` is unknown.
        """
        check_event(x, self.event_shape, type(self).__name__)
        log_p = -self.energy(x)
        if normalized:
            if self.log_Z is None:
                raise ValueError(f"{type(self).__name__}: log_Z is unknown, cannot normalise")
            log_p = log_p - self.log_Z
        return log_p

    def energy_and_grad(self, x: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        r"""Energy and its gradient :math:`\nabla_x u(x)` (autograd), for batched ``x``.

        With ``create_graph=True`` (and an ``x`` that requires grad) both outputs stay differentiable
        with respect to ``x`` and the target's parameters (second-order terms for training through
        Langevin or HMC steps).
        """
        with torch.enable_grad():
            x = x if x.requires_grad and create_graph else x.detach().requires_grad_(True)
            u = self.energy(x)
            (grad,) = torch.autograd.grad(u.sum(), x, create_graph=create_graph)
        return (u if create_graph else u.detach()), grad

    def log_prob_and_grad(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""Unnormalised log-density :math:`-u(x)` and its gradient :math:`\nabla_x\log\pi = -\nabla u`, detached.

        By default one autograd pass through :math:`-u`: the sign is applied to the ``(batch,)``
        energies, not to the gradient, so no pass over ``x``-sized tensors is spent on it (MALA
        and HMC call this once per step). A subclass that overrides :meth:`energy_and_grad`
        (an analytic gradient) is used through that override. Kernels write into the returned
        tensors, so an override of this method must return tensors it does not keep.
        """
        if type(self).energy_and_grad is not EnergyTarget.energy_and_grad:
            u, grad = self.energy_and_grad(x)
            return -u.detach(), -grad.detach()
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            log_prob = -self.energy(x)
            (grad,) = torch.autograd.grad(log_prob.sum(), x)
        return log_prob.detach(), grad

    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        """Exact samples of shape ``(*sample_shape, *event_shape)`` where an exact sampler exists."""
        raise NotImplementedError(f"{type(self).__name__} has no exact sampler")

    @property
    def has_exact_sampler(self) -> bool:
        """Whether :meth:`sample` is implemented."""
        return type(self).sample is not EnergyTarget.sample

    def _sample_size(self, sample_shape: Sequence[int] | int) -> torch.Size:
        """``sample_shape`` as a ``torch.Size`` (an ``int`` means ``(n,)``)."""
        try:
            return as_sample_shape(sample_shape)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{type(self).__name__}: {error}") from None

    def _randn(self, shape: Sequence[int], generator: torch.Generator | None) -> Tensor:
        a = self._anchor
        return torch.randn(tuple(shape), generator=generator, dtype=a.dtype, device=a.device)

    def _rand(self, shape: Sequence[int], generator: torch.Generator | None) -> Tensor:
        a = self._anchor
        return torch.rand(tuple(shape), generator=generator, dtype=a.dtype, device=a.device)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


class ProtocolTarget(EnergyTarget):
    r"""An :class:`EnergyTarget` around any object that satisfies the :class:`~flows._energy.Energy` protocol.

    The wrapped object's ``energy`` and ``energy_and_grad`` are used as they are (an analytic
    gradient is kept); ``log_prob`` and ``log_prob_and_grad`` follow from them. ``log_Z`` and
    ``sample`` are taken from the object when it has them. Use :func:`as_target` rather than this
    class: it passes an :class:`EnergyTarget` through unchanged.

    Args:
        energy: an object with ``event_shape``, ``energy(x)`` and ``energy_and_grad(x)``.
    """

    def __init__(self, energy: Energy) -> None:
        super().__init__(energy.event_shape)
        self.wrapped = energy
        self.log_Z = getattr(energy, "log_Z", None)

    def energy(self, x: Tensor) -> Tensor:
        """:math:`u(x)` from the wrapped object."""
        self._check_input(x)
        return self.wrapped.energy(x)

    def energy_and_grad(self, x: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        r""":math:`(u(x), \nabla_x u(x))` from the wrapped object."""
        self._check_input(x)
        return self.wrapped.energy_and_grad(x, create_graph=create_graph)

    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        """The wrapped object's exact sampler, where it has one."""
        sample = getattr(self.wrapped, "sample", None)
        if sample is None:
            raise NotImplementedError(f"{type(self.wrapped).__name__} has no exact sampler")
        return sample(sample_shape, generator=generator)

    @property
    def has_exact_sampler(self) -> bool:
        """Whether the wrapped object has a ``sample`` method."""
        return callable(getattr(self.wrapped, "sample", None))

    def extra_repr(self) -> str:
        return f"{type(self.wrapped).__name__}, event_shape={tuple(self.event_shape)}"


def as_target(target: EnergyTarget | Energy, who: str, name: str = "target") -> EnergyTarget:
    """``target`` as an :class:`EnergyTarget`: itself, or a :class:`ProtocolTarget` around an ``Energy``.

    Samplers, objectives and the stochastic blocks all accept the same things through this one
    function: a :class:`EnergyTarget`, or any object with ``event_shape``, ``energy`` and
    ``energy_and_grad`` (the :class:`~flows._energy.Energy` protocol).

    Raises:
        TypeError: for anything else, naming ``who`` and what came.
    """
    if isinstance(target, EnergyTarget):
        return target
    if isinstance(target, Energy):
        return ProtocolTarget(target)
    raise TypeError(
        f"{who}: expected {name} to be an EnergyTarget or an object with event_shape, energy(x) and "
        f"energy_and_grad(x), got {type(target).__name__}"
    )
