"""Atomic file replacement: write a temporary file beside the target, fsync it, rename it over the target.

A process killed at any moment leaves either the old file or the new one, never a mix: the rename
is atomic on POSIX and Windows file systems, and the fsync before it makes sure the new bytes are
on disk before the name points at them. The directory is fsynced after the rename (where the OS
allows it) so that the rename itself survives a power loss.

The temporary file is created with mode ``0o666`` filtered by the process umask, as ``open(path,
"w")`` would create it (``tempfile.mkstemp`` would give ``0o600`` whatever the umask), so the file
that replaces the target has the permissions the user expects. A process killed between creating
and renaming the temporary file leaves it behind as ``.<name>.<random>.tmp`` (``.tmp.<suffix>`` for
:func:`atomic_path`);
:func:`remove_stale_temporaries` deletes those (call it only while no other process writes there).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "naming_os_errors", "remove_stale_temporaries"]


@contextlib.contextmanager
def naming_os_errors(path: str | os.PathLike) -> Iterator[None]:
    """An :class:`OSError` without a file name raised inside (a full disk in ``write``) gets ``path`` as its file name.

    ``write`` and ``fsync`` failures (``ENOSPC``, ``EIO``, ``EDQUOT``) carry no file name, so an
    error message could not say which file was lost; this names the target (not its temporary).
    """
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        named = OSError(error.errno, error.strerror or str(error) or type(error).__name__, str(path))
        raise named from error


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> Path:
    """Replace ``path`` with ``data`` atomically (creating parent directories); returns the path.

    Raises:
        OSError: naming ``path`` (a full disk, no permission); ``path`` then still holds its old bytes.
    """
    path = Path(path)
    with naming_os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path)
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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to (by a library that wants a file name); renamed over ``path`` after.

    The temporary keeps ``path``'s suffix (``.<name>.<random>.tmp.png``: writers such as matplotlib
    choose the format by it). On success it is fsynced and renamed over ``path``; on any error it
    is deleted and ``path`` keeps its old bytes. OS errors name ``path``.
    """
    path = Path(path)
    with naming_os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path, suffix=path.suffix)
        os.close(fd)
        try:
            yield Path(tmp)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _fsync_directory(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def remove_stale_temporaries(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the temporary files that killed atomic writes left in ``directory`` (only of ``name`` if given).

    Only files named like this module's temporaries (``.<name>.<random>.tmp``) are removed.

    Returns:
        The paths removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = f".{name}.*.tmp" if name is not None else ".*.tmp"
    removed = []
    for candidate in [*directory.glob(pattern), *directory.glob(pattern + ".*")]:  # .tmp.png: see atomic_path
        if candidate.is_file() and not candidate.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def _create_temporary(path: Path, suffix: str = "") -> tuple[int, str]:
    """Open a new, uniquely named file beside ``path`` for writing, with the mode the umask gives."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{suffix}")
        try:
            return os.open(tmp, flags, 0o666), tmp  # the kernel applies the umask, as for open(path, "w")
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    raise FileExistsError(f"atomic write: could not create a temporary file beside {str(path)!r}")  # pragma: no cover


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be opened for fsync on Windows
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
