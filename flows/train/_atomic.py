"""Atomic file replacement: write a temporary file beside the target, fsync it, rename it over the target.

A process killed at any moment leaves either the old file or the new one, never a mix: the rename
is atomic on POSIX and Windows file systems, and the fsync before it makes sure the new bytes are
on disk before the name points at them. The directory is fsynced after the rename (where the OS
allows it) so that the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> Path:
    """Replace ``path`` with ``data`` atomically (creating parent directories); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be opened for fsync on Windows
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
