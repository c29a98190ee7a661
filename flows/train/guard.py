r"""The NaN/Inf guard: skip non-finite steps, roll back to the last good state with a lower learning rate.

A flow that meets a numerically bad batch (an extreme log-scale, a spline bin collapsing) produces a
non-finite loss or gradient; a learning rate that is far too large turns finite gradients into
non-finite weights or Adam moments. Either destroys the model for good if it is kept. The guard
never lets it through, and never continues silently:

1. a step whose loss or gradient norm is not finite is **skipped** (no optimizer update) and
   counted; a step whose update makes any parameter or optimizer state non-finite is **undone**
   (the model and optimizer go back to the last snapshot) and counted the same way;
2. after ``max_consecutive`` bad steps in a row the model and optimizer are **rolled back** to the
   last snapshot taken after good steps, and every learning rate is set to
   :math:`\eta_k = \eta_\text{snapshot} \cdot \text{lr\_factor}^k`, where ``k`` counts the rollbacks
   in a row with no good step in between (a scheduler's base learning rates follow). The backoff
   compounds: three rollbacks in a row from 0.01 with ``lr_factor=0.5`` give 0.005, 0.0025 and
   0.00125, so the guard never retries a rate that just failed; one good step resets ``k`` to 0
   (the next rollback lowers the snapshot's rate once again). A :class:`TrainingWarning` says so
   (the event is also recorded in the trainer's history);
3. after ``max_rollbacks`` rollbacks the run stops with :class:`TrainingDiverged`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

__all__ = ["NonFiniteGuard", "TrainingDiverged", "TrainingWarning", "all_finite", "global_grad_norm", "state_tensors"]


class TrainingWarning(UserWarning):
    """Something went wrong in training and was handled (skipped steps, a rollback)."""


class TrainingDiverged(RuntimeError):
    """Training kept producing non-finite values after every allowed rollback."""


class NonFiniteGuard:
    """Skips non-finite steps and rolls back after repeated ones (see the module docstring).

    Args:
        max_consecutive: bad steps in a row that trigger a rollback.
        lr_factor: at the ``k``-th rollback in a row (no good step in between) every learning rate
            becomes ``lr_factor**k`` times the snapshot's (``0 < lr_factor <= 1``).
        max_rollbacks: rollbacks allowed before :class:`TrainingDiverged` is raised.
        snapshot_every: good steps between snapshots of the model and optimizer (kept in memory).

    Example:
        >>> guard = NonFiniteGuard(max_consecutive=3, lr_factor=0.5)
        >>> guard.max_consecutive, guard.rollbacks
        (3, 0)
    """

    def __init__(
        self,
        *,
        max_consecutive: int = 5,
        lr_factor: float = 0.5,
        max_rollbacks: int = 3,
        snapshot_every: int = 100,
    ) -> None:
        if max_consecutive < 1:
            raise ValueError(f"NonFiniteGuard: expected max_consecutive >= 1, got {max_consecutive}")
        if not 0 < lr_factor <= 1:
            raise ValueError(f"NonFiniteGuard: expected 0 < lr_factor <= 1, got {lr_factor}")
        if max_rollbacks < 0:
            raise ValueError(f"NonFiniteGuard: expected max_rollbacks >= 0, got {max_rollbacks}")
        if snapshot_every < 1:
            raise ValueError(f"NonFiniteGuard: expected snapshot_every >= 1, got {snapshot_every}")
        self.max_consecutive = max_consecutive
        self.lr_factor = lr_factor
        self.max_rollbacks = max_rollbacks
        self.snapshot_every = snapshot_every
        self.consecutive = 0
        self.skipped = 0
        self.rollbacks = 0
        self.rollbacks_in_a_row = 0  # since the last good step: the exponent of the learning-rate backoff
        self._good_since_snapshot = 0
        self._snapshot: tuple[dict, dict, list[float] | None] | None = None

    def snapshot(self, model: nn.Module, optimizer: Optimizer, scheduler: Any = None) -> None:
        """Remember the current model and optimizer state (and a scheduler's base rates) as the last good state."""
        base_lrs = list(scheduler.base_lrs) if hasattr(scheduler, "base_lrs") else None
        self._snapshot = (_clone(model.state_dict()), _clone(optimizer.state_dict()), base_lrs)
        self._good_since_snapshot = 0

    def good_step(self, model: nn.Module, optimizer: Optimizer, scheduler: Any = None) -> None:
        """Record a successful step (takes a snapshot every ``snapshot_every`` of them)."""
        self.consecutive = 0
        self.rollbacks_in_a_row = 0
        self._good_since_snapshot += 1
        if self._snapshot is None or self._good_since_snapshot >= self.snapshot_every:
            self.snapshot(model, optimizer, scheduler)

    def restore(self, model: nn.Module, optimizer: Optimizer) -> bool:
        """Load the last snapshot into ``model`` and ``optimizer`` (learning rates included); ``False`` without one."""
        if self._snapshot is None:
            return False
        model_state, optimizer_state, _ = self._snapshot
        model.load_state_dict(model_state)
        optimizer.load_state_dict(_clone(optimizer_state))
        self._good_since_snapshot = 0
        return True

    def undo(self, model: nn.Module, optimizer: Optimizer, step: int) -> str | None:
        """Undo an update that left non-finite weights or optimizer state: go back to the last snapshot.

        The snapshot may be older than the step before (it is taken every ``snapshot_every`` good
        steps); when good steps are undone with it, a :class:`TrainingWarning` says how many.

        Returns:
            The warning's message when good steps were undone, else ``None``.
        """
        lost = self._good_since_snapshot
        self.restore(model, optimizer)
        if not lost:
            return None
        message = (
            f"step {step}: the update made weights or optimizer state non-finite; went back to the last good "
            f"snapshot, undoing the {lost} good step(s) since it"
        )
        warnings.warn(message, TrainingWarning, stacklevel=3)
        return message

    def bad_step(
        self, model: nn.Module, optimizer: Optimizer, step: int, reason: str, scheduler: Any = None
    ) -> str | None:
        """Record a skipped (or undone) step; roll back when there were too many in a row.

        At the ``k``-th rollback in a row (no good step since the previous one) the model and
        optimizer get the snapshot's state, every learning rate becomes ``lr_factor**k`` times the
        snapshot's, and a scheduler's ``base_lrs`` become ``lr_factor**k`` times their values at
        the snapshot.

        Returns:
            A message describing the rollback when one happened, else ``None``.

        Raises:
            TrainingDiverged: when a rollback is needed but ``max_rollbacks`` were already used.
        """
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive < self.max_consecutive:
            return None
        if self.rollbacks >= self.max_rollbacks or self._snapshot is None:
            lrs = ", ".join(f"{group['lr']:.3g}" for group in optimizer.param_groups)
            raise TrainingDiverged(
                f"training diverged at step {step}: {self.consecutive} non-finite steps in a row ({reason}) "
                f"after {self.rollbacks} rollback(s) to the last good state, each lowering the learning rate by "
                f"{self.lr_factor} more (now {lrs}); expected finite losses, gradients and weights: "
                "lower the learning rate, clip gradients (clip_grad_norm) or check the data"
            )
        self.restore(model, optimizer)
        self.rollbacks_in_a_row += 1
        factor = self.lr_factor**self.rollbacks_in_a_row  # of the snapshot's rate, just restored
        base_lrs = self._snapshot[2]
        lrs = []
        for group in optimizer.param_groups:
            group["lr"] *= factor
            if "initial_lr" in group:
                group["initial_lr"] *= factor
            lrs.append(group["lr"])
        if base_lrs is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in base_lrs]
        self.rollbacks += 1
        self.consecutive = 0
        message = (
            f"step {step}: {self.max_consecutive} non-finite steps in a row ({reason}); rolled back to the last "
            f"good state and lowered the learning rate to {', '.join(f'{lr:.3g}' for lr in lrs)} "
            f"({self.lr_factor:g}**{self.rollbacks_in_a_row} of the snapshot's: rollback {self.rollbacks_in_a_row} "
            f"in a row; rollback {self.rollbacks} of at most {self.max_rollbacks})"
        )
        warnings.warn(message, TrainingWarning, stacklevel=3)
        return message

    def state_dict(self) -> dict[str, Any]:
        """Counters (the in-memory snapshot is not saved: a resumed run snapshots its resumed state)."""
        return {
            "consecutive": self.consecutive,
            "skipped": self.skipped,
            "rollbacks": self.rollbacks,
            "rollbacks_in_a_row": self.rollbacks_in_a_row,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters saved by :meth:`state_dict`."""
        self.consecutive = int(state["consecutive"])
        self.skipped = int(state["skipped"])
        self.rollbacks = int(state["rollbacks"])
        self.rollbacks_in_a_row = int(state.get("rollbacks_in_a_row", 0))  # checkpoints from before it was saved


def _clone(state: Any) -> Any:
    """Copy of a state dict: tensors cloned, containers rebuilt (much faster than ``copy.deepcopy``)."""
    if isinstance(state, Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return type(state)((k, _clone(v)) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_clone(v) for v in state)
    return state


def state_tensors(model: nn.Module, optimizer: Optimizer) -> list[Tensor]:
    """The floating-point tensors a step changes: the model's parameters and the optimizer's state (moments, ...)."""
    tensors = [p for p in model.parameters()]
    for state in optimizer.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, Tensor))
    return [t for t in tensors if t.is_floating_point() or t.is_complex()]


def all_finite(tensors: Sequence[Tensor]) -> bool:
    """Whether every element of every tensor is finite (one pass, one device synchronisation per device).

    A finite 2-norm (one fused pass over all tensors; measurements: ``docs/guide/training.md``)
    proves every element finite. A non-finite one may also come from finite values above
    about ``1e19`` (float32) whose squares overflow, so then the largest absolute value decides: it
    is finite exactly when all elements are, and cannot overflow.

    Example:
        >>> import torch
        >>> all_finite([torch.ones(3), torch.tensor([1e38, -1e38])]), all_finite([torch.tensor([0.0, float("nan")])])
        (True, False)
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        if t.numel():
            groups.setdefault((t.device, t.dtype), []).append(t)
    with torch.no_grad():
        for group in groups.values():
            if bool(torch.stack(torch._foreach_norm(group)).isfinite().all()):
                continue
            if not bool(torch.stack(torch._foreach_norm(group, math.inf)).isfinite().all()):
                return False
    return True


def global_grad_norm(params: Sequence[nn.Parameter], clip: float | None = None) -> float:
    """Global gradient norm (non-finite exactly when a gradient is), clipping the gradients to ``clip`` if given.

    Finite float32 gradients above about ``1e19`` overflow a float32 norm; their norm is then
    computed in float64, so such a step is clipped (or taken) rather than skipped as non-finite.

    One ``cat`` and one norm: for the many small tensors of a flow this is several times faster
    on CPU than ``torch._foreach_norm``, which ``clip_grad_norm_`` uses.

    Example:
        >>> import torch
        >>> p = torch.nn.Parameter(torch.zeros(2))
        >>> p.grad = torch.tensor([3.0, 4.0])
        >>> global_grad_norm([p], clip=1.0), [round(g, 3) for g in p.grad.tolist()]
        (5.0, [0.6, 0.8])
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    flat = torch.cat([g.reshape(-1) for g in grads])
    norm = float(torch.linalg.vector_norm(flat))
    if math.isinf(norm) and bool(flat.isfinite().all()):  # finite gradients whose squares overflow: not a bad step
        norm = float(torch.linalg.vector_norm(flat, dtype=torch.float64))
    if clip is not None and math.isfinite(norm) and norm > clip:
        torch._foreach_mul_(grads, clip / (norm + 1e-6))
    return norm
