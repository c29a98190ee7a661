"""Old import paths that keep working for one release, with a :class:`DeprecationWarning`.

A module that moved leaves a file at its old path that calls :func:`moved_module`: the old name then
*is* the new module (``sys.modules`` points both names at one object), so every public and private
name, ``isinstance`` check and pickled reference keeps working, and the warning names the new path.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED_MODULES", "moved_module"]

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
