"""The layout of ``docs/architecture.md``: every wing imports only from the wings below it.

The import direction is read from the source (every ``import``, including the ones deferred into
functions), so an upward arrow is caught even where it would not create a cycle at run time.
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

from flows._deprecation import MOVED_MODULES

PACKAGE = Path(__file__).resolve().parents[1] / "flows"

#: Wing -> layer: a module may import from its own wing and from wings of a lower layer only.
LAYERS: dict[str, int] = {
    # 0: cross-cutting helpers, below everything
    "_validation": 0,
    "_functorch": 0,
    "_energy": 0,
    "_lazy": 0,
    "_malloc": 0,
    "_deprecation": 0,
    # 1: networks and base distributions
    "nn": 1,
    "distributions": 1,
    # 2: the transform contract and every layer
    "bijections": 2,
    # 3: the flow (base + transform), the checker, data
    "flow": 3,
    "testing": 3,
    "data": 3,
    # 4: builders and energies
    "architectures": 4,
    "targets": 4,
    # 5: estimators on flows and targets
    "metrics": 5,
    "mcmc": 5,
    "classify": 5,
    # 6: training and pictures
    "train": 6,
    "plot": 6,
    # 7: particle Boltzmann generators (couplings for flow matching, evaluation); model files
    "particles": 7,
    "model_file": 7,
    "interop": 7,  # adapters to other libraries (sbi): read builders by name from train/config.py
    # 8: the command
    "cli": 8,
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in MOVED_MODULES:  # the old paths are aliases: they import only flows._deprecation
            found.append((name, path))
    return found


def _wing(module: str) -> str | None:
    """``flows.bijections.coupling`` -> ``bijections``; ``flows`` (the package itself) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute ``flows.*`` module a file imports, with the line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "flows":
            # `from flows import x`: x is a wing, or a name of the package (its version is allowed anywhere)
            found += [(node.lineno, f"flows.{alias.name}") for alias in node.names if alias.name != "__version__"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "flows" or name.startswith("flows.")]


def test_every_wing_has_a_layer() -> None:
    wings = {_wing(name) for name, _ in _modules()} - {None}
    assert wings <= set(LAYERS), f"wings without a layer in docs/architecture.md: {sorted(wings - set(LAYERS))}"


@pytest.mark.parametrize("name,path", _modules(), ids=[name for name, _ in _modules()])
def test_imports_point_down(name: str, path: Path) -> None:
    wing = _wing(name)
    if wing is None:  # flows/__init__.py re-exports from every wing
        return
    upward = []
    for line, imported in _imports(path):
        other = _wing(imported)
        if other is None or other == wing:
            upward += [] if other == wing else [f"line {line}: {imported} (the top-level package)"]
            continue
        if other not in LAYERS or LAYERS[other] >= LAYERS[wing]:
            upward.append(f"line {line}: {imported} ({other}, layer {LAYERS.get(other)} >= {wing}'s {LAYERS[wing]})")
    assert not upward, f"{path.relative_to(PACKAGE.parent)} imports upward: " + "; ".join(upward)


def test_bijections_import_no_target_trainer_sampler_or_command() -> None:
    """The rule the redesign issue states in words, checked on its own."""
    forbidden = ("flows.targets", "flows.train", "flows.mcmc", "flows.cli")
    offenders = [
        f"{path.name}:{line} {imported}"
        for name, path in _modules()
        if name.startswith("flows.bijections")
        for line, imported in _imports(path)
        if imported.startswith(forbidden)
    ]
    assert offenders == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The direction test is not vacuous: a layer importing a target is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\ndef f():\n    from flows.targets.base import EnergyTarget\n")
    assert _imports(bad) == [(4, "flows.targets.base")]
    assert LAYERS["targets"] >= LAYERS["bijections"]


@pytest.mark.parametrize("old,new", sorted(MOVED_MODULES.items()))
def test_old_import_paths_warn_and_alias_the_new_module(old: str, new: str) -> None:
    sys.modules.pop(old, None)  # the new module stays: importing it twice would make a second copy of its classes
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]


def test_old_names_keep_working() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sys.modules.pop("flows.pairs", None)
        from flows.pairs import ot_assignment
        from flows.sharing import StepConditioner
    from flows.nn import StepConditioner as new_conditioner
    from flows.train.pairs import ot_assignment as new_assignment

    assert ot_assignment is new_assignment and StepConditioner is new_conditioner
