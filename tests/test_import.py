"""Fast start: ``import flows`` and ``flows --help`` leave the heavy modules unimported until used.

Guarded by inspecting ``sys.modules`` in a fresh interpreter, not by timing: every module listed
in ``HEAVY`` costs from tens of milliseconds (tqdm.auto) to over a second (torch._dynamo) and is
only needed by the function that uses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flows

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch._dynamo",
    "torch._inductor",
    "sympy",
    "scipy",
    "scipy.integrate",
    "scipy.optimize",
    "torchdiffeq",
    "matplotlib",
    "tqdm",
    "tqdm.auto",
    "sklearn",
    "arviz",
    "tensorboard",
    "torch.utils.tensorboard",
    "sbi",  # flows.interop.sbi is imported on demand
)

# Prints the heavy modules that ``code`` imported on top of ``import torch`` (torch itself imports
# tqdm through torch.hub, so a module already present after ``import torch`` is not counted).
_PROBE = """
import json, sys
import torch
before = set(sys.modules)
{code}
heavy = {heavy!r}
print(json.dumps(sorted(m for m in heavy if m in sys.modules and m not in before)))
"""


def _new_heavy_modules(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = _PROBE.format(code=code, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_flows_imports_no_heavy_module() -> None:
    assert _new_heavy_modules("import flows") == []


SUBPACKAGES = [
    "flows.train",
    "flows.mcmc",
    "flows.metrics",
    "flows.data",
    "flows.targets",
    "flows.plot",
    "flows.train.pairs",
    "flows.nn",
    "flows.particles",
    "flows.cli",
]


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_subpackages_import_no_heavy_module(package: str) -> None:
    assert _new_heavy_modules(f"import {package}") == []


def test_flows_help_imports_no_heavy_module() -> None:
    code = (
        "from flows.cli import main\n"
        "for argv in (['--help'], ['fit', '--help'], ['sample', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    assert _new_heavy_modules(code) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The probe itself works: using a CNF's solver does import torchdiffeq."""
    code = "import torch, flows\nflows.CNF(2)(torch.zeros(1, 2))\n"
    assert "torchdiffeq" in _new_heavy_modules(code)


def test_flows_version(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == f"flows {flows.__version__} (torch {torch.__version__})"


def test_compiler_disable_keeps_a_deferred_function_out_of_the_graph() -> None:
    """``uniform_dequantize`` (decorated lazily) still runs eagerly inside a compiled function."""
    from flows.data import uniform_dequantize

    def f(v: torch.Tensor) -> torch.Tensor:
        return uniform_dequantize(v, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2

    v = torch.randint(0, 17, (5, 3))
    expected = f(v)
    compiled = torch.compile(f, backend="eager")
    torch.testing.assert_close(compiled(v), expected)
    torch.testing.assert_close(compiled(v), expected)
    assert uniform_dequantize.__name__ == "uniform_dequantize" and "levels" in uniform_dequantize.__doc__


def test_import_time_benchmark_reports_no_heavy_module(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_time", ROOT / "benchmarks" / "import_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--rounds", "1"])
    assert {name for _, name in results} == {"import flows", "flows --help"}
    assert all(r["heavy"] == [] and r["modules"] > 0 and r["wall"] > 0 for r in results.values())
    assert "heavy modules loaded" in capsys.readouterr().out
