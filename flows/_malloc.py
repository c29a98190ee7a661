"""Keep freed memory in the process (glibc): large tensors otherwise cost page faults on every allocation."""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit systems


def keep_freed_memory() -> bool:
    """Tell glibc's ``malloc`` to keep freed blocks of up to 32 MiB instead of returning them to the OS.

    PyTorch's CPU allocator asks ``malloc`` for every tensor. By default, blocks above glibc's
    mmap threshold are mapped and unmapped each time and the heap is trimmed whenever its free
    top exceeds the trim threshold, so a loop that allocates the same few-MiB tensors again and
    again (a training step, an ODE solve) pays page faults on every one of them (measurements:
    ``docs/particles.md``, "Memory on CPU"). This is the same effect as the environment variables
    ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (or preloading jemalloc or tcmalloc,
    as PyTorch's CPU performance guide suggests), applied from inside a running process. It changes
    no result, only where freed memory goes, and it is opt-in: the library never calls it; the
    examples and benchmarks do.

    Returns:
        ``True`` when both settings were accepted (glibc), ``False`` elsewhere (musl, macOS, Windows).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
