"""The trainer's ``compile`` option: the objective's call under :func:`torch.compile`, eager if the compiler fails."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from flows._validation import NON_FINITE_MESSAGE
from flows.train.guard import TrainingWarning

__all__ = ["CompiledForward", "CompilerRejected", "compile_options"]


class CompilerRejected(Exception):
    """The compiler gave up on the model: the caller runs the same step again, eagerly."""


def compile_options(options: bool | dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :func:`torch.compile` for the trainer's ``compile`` option (``True``: defaults).

    Raises:
        TypeError: for anything but a bool or a dict.
    """
    if options is True:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"Trainer: expected compile to be a bool or a dict of torch.compile arguments, got {options!r}")
    options = dict(options)
    if options.get("backend", "inductor") == "inductor" and "mode" not in options:
        # Inductor's own CPU random numbers are several times slower than the eager generator here
        # and would not follow torch.manual_seed; fall back to the eager draws.
        options["options"] = {"fallback_random": True, **options.get("options", {})}
    return options


class CompiledForward:
    """``forward(batch)`` under :func:`torch.compile`, and ``forward`` itself from the compiler's first failure on.

    A compiled run's input-check failure (an assertion inside the graph) is re-raised after an
    eager run has raised the usual ``ValueError``, which names the count and location. When the
    compiler rejects the model, a :class:`TrainingWarning` says so, the random generator goes back
    to its state before the attempt (which may have drawn numbers) and :class:`CompilerRejected`
    asks the caller to run the step again: its auxiliary losses must be collected afresh.

    Args:
        forward: the eager call, ``batch -> objective output``.
        options: the trainer's ``compile`` option (see :func:`compile_options`).
    """

    def __init__(self, forward: Callable[[object], Any], options: bool | dict[str, Any]) -> None:
        self.eager = forward
        self.compiled = torch.compile(forward, **compile_options(options))
        self.rejected = False

    def __call__(self, batch: object) -> Any:
        if self.rejected:
            return self.eager(batch)
        rng = torch.random.get_rng_state()
        try:
            return self.compiled(batch)
        except RuntimeError as error:
            if NON_FINITE_MESSAGE in str(error):
                self.eager(batch)  # raises the eager check's ValueError (count and location)
                raise
            if not isinstance(error, torch._dynamo.exc.TorchDynamoException):
                raise
            first = (str(error).strip().splitlines() or [""])[0][:300]
            warnings.warn(
                f"Trainer: torch.compile could not compile this model ({type(error).__name__}: {first}); "
                "training continues without compilation",
                TrainingWarning,
                stacklevel=5,
            )
            self.rejected = True
            torch.random.set_rng_state(rng)
            raise CompilerRejected from error
