"""Renamed keywords: the old name keeps working for one release, with a :class:`DeprecationWarning`."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated_alias", "record_argument", "renamed_keywords", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def warn_deprecated(message: str, stacklevel: int = 3) -> None:
    """Emit ``message`` as a :class:`DeprecationWarning` pointing at the caller's caller."""
    warnings.warn(f"{message} (the old form goes in the next release)", DeprecationWarning, stacklevel=stacklevel)


def record_argument(obj: object, name: str, value: Any) -> None:
    """Rewrite a constructor argument that a :class:`~flows.flow.Flow` recorded for its model file.

    A flow records the arguments it was called with (``obj._arguments``) so that
    :func:`flows.save_model` can write its config; a builder that translated a deprecated spelling
    records the new one, so the saved config rebuilds the model without the old spelling.
    """
    recorded = getattr(obj, "_arguments", None)
    if recorded is not None and name in recorded[1]:
        recorded[1][name] = value


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Decorate ``__init__`` (or a function) so that old keyword names map to new ones with a warning.

    ``renamed_keywords(n_leapfrog="leapfrog_steps")``: a call with ``n_leapfrog=3`` warns and runs as
    ``leapfrog_steps=3``; a call with both names raises a ``TypeError``. The signature seen by
    :func:`inspect.signature` stays the new one (``functools.wraps``), and a flow's recorded
    arguments (see :func:`record_argument`) carry the new name.

    Example:
        >>> import warnings
        >>> class Kernel:
        ...     @renamed_keywords(n_leapfrog="leapfrog_steps")
        ...     def __init__(self, leapfrog_steps: int = 10) -> None:
        ...         self.leapfrog_steps = leapfrog_steps
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     Kernel(n_leapfrog=3).leapfrog_steps, caught[0].category.__name__
        (3, 'DeprecationWarning')
    """

    def decorate(fn: F) -> F:
        owner = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{owner}: got both {old}= (the old name) and {new}=; pass {new}= only")
                warn_deprecated(f"{owner}: {old}= is deprecated, use {new}=")
                kwargs[new] = kwargs.pop(old)
                if args:
                    recorded = getattr(args[0], "_arguments", None)
                    if recorded is not None and old in recorded[1]:
                        recorded[1][new] = recorded[1].pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def deprecated_alias(old: str, new: str) -> property:
    """A read-only property for the old attribute name ``old`` that warns and returns ``self.<new>``."""

    def get(self: object) -> Any:
        warn_deprecated(f"{type(self).__name__}.{old} is deprecated, use .{new}")
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}`.")
