"""One writer per run: an OS file lock beside a checkpoint, released by the kernel when its holder dies.

``flows fit`` and :meth:`flows.train.Trainer.fit` hold an exclusive ``fcntl.flock`` lock on
``.<checkpoint name>.lock`` next to the checkpoint while they write there. A second process that
asks for the same lock is refused at once with :class:`RunLockedError`; a lock whose holder was
killed (even by SIGKILL) is free again, because the kernel drops a process's locks with its open
files, so there is no stale lock to clean up by hand. The lock is re-entrant within a process (the
CLI holds it and the trainer it runs takes it again). Where ``fcntl`` does not exist (Windows) no
lock is taken.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

try:  # pragma: no cover - import guard
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunLockedError", "hold_run_lock", "lock_path"]

_held: dict[str, tuple[int, int]] = {}  # lock file -> (descriptor, depth) held by this process
_mutex = threading.Lock()


class RunLockedError(RuntimeError):
    """Another live process is writing to the same run (checkpoint) already."""


def lock_path(checkpoint: str | os.PathLike) -> Path:
    """The lock file of ``checkpoint``: ``.<name>.lock`` in the same directory."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent / f".{checkpoint.name}.lock"


@contextlib.contextmanager
def hold_run_lock(checkpoint: str | os.PathLike) -> Iterator[None]:
    """Hold the exclusive lock of ``checkpoint`` (creating its directory) for the ``with`` block.

    Raises:
        RunLockedError: when another process holds it; the message names that process's id.
    """
    path = lock_path(checkpoint)
    key = os.path.abspath(path)
    with _mutex:
        if key in _held:
            fd, depth = _held[key]
            _held[key] = (fd, depth + 1)
        else:
            _held[key] = (_acquire(path), 1)
    try:
        yield
    finally:
        with _mutex:
            fd, depth = _held[key]
            if depth > 1:
                _held[key] = (fd, depth - 1)
            else:
                del _held[key]
                _release(fd)


def _acquire(path: Path) -> int:
    if fcntl is None:  # pragma: no cover - Windows: no lock
        return -1
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise RunLockedError(
            f"{str(path.parent)!r} is in use: expected no other process writing to {path.name[1:-5]!r}, got process "
            f"{holder} holding {str(path)!r}; wait for it to finish or stop it (the lock is released when it exits)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _release(fd: int) -> None:
    if fd < 0:  # pragma: no cover - Windows: no lock
        return
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)  # closing the descriptor drops the flock
