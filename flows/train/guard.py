"""The NaN/Inf guard: skip non-finite steps, roll back to the last good state with a lower learning rate.

A flow that meets a numerically bad batch (an extreme log-scale, a spline bin collapsing) produces a
non-finite loss or gradient. Applying that step destroys the weights and the Adam moments for good.
The guard never lets it through, and never continues silently:

1. a step whose loss or gradient norm is not finite is **skipped** (no optimizer update) and
   counted;
2. after ``max_consecutive`` bad steps in a row the model and optimizer are **rolled back** to the
   last snapshot taken after good steps, every learning rate is multiplied by ``lr_factor``, and a
   :class:`TrainingWarning` says so (the event is also recorded in the trainer's history);
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

__all__ = ["NonFiniteGuard", "TrainingDiverged", "TrainingWarning", "global_grad_norm"]


class TrainingWarning(UserWarning):
    """Something went wrong in training and was handled (skipped steps, a rollback)."""


class TrainingDiverged(RuntimeError):
    """Training kept producing non-finite values after every allowed rollback."""


class NonFiniteGuard:
    """Skips non-finite steps and rolls back after repeated ones (see the module docstring).

    Args:
        max_consecutive: bad steps in a row that trigger a rollback.
        lr_factor: multiplier applied to every learning rate at each rollback (``0 < lr_factor <= 1``).
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
        self._good_since_snapshot = 0
        self._snapshot: tuple[dict, dict] | None = None

    def snapshot(self, model: nn.Module, optimizer: Optimizer) -> None:
        """Remember the current model and optimizer state as the last good state."""
        self._snapshot = (_clone(model.state_dict()), _clone(optimizer.state_dict()))
        self._good_since_snapshot = 0

    def good_step(self, model: nn.Module, optimizer: Optimizer) -> None:
        """Record a successful step (takes a snapshot every ``snapshot_every`` of them)."""
        self.consecutive = 0
        self._good_since_snapshot += 1
        if self._snapshot is None or self._good_since_snapshot >= self.snapshot_every:
            self.snapshot(model, optimizer)

    def bad_step(self, model: nn.Module, optimizer: Optimizer, step: int, reason: str) -> str | None:
        """Record a skipped step; roll back when there were too many in a row.

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
            raise TrainingDiverged(
                f"training diverged at step {step}: {self.consecutive} non-finite steps in a row ({reason}) "
                f"after {self.rollbacks} rollback(s) with the learning rate lowered by {self.lr_factor} each time; "
                "lower the learning rate, clip gradients (clip_grad_norm) or check the data"
            )
        model_state, optimizer_state = self._snapshot
        model.load_state_dict(model_state)
        optimizer.load_state_dict(_clone(optimizer_state))
        lrs = []
        for group in optimizer.param_groups:
            group["lr"] *= self.lr_factor
            if "initial_lr" in group:
                group["initial_lr"] *= self.lr_factor
            lrs.append(group["lr"])
        self.rollbacks += 1
        self.consecutive = 0
        message = (
            f"step {step}: {self.max_consecutive} non-finite steps in a row ({reason}); rolled back to the last "
            f"good state and lowered the learning rate to {', '.join(f'{lr:.3g}' for lr in lrs)} "
            f"(rollback {self.rollbacks} of at most {self.max_rollbacks})"
        )
        warnings.warn(message, TrainingWarning, stacklevel=3)
        return message

    def state_dict(self) -> dict[str, Any]:
        """Counters (the in-memory snapshot is not saved: a resumed run snapshots its resumed state)."""
        return {"consecutive": self.consecutive, "skipped": self.skipped, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters saved by :meth:`state_dict`."""
        self.consecutive = int(state["consecutive"])
        self.skipped = int(state["skipped"])
        self.rollbacks = int(state["rollbacks"])


def _clone(state: Any) -> Any:
    """Copy of a state dict: tensors cloned, containers rebuilt (much faster than ``copy.deepcopy``)."""
    if isinstance(state, Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return type(state)((k, _clone(v)) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_clone(v) for v in state)
    return state


def global_grad_norm(params: Sequence[nn.Parameter], clip: float | None = None) -> float:
    """Global gradient norm (non-finite if any gradient is), clipping the gradients to ``clip`` if given.

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
    norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])))
    if clip is not None and math.isfinite(norm) and norm > clip:
        torch._foreach_mul_(grads, clip / (norm + 1e-6))
    return norm
