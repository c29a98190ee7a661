"""The public registry of builders: the model classes that :func:`flows.save_model` writes and ``load_model`` rebuilds.

A builder is a model class (a :class:`~flows.flow.Flow` subclass such as ``RealNVP``, or a model
module that records its constructor arguments, such as
:class:`~flows.architectures.dependent.DependentFlow`) whose constructor arguments rebuild it; a
model file stores the builder's name and those arguments, never code. The library's builders
register themselves where they are defined, with the :func:`register` decorator::

    @register
    class RealNVP(Flow): ...

so a builder in a wing above this one (:class:`~flows.particles.EquivariantCNF` in
``particles/``) is registered without this module importing upwards. :data:`LIBRARY_MODULES` names
the modules that define the library's builders; :func:`builders` and :func:`get` import them on
first use, so the registry is complete whatever the program imported.

**Names** are the builders' paper names (``"RealNVP"``, ``"NAF"``, ``"TarFlow"``), unique ignoring
case: :func:`get` accepts any spelling (``"realnvp"``) and :func:`builders` returns the registered
one. Registering a second class under a name that differs only in case from a registered one is
refused, so a lookup can never be ambiguous.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar, overload

from torch import nn

__all__ = ["LIBRARY_MODULES", "builders", "get", "name_of", "register"]

T = TypeVar("T", bound=type)

#: The modules that define the library's builders (each registers its own with :func:`register`).
LIBRARY_MODULES = (
    "flows.architectures.autoregressive",
    "flows.architectures.circular",
    "flows.architectures.continuous",
    "flows.architectures.coupling",
    "flows.architectures.dependent",
    "flows.architectures.glow",
    "flows.architectures.injective",
    "flows.architectures.monotone",
    "flows.architectures.residual",
    "flows.architectures.transformer",
    "flows.particles.builders",
)

_REGISTRY: dict[str, type] = {}
_MISSING: Any = object()


def _add(name: str, cls: Any) -> None:
    if not isinstance(name, str) or not name or not name.isidentifier():
        raise ValueError(f"register: expected a builder name that is a Python identifier, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(
            f"register: expected a model class (a flows.Flow subclass or an nn.Module that records its constructor "
            f"arguments), got {cls!r}"
        )
    for known, other in _REGISTRY.items():
        same_name = known.casefold() == name.casefold()
        reloaded = (other.__module__, other.__qualname__) == (cls.__module__, cls.__qualname__)
        if same_name and known == name and (other is cls or reloaded):
            break  # the same class again, or its module reloaded: the newest definition stands
        if same_name:
            raise ValueError(
                f"register: expected a builder name unused ignoring case, got {name!r} for {cls.__qualname__}, "
                f"but {known!r} names {other.__module__}.{other.__qualname__}"
            )
    _REGISTRY[name] = cls


@overload
def register(cls_or_name: T, cls: None = None) -> T: ...
@overload
def register(cls_or_name: str, cls: None = None) -> Callable[[T], T]: ...
@overload
def register(cls_or_name: str, cls: T) -> T: ...


def register(cls_or_name: Any, cls: Any = None) -> Any:
    """Add a builder to the registry, under its class name or a given name; usable as a decorator.

    Forms: ``@register`` (under ``cls.__name__``), ``@register("name")``, ``register(cls)`` and
    ``register("name", cls)``. The class is returned unchanged. A :class:`~flows.flow.Flow`
    subclass records its constructor arguments by itself; another ``nn.Module`` must set
    ``self._arguments = (args, kwargs)`` in its constructor for :func:`flows.save_model` to write it.

    Raises:
        ValueError: for a name that is not an identifier, or that differs only in case from the
            name of another registered class.
        TypeError: for something that is not an ``nn.Module`` class.

    Example:
        >>> from flows import RealNVP
        >>> @register("TinyRealNVP")
        ... class Tiny(RealNVP):
        ...     def __init__(self, features, context=0, **options):
        ...         super().__init__(features, context, transforms=1, hidden=(4,))
        >>> get("tinyrealnvp") is Tiny
        True
    """
    if isinstance(cls_or_name, str):
        if cls is None:

            def decorate(klass: T) -> T:
                _add(cls_or_name, klass)
                return klass

            return decorate
        _add(cls_or_name, cls)
        return cls
    if cls is not None:
        raise TypeError(f"register: expected register(cls) or register(name, cls), got a name {cls_or_name!r}")
    _add(getattr(cls_or_name, "__name__", repr(cls_or_name)), cls_or_name)
    return cls_or_name


def _load_library() -> None:
    for module in LIBRARY_MODULES:
        importlib.import_module(module)


def builders() -> dict[str, type]:
    """Every registered builder, name -> class, sorted by name (the library's and the user's).

    Example:
        >>> {"RealNVP", "TarFlow", "DependentFlow", "EquivariantCNF"} <= set(builders())
        True
    """
    _load_library()
    return dict(sorted(_REGISTRY.items()))


def get(name: str, default: Any = _MISSING) -> Any:
    """The builder registered under ``name``, in any case (``"realnvp"`` finds ``RealNVP``).

    Args:
        name: a builder name.
        default: returned for an unknown name instead of raising.

    Raises:
        ValueError: for an unknown name (without ``default``), listing the known names.

    Example:
        >>> get("nsf").__name__
        'NSF'
    """
    _load_library()
    if isinstance(name, str):
        if name in _REGISTRY:
            return _REGISTRY[name]
        found = [cls for known, cls in _REGISTRY.items() if known.casefold() == name.casefold()]
        if found:
            return found[0]
    if default is not _MISSING:
        return default
    raise ValueError(f"expected a builder among {sorted(_REGISTRY)} (any case), got {name!r}")


def name_of(cls: type) -> str | None:
    """The name ``cls`` is registered under (``None`` when it is not registered; a subclass is not its parent)."""
    _load_library()
    return next((name for name, known in _REGISTRY.items() if known is cls), None)
