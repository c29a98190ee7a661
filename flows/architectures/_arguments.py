"""The one argument checker of the paper-named builders: "expected ..., got ..." errors before any layer is built.

Every builder takes the same names for the same things (see ``docs/guide/concepts.md``):

* ``features``: the data dimension ``D`` (an int; Glow's first argument is its image shape ``(C, H, W)``);
* ``context``: the context width, 0 for an unconditional flow;
* ``transforms``: the number of layers (Glow counts ``levels`` and ``steps`` per level instead);
* ``hidden``: the hidden widths of each conditioner network, a sequence of ints, one per hidden
  layer (a bare int is refused);
* ``activation``: a zero-argument callable returning the nonlinearity module (``nn.ReLU``, not ``nn.ReLU()``);
* ``standardize``: data or a fitted :class:`~flows.bijections.Standardize` layer (checked by
  :class:`~flows.flow.Flow`, which builds the layer).

A wrong value of ``features``, ``context`` or a count raises a ``ValueError`` (whatever its type, as
the builders always did); a ``hidden`` that is not a sequence or an ``activation`` that is not a
factory raises a ``TypeError``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

__all__ = [
    "check_activation",
    "check_builder",
    "check_choice",
    "check_context",
    "check_count",
    "check_features",
    "check_hidden",
    "check_nonnegative",
]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(who: str, name: str, value: Any, *, minimum: int = 1, why: str = "") -> int:
    """``value`` as an int ``>= minimum`` (a number of layers, levels, steps, ...).

    Raises:
        ValueError: naming ``who``, ``name``, the bound (and ``why``) and the value that came.

    Example:
        >>> check_count("MAF", "transforms", 0)
        Traceback (most recent call last):
        ...
        ValueError: MAF: expected transforms to be an int >= 1, got 0
    """
    if not _is_int(value) or value < minimum:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{who}: expected {name} to be an int >= {minimum}{reason}, got {value!r}")
    return int(value)


def check_features(who: str, features: Any, *, minimum: int = 1, why: str = "") -> int:
    """The data dimension: an int ``>= minimum`` (``why`` says what needs more than 1)."""
    return check_count(who, "features", features, minimum=minimum, why=why)


def check_context(who: str, context: Any) -> int:
    """The context width: an int ``>= 0`` (0 for an unconditional flow)."""
    return check_count(who, "context", context, minimum=0)


def check_hidden(who: str, hidden: Any, *, minimum_layers: int = 0) -> tuple[int, ...]:
    """Hidden widths: a sequence of positive ints, at least ``minimum_layers`` of them, as a tuple.

    Args:
        who: the builder, named in messages.
        hidden: the value to check.
        minimum_layers: fewest hidden layers the builder's conditioner can take.

    Raises:
        TypeError: for an int, a string or any other non-sequence.
        ValueError: for a width that is not a positive int, or too few layers.

    Example:
        >>> check_hidden("RealNVP", [64, 64])
        (64, 64)
        >>> check_hidden("RealNVP", 64)
        Traceback (most recent call last):
        ...
        TypeError: RealNVP: expected hidden to be a sequence of layer widths such as (64, 64), got 64
    """
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise TypeError(f"{who}: expected hidden to be a sequence of layer widths such as (64, 64), got {hidden!r}")
    if not all(_is_int(h) and h >= 1 for h in hidden) or len(hidden) < minimum_layers:
        layers = (
            f" (at least {minimum_layers} hidden layer{'s' if minimum_layers > 1 else ''})" if minimum_layers else ""
        )
        raise ValueError(f"{who}: expected hidden to be positive int widths{layers}, got {tuple(hidden)!r}")
    return tuple(int(h) for h in hidden)


def check_activation(who: str, activation: Any) -> Callable[[], nn.Module]:
    """The nonlinearity: a zero-argument callable returning a module (a class such as ``nn.ReLU``).

    Raises:
        TypeError: for a module instance (``nn.ReLU()``), a class that is not a module, or a non-callable.
    """
    if isinstance(activation, nn.Module):
        raise TypeError(
            f"{who}: expected activation to be a module class or factory such as nn.ReLU, got the instance "
            f"{activation!r} (drop the parentheses)"
        )
    if not callable(activation) or (isinstance(activation, type) and not issubclass(activation, nn.Module)):
        raise TypeError(
            f"{who}: expected activation to be a module class or factory such as nn.ReLU, got {activation!r}"
        )
    return activation


def check_choice(who: str, name: str, value: Any, choices: Sequence[str]) -> str:
    """One of a few named options.

    Raises:
        ValueError: listing the choices.
    """
    if value not in choices:
        raise ValueError(f"{who}: expected {name} in {list(choices)}, got {value!r}")
    return value


def check_nonnegative(who: str, name: str, value: Any) -> float:
    """A finite number ``>= 0`` (a loss weight, a noise level), as a float.

    Raises:
        ValueError: for anything else.
    """
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < float("inf")):
        raise ValueError(f"{who}: expected {name} to be a finite number >= 0, got {value!r}")
    return float(value)


_NOT_TAKEN: Any = object()


def check_builder(
    who: str,
    features: Any,
    context: Any,
    *,
    transforms: Any = _NOT_TAKEN,
    hidden: Any = _NOT_TAKEN,
    activation: Any = _NOT_TAKEN,
    minimum_features: int = 1,
    why: str = "",
    minimum_layers: int = 0,
) -> None:
    """The shared arguments of a vector builder, checked in signature order (left out: not taken).

    Args:
        who: the builder, named in messages.
        features: data dimension.
        context: context width.
        transforms: number of layers.
        hidden: hidden widths of the conditioners.
        activation: nonlinearity factory.
        minimum_features: smallest data dimension the builder can model.
        why: why it needs that many (in the message).
        minimum_layers: fewest hidden layers the conditioners take.

    Raises:
        ValueError, TypeError: from the checks above, for the first bad argument.

    Example:
        >>> check_builder("RealNVP", 1, 0, transforms=4, minimum_features=2, why="couplings need two parts")
        Traceback (most recent call last):
        ...
        ValueError: RealNVP: expected features to be an int >= 2 (couplings need two parts), got 1
    """
    check_features(who, features, minimum=minimum_features, why=why)
    check_context(who, context)
    if transforms is not _NOT_TAKEN:
        check_count(who, "transforms", transforms)
    if hidden is not _NOT_TAKEN:
        check_hidden(who, hidden, minimum_layers=minimum_layers)
    if activation is not _NOT_TAKEN:
        check_activation(who, activation)
