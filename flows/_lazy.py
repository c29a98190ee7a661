"""Deferred imports that keep ``import flows`` fast (see ``tests/test_import.py``).

Heavy modules (``torch._dynamo``, ``scipy``, ``torchdiffeq``, ``matplotlib``, ``tqdm``) are imported
where they are first used, never at module level. :func:`compiler_disable` is the one decorator
that needs help: :func:`torch.compiler.disable` imports ``torch._dynamo`` when it decorates, so it is
applied at the first call instead (measurements: ``docs/ecosystem.md``, "Import time").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["compiler_disable"]

F = TypeVar("F", bound=Callable[..., Any])


def compiler_disable(fn: F) -> F:
    """``torch.compiler.disable(fn)``, applied on the first call rather than at import time.

    A compiled graph that reaches the returned function breaks there and runs ``fn`` eagerly, as with
    :func:`torch.compiler.disable`; the cost of importing ``torch._dynamo`` is paid only by programs
    that call ``fn``.

    Args:
        fn: the function to keep out of compiled graphs.

    Returns:
        A function with ``fn``'s signature and docstring.
    """
    disabled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
