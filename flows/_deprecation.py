"""Deprecations: old keyword and module names keep working for one release, with a :class:`DeprecationWarning`.

Renamed keywords go through :func:`renamed_keywords` (and :func:`deprecated_alias` for attributes).
A module that moved leaves a file at its old path that calls :func:`moved_module`: the old name then
*is* the new module (``sys.modules`` points both names at one object), so every public and private
name, ``isinstance`` check and pickled reference keeps working, and the warning names the new path.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

__all__ = [
    "MOVED_MODULES",
    "deprecated_alias",
    "moved_module",
    "record_argument",
    "renamed_keywords",
    "warn_deprecated",
]

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

        wrapper.renamed_keywords = dict(renames)  # type: ignore[attr-defined]  (read by `flows fit --option`)
        return wrapper  # type: ignore[return-value]

    return decorate


def deprecated_alias(old: str, new: str) -> property:
    """A read-only property for the old attribute name ``old`` that warns and returns ``self.<new>``."""

    def get(self: object) -> Any:
        warn_deprecated(f"{type(self).__name__}.{old} is deprecated, use .{new}")
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}`.")


#: Old module path -> new module path, for every module the 0.2 layout moved (``docs/architecture.md``).
MOVED_MODULES: dict[str, str] = {
    "flows.pairs": "flows.train.pairs",
    "flows.sharing": "flows.nn.sharing",
    "flows.dependent": "flows.architectures.dependent",
    "flows.auxiliary": "flows.bijections.auxiliary",
    "flows._cli_commands": "flows.cli.commands",
    "flows.particles.egnn": "flows.nn.egnn",
}


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery and this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_globals.get("__name__") in MOVED_MODULES
        or frame.f_globals.get("__name__") == __name__
    ):
        frame, level = frame.f_back, level + 1
    return level


def moved_module(old: str) -> ModuleType:
    """Point the module name ``old`` at its new module and warn that the old path is deprecated.

    Args:
        old: the old module path, a key of :data:`MOVED_MODULES`; call as ``moved_module(__name__)``
            from the file left at the old path.

    Returns:
        The new module (also installed as ``sys.modules[old]``).
    """
    new = MOVED_MODULES[old]
    warnings.warn(
        f"{old} moved to {new}; the old import path is deprecated and will be removed in the next release",
        DeprecationWarning,
        stacklevel=_caller_stacklevel(),
    )
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module
