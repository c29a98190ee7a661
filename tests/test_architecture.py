"""The layout of ``docs/architecture.md``: every wing imports only from the wings below it.

The import direction is read from the source (every ``import``, including the ones deferred into
functions), so an upward arrow is caught even where it would not create a cycle at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flows"

#: Wing -> layer: a module may import from its own wing and from wings of a lower layer only.
LAYERS: dict[str, int] = {
    # 0: cross-cutting helpers, below everything
    "_validation": 0,
    "_functorch": 0,
    "_energy": 0,
    "_lazy": 0,
    "_malloc": 0,
    "_kernels": 0,
    "_adoption": 0,
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
    # 7: adapters to other libraries (Pyro, sbi), each imported lazily; nothing in flows imports them
    "interop": 7,
    # 8: the command
    "cli": 8,
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
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


def _top_level() -> set[str]:
    """The modules and packages directly under ``flows/`` (``flow.py`` -> ``flow``), the package's own file aside."""
    names = {path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    return names | {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}


def test_the_top_level_holds_only_the_wings_of_the_layout() -> None:
    """Every top-level module is a wing of ``LAYERS`` and every wing exists: no alias module can come back silently.

    A module at an old path that only re-exports a moved one would have to be added to ``LAYERS``
    (and so to ``docs/architecture.md``) by hand; a wing that was deleted leaves no stale entry.
    """
    found = _top_level()
    assert found - set(LAYERS) == set(), (
        f"flows/ holds modules that are not wings of the layout: {sorted(found - set(LAYERS))}"
    )
    assert set(LAYERS) - found == set(), f"LAYERS names wings that flows/ does not hold: {sorted(set(LAYERS) - found)}"


#: Names whose use in the library means a deprecation shim: nothing has been released, so nothing old is kept.
_SHIM_NAMES = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}


def _shim_uses(path: Path) -> list[str]:
    """Where a file names a deprecation warning class or rewrites ``sys.modules`` (how an alias module works)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in _SHIM_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == "sys.modules"
        ):
            found.append(f"line {node.lineno}: sys.modules")
    return sorted(found, key=lambda use: int(use.split()[1].rstrip(":")))


def test_no_module_keeps_a_deprecated_name() -> None:
    offenders = {str(path.relative_to(PACKAGE.parent)): uses for _, path in _modules() if (uses := _shim_uses(path))}
    assert offenders == {}


def test_the_shim_checker_sees_an_alias_module(tmp_path: Path) -> None:
    """The shim test is not vacuous: the two forms the old deprecation layer used are reported."""
    alias = tmp_path / "alias.py"
    alias.write_text(
        "import sys\nimport warnings\n\nimport flows.train.pairs\n\n"
        "warnings.warn('moved', DeprecationWarning)\nsys.modules[__name__] = flows.train.pairs\n"
    )
    assert _shim_uses(alias) == ["line 6: DeprecationWarning", "line 7: sys.modules"]
