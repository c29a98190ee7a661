r"""The kernel contract: :class:`State`, :class:`StepInfo` and :class:`Kernel` for batched Markov chains."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from flows._validation import format_shape, shapes_match
from flows.flow import Flow, evaluating
from flows.targets.base import EnergyTarget, as_target

__all__ = ["FlowWatch", "Kernel", "State", "StepInfo"]


@dataclass(frozen=True)
class State:
    r"""Positions of a batch of chains and the quantities cached at them.

    A state is immutable: kernels return a new one, so a cached quantity always belongs to the
    positions it was computed at. Kernels that need a quantity the state lacks (a gradient after a
    move by a gradient-free kernel, a flow density after the flow was retrained) compute it.

    Attributes:
        x: positions ``(chains, *event_shape)``.
        log_prob: unnormalised target log-density :math:`\log\pi(x) = -u(x)`, shape ``(chains,)``.
        grad: :math:`\nabla_x \log\pi(x)` (shape of ``x``), or ``None`` when not computed.
        cache: kernel-specific quantities at ``x`` (a flow's log-density, a latent state), each
            stored with what it depends on so that a stale entry is recomputed, never reused.
    """

    x: Tensor
    log_prob: Tensor
    grad: Tensor | None = None
    cache: dict[str, object] = field(default_factory=dict)

    @property
    def chains(self) -> int:
        """Number of chains."""
        return self.x.shape[0]


@dataclass(frozen=True)
class StepInfo:
    """What one kernel step reports, per chain.

    Attributes:
        accept_prob: Metropolis–Hastings acceptance probability of the step's move, ``(chains,)``
            (for i-SIR: the probability of leaving the current state; for a composite kernel: its
            flow move).
        accepted: whether each chain moved, ``(chains,)`` bool.
        extras: further per-chain statistics by name (e.g. ``"local_accept_prob"``).
    """

    accept_prob: Tensor
    accepted: Tensor
    extras: dict[str, Tensor] = field(default_factory=dict)


def _select(mask: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """Rows of ``new`` where ``mask`` (``(chains,)``) holds, rows of ``old`` elsewhere."""
    return torch.where(mask.view(-1, *([1] * (new.dim() - 1))), new, old)


def _keep_rejected(accepted: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """``new`` with the rows where ``accepted`` is False copied from ``old``, **in place**.

    The selection of the next state for a proposal the kernel owns (``new`` must be a tensor no
    one else holds). It reads and writes only the rejected rows (about 40 % for MALA at its
    optimal acceptance), where :func:`_select` reads two tensors and writes a third: on CPU the
    state's rows are cold in cache after the target's gradient, so this is the cheaper pass. On
    other devices (where ``nonzero`` would wait for the device) it is :func:`_select`.
    """
    if new.device.type != "cpu":
        return _select(accepted, new, old)
    rejected = (~accepted).nonzero().squeeze(-1)
    if rejected.numel():
        new.index_copy_(0, rejected, old.index_select(0, rejected))
    return new


class FlowWatch:
    """A flow's submodules, listed once: a cheap fingerprint of its values and eval-mode evaluation.

    :meth:`version` changes whenever a parameter or buffer of the flow is modified (it is made of
    each tensor's storage address and in-place version counter, which optimiser steps, ``copy_``,
    ``load_state_dict`` and ``.to(...)`` all change) or a submodule is replaced; kernels store it
    beside every cached flow quantity so that a stale entry is recomputed, never reused. Walking
    ``module.parameters()`` on every step costs more than a flow pass on small batches, hence the
    cached list (re-listed when a submodule is replaced).

    Args:
        flow: the module to watch.
    """

    def __init__(self, flow: nn.Module) -> None:
        self.flow = flow
        self._relist()

    def _structure(self) -> tuple[int, ...]:
        return tuple(id(child) for m in self._modules for child in m._modules.values())

    def _relist(self) -> None:
        self._modules = list(self.flow.modules())
        self._listed = self._structure()

    def version(self) -> tuple[tuple[int, int], ...]:
        """The fingerprint of the flow's current parameter and buffer values."""
        if self._structure() != self._listed:
            self._relist()
        return tuple(
            (t.data_ptr(), t._version)
            for m in self._modules
            for tensors in (m._parameters, m._buffers)
            for t in tensors.values()
            if t is not None
        )

    def evaluating(self) -> contextlib.AbstractContextManager:
        """:func:`flows.evaluating` of the flow, or nothing when no submodule is in training mode."""
        if any(m.training for m in self._modules):
            return evaluating(self.flow)
        return contextlib.nullcontext()


class Kernel(nn.Module):
    r"""Base class of Markov kernels acting on a batch of independent chains.

    A kernel maps a :class:`State` (positions ``(chains, *event_shape)`` and cached quantities)
    to a new state that leaves the target :math:`\pi \propto e^{-u}` invariant, and reports the
    acceptance of its move in a :class:`StepInfo`:

    * ``init(x)`` builds the state at starting positions (evaluating the target there);
    * ``step(state, adapt=False)`` makes one move; with ``adapt=True`` the kernel also tunes its
      parameters (step size by dual averaging, an online-trained flow). Adaptation breaks the
      Markov property, so it belongs to the warm-up only;
    * ``end_adaptation()`` fixes the tuned parameters (e.g. to the dual-averaging average).

    Kernels are modules: the target, flows, step sizes and adaptation statistics are submodules
    and buffers, so ``.to(device)``, ``.double()`` and ``state_dict()`` work.

    Args:
        target: the energy target (any :class:`~flows.targets.EnergyTarget`).
    """

    def __init__(self, target: EnergyTarget) -> None:
        super().__init__()
        self.target = as_target(target, type(self).__name__)

    @property
    def event_shape(self) -> torch.Size:
        """Shape of one configuration of the target."""
        return self.target.event_shape

    def check_positions(self, x: Tensor) -> None:
        """Raise unless ``x`` is a non-empty, finite, real floating-point batch ``(chains, *event_shape)``.

        Raises:
            TypeError: for a non-tensor or a tensor that is not real floating point.
            ValueError: for a wrong shape, no chains, or NaN/±inf positions.
        """
        name = type(self).__name__
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected positions to be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != len(self.event_shape) + 1 or x.shape[1:] != self.event_shape:
            raise ValueError(
                f"{name}: expected positions of shape (chains, {', '.join(map(str, self.event_shape))}), "
                f"got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected floating-point positions, got dtype {x.dtype}")
        if x.shape[0] == 0:
            raise ValueError(f"{name}: expected at least one chain, got positions of shape {tuple(x.shape)}")
        finite = torch.isfinite(x.flatten(1)).all(-1)
        if not bool(finite.all()):
            bad = (~finite).nonzero().squeeze(-1)
            raise ValueError(
                f"{name}: expected finite starting positions, got NaN/Inf in {bad.numel()} chain(s), "
                f"the first chain {int(bad[0])}"
            )

    def check_start(self, state: State) -> State:
        r"""Raise unless the target's log-density (and gradient, when cached) is finite at every chain.

        A chain started where :math:`u(x) = +\infty` (or NaN) never moves under a Metropolis
        correction, or moves by a NaN gradient: the docs promise finite starting states, so such a
        start is refused instead of returning a chain stuck where it began.

        Returns:
            ``state`` itself.

        Raises:
            ValueError: naming the first chain with a non-finite energy or gradient.
        """
        name = type(self).__name__
        finite = torch.isfinite(state.log_prob)
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0, 0])
            raise ValueError(
                f"{name}: expected a finite energy at every starting position, got u = "
                f"{float(-state.log_prob[first])} at chain {first} ({int((~finite).sum())} chain(s) in all)"
            )
        if state.grad is not None:
            finite = torch.isfinite(state.grad.flatten(1)).all(-1)
            if not bool(finite.all()):
                first = int((~finite).nonzero()[0, 0])
                raise ValueError(
                    f"{name}: expected a finite energy gradient at every starting position, got NaN/Inf at "
                    f"chain {first} ({int((~finite).sum())} chain(s) in all)"
                )
        return state

    def init(self, x: Tensor) -> State:
        """The state at positions ``x`` (``(chains, *event_shape)``): evaluates the target there.

        Raises:
            TypeError: for positions that are not a real floating-point tensor.
            ValueError: for a wrong shape, no chains, non-finite positions, or a non-finite
                energy (or gradient, for gradient-based kernels) at a starting position.
        """
        self.check_positions(x)
        return self.check_start(self._initial_state(x.detach()))

    def _initial_state(self, x: Tensor) -> State:
        """The state at checked positions ``x`` (subclasses add what they cache, e.g. the gradient)."""
        with torch.no_grad():
            log_prob = -self.target.energy(x)
        return State(x, log_prob)

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        """One move of every chain; returns the new state and the acceptance report."""
        raise NotImplementedError

    def end_adaptation(self) -> None:
        """Fix the parameters tuned during warm-up (no-op for kernels without adaptation)."""

    def _log_prob_and_grad(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Target log-density and its gradient at ``x`` (detached)."""
        return self.target.log_prob_and_grad(x)

    def _with_grad(self, state: State) -> State:
        r"""The state with :math:`\nabla\log\pi` filled in (one gradient evaluation if missing)."""
        if state.grad is not None:
            return state
        log_prob, grad = self._log_prob_and_grad(state.x)
        return State(state.x, log_prob, grad, state.cache)


def check_flow_matches(flow: Flow, event_shape: Sequence[int], who: str) -> None:
    """Raise unless ``flow`` is an unconditional :class:`~flows.Flow` on events of ``event_shape``."""
    if not isinstance(flow, Flow):
        raise TypeError(f"{who}: expected a flows.Flow, got {type(flow).__name__}")
    if not shapes_match(flow.event_shape, tuple(event_shape)):
        raise ValueError(
            f"{who}: expected a flow on events of shape {format_shape(tuple(event_shape))} (the target's), "
            f"got a flow on {format_shape(flow.event_shape)}"
        )
    if flow.context_features not in (None, 0):
        raise ValueError(f"{who}: expected an unconditional flow, got one with context={flow.context_features}")
