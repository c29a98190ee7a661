"""The table from ``flows`` command name to the function that runs it (each in its own module)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

__all__ = ["COMMANDS", "command"]

#: Command name -> ``module:function`` under :mod:`flows.cli`; modules are imported when their command runs.
COMMANDS: dict[str, str] = {
    "fit": "fit:fit",
    "eval": "evaluate:eval",
    "sample": "sample:sample",
    "check": "check:check",
    "models": "models:models",
    "data": "data:data",
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function behind ``flows <name>`` (it takes the parsed arguments and returns the exit status)."""
    module, function = COMMANDS[name].split(":")
    return getattr(importlib.import_module(f"flows.cli.{module}"), function)
