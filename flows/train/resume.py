"""Training checkpoints on disk: save a :class:`~flows.train.Trainer`'s state, resume from it, stop on signals.

What a run's state holds is the trainer's business (:meth:`~flows.train.Trainer.state_dict` and
:meth:`~flows.train.Trainer.load_state_dict`); this module puts it in a checkpoint file and takes it
back out, with the checks a file from elsewhere needs.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from flows.train._atomic import remove_stale_temporaries
from flows.train._lock import hold_run_lock
from flows.train.checkpoint import (
    CheckpointError,
    check_finite_state,
    check_training_state,
    load_checkpoint,
    save_checkpoint,
)

if TYPE_CHECKING:  # pragma: no cover
    from flows.train.trainer import Trainer

__all__ = ["resume_trainer", "save_trainer", "stop_on_signals"]


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
    return save_checkpoint(path, trainer.state_dict(), config=trainer.config, kind="training", info=info)


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
    if checkpoint.state.get("objective") is not None:
        check_finite_state(checkpoint.state["objective"], path, "state['objective']")
    try:
        trainer.load_state_dict(checkpoint.state)
    except (KeyError, RuntimeError, TypeError, ValueError, IndexError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r}: expected a training state that fits this trainer (its model, optimizer, "
            f"scheduler and callbacks), got one that does not load ({type(error).__name__}: {first})"
        ) from error


@contextlib.contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """During ``fit``: Ctrl-C (SIGINT), SIGTERM or SIGHUP (a closed terminal) stops training at the next step boundary.

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

    stops = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
