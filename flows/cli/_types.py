"""The value types of the ``flows`` options: each parses one string or fails with a one-line "expected ..., got ..."."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from flows._validation import SEED_MAX

__all__: list[str] = []

_MAX_SEED = SEED_MAX
_MAX_LAYERS = 1000
_MAX_WIDTH = 1 << 16
_MAX_DRAWS = 10_000


def _integer(low: int, high: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, else a one-line "expected ..., got ..." error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    parse.number = int  # what it parses, for the robustness table's number attacks
    return parse


def _real(
    low: float | None = None,
    *,
    strict: bool = False,
    high: float | None = None,
    open_high: bool = False,
    allow_inf: bool = False,
) -> Callable[[str], float]:
    """An argparse type: a finite number (``+inf`` too with ``allow_inf``) above ``low`` and below ``high``.

    ``strict`` excludes ``low`` itself, ``open_high`` excludes ``high``; NaN is always refused.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = low is not None and (value <= low if strict else value < low)
        too_high = high is not None and (value >= high if open_high else value > high)
        bad = math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0))
        if bad or too_low or too_high:
            parts = []
            if low is not None:
                parts.append(f"{'>' if strict else '>='} {low:g}")
            if high is not None:
                parts.append(f"{'<' if open_high else '<='} {high:g}")
            kind = "a number" if allow_inf else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {kind} {' and '.join(parts)}, got {text}")
        return value

    parse.__name__ = "number"
    parse.number = float
    return parse


def _hidden(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 128,128, got {text!r}") from error
    if not widths or min(widths) <= 0 or max(widths) > _MAX_WIDTH:
        raise argparse.ArgumentTypeError(
            f"expected positive widths of at most {_MAX_WIDTH} such as 128,128, got {text!r}"
        )
    return widths


def _option(text: str) -> tuple[str, object]:
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE as JSON, e.g. clamp=2.0), got {text!r}")
    key, value = text.split("=", 1)
    key = key.strip()
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
