"""The complete state of a training run, for checkpoints that resume exactly where the run stopped."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.train._atomic import remove_stale_temporaries
from flows.train._lock import hold_run_lock
from flows.train.checkpoint import (
    CheckpointError,
    capture_rng_state,
    check_finite_state,
    check_training_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)

if TYPE_CHECKING:  # pragma: no cover
    from flows.train.trainer import Trainer

__all__ = ["load_trainer_state", "resume_trainer", "save_trainer", "stop_on_signals", "trainer_state"]


def trainer_state(trainer: Trainer) -> dict[str, Any]:
    """Counters, epoch position and running sums, model, optimizer, scheduler, guard, callbacks, history, RNGs.

    Everything is a tensor or a plain container, so it loads under ``torch.load(weights_only=True)``.
    """
    return {
        "trainer": {
            "epoch": trainer.epoch,
            "epoch_step": trainer.epoch_step,
            "step": trainer.step,
            "elapsed": trainer.elapsed,
            "epoch_sums": dict(trainer._epoch_sums),
            "epoch_count": trainer._epoch_count,
        },
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "guard": trainer.guard.state_dict() if trainer.guard is not None else None,
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "history": trainer.history.state_dict(),
        "rng": capture_rng_state(),
    }


def load_trainer_state(trainer: Trainer, state: dict[str, Any]) -> None:
    """Restore what :func:`trainer_state` returned into ``trainer`` (built with the same callbacks).

    Raises:
        CheckpointError: when the number of callbacks differs from the saved run's.
    """
    if len(state["callbacks"]) != len(trainer.callbacks):
        raise CheckpointError(
            f"the checkpoint has state for {len(state['callbacks'])} callbacks, this trainer has "
            f"{len(trainer.callbacks)}; resume with the same callbacks"
        )
    t = state["trainer"]
    trainer.epoch, trainer.epoch_step, trainer.step = int(t["epoch"]), int(t["epoch_step"]), int(t["step"])
    trainer.elapsed = float(t["elapsed"])
    trainer._epoch_sums, trainer._epoch_count = dict(t["epoch_sums"]), int(t["epoch_count"])
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.guard is not None and state["guard"] is not None:
        trainer.guard.load_state_dict(state["guard"])
    for cb, cb_state in zip(trainer.callbacks, state["callbacks"], strict=True):
        cb.load_state_dict(cb_state)
    trainer.history.load_state_dict(state["history"])
    restore_rng_state(state["rng"])


def save_trainer(trainer: Trainer, path: str | os.PathLike | None = None) -> Path | None:
    """Write ``trainer``'s state to ``path`` (default: its checkpoint file) atomically, from rank 0 only."""
    path = Path(path) if path is not None else trainer.checkpoint
    if path is None:
        raise ValueError("Trainer.save: expected a path (no checkpoint file was configured)")
    if not trainer.is_main_process:
        return None
    last = {
        k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None) for k, v in trainer.history.last().items()
    }
    info = {**trainer.info, "epoch": trainer.epoch, "step": trainer.step, "last": last}
    return save_checkpoint(path, trainer_state(trainer), config=trainer.config, kind="training", info=info)


def resume_trainer(trainer: Trainer, path: str | os.PathLike | None = None) -> None:
    """Load a training checkpoint into ``trainer`` (default: its checkpoint file).

    Temporary files that a killed save of this checkpoint left beside it (``.<name>.*.tmp``) are
    removed, under the checkpoint's run lock (see :mod:`flows.train._lock`).

    Raises:
        CheckpointError: for a damaged file, a model (not training) checkpoint or other callbacks.
        RunLockedError: when another live process holds the checkpoint's lock.
    """
    path = Path(path) if path is not None else trainer.checkpoint
    if path is None:
        raise ValueError("Trainer.resume: expected a path (no checkpoint file was configured)")
    if trainer.is_main_process and path.parent.is_dir() and os.access(path.parent, os.W_OK):
        with hold_run_lock(path):  # no live writer can be half-way through a save of this file
            remove_stale_temporaries(path.parent, path.name)
    checkpoint = load_checkpoint(path, map_location=trainer.device)
    if checkpoint.header.get("kind") != "training":
        raise CheckpointError(f"{str(path)!r} is a {checkpoint.header.get('kind')!r} checkpoint, not a training one")
    check_training_state(checkpoint.state, path)
    check_finite_state(checkpoint.state["model"], path, "state['model']")
    check_finite_state(checkpoint.state["optimizer"], path, "state['optimizer']")
    try:
        load_trainer_state(trainer, checkpoint.state)
    except (KeyError, RuntimeError, TypeError, ValueError, IndexError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r}: expected a training state that fits this trainer's model and optimizer, "
            f"got one that does not load ({type(error).__name__}: {first})"
        ) from error


@contextlib.contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """During ``fit``: Ctrl-C (SIGINT) or SIGTERM stops training at the next step boundary.

    The trainer then writes its checkpoint as at any other stop, so the saved state is a whole
    number of steps (an interrupt in the middle of an optimizer update would save half-updated
    weights) and ``trainer.interrupted`` holds the signal number. A second Ctrl-C interrupts at
    once. Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if trainer.interrupted is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        trainer.interrupted = signum
        trainer.should_stop = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
