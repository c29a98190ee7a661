"""The Boltzmann examples and benchmark run end to end with tiny budgets (numbers are not asserted)."""

from __future__ import annotations

import math
from pathlib import Path

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def _main(folder: str, name: str):
    return run_script(str(ROOT / folder / name), run_name="example")["main"]


def test_double_well_example_smoke(tmp_path: Path, capsys) -> None:
    argv = ["--steps", "3", "--transforms", "2", "--hidden", "8", "--mc-steps", "2", "--samples", "2000"]
    results = _main("examples", "boltzmann_double_well.py")([*argv, "--out", str(tmp_path)])
    assert set(results) == {"RealNVP", "RealNVP + final MC (SNF)"}
    for r in results.values():
        assert 0 < r["ess"] <= 1 and math.isfinite(r["log_z_error"])
    assert (tmp_path / "profiles.png").stat().st_size > 1000
    assert "log Z error" in capsys.readouterr().out


def test_many_well_example_smoke(capsys) -> None:
    for method in ("anneal", "forward", "reverse"):
        argv = ["--dim", "4", "--method", method, "--steps", "3", "--transforms", "2", "--hidden", "8"]
        result = _main("examples", "boltzmann_many_well.py")([*argv, "--samples", "1000", "--threads", "1"])
        assert result["steps"] == 3 and 0 < result["ess"] <= 1 and result["modes_covered"] > 0
    assert "many-well d=4" in capsys.readouterr().out


def test_boltzmann_benchmark_smoke(capsys) -> None:
    argv = ["--steps", "2", "--transforms", "2", "--hidden", "8", "--mc-steps", "2", "--samples", "1000"]
    argv += ["--mw-dims", "4", "--mw-budget", "8", "--mw-threads", "1"]
    results = _main("benchmarks", "boltzmann.py")(argv)
    assert {"flows RealNVP", "flows SNF, final", "flows SNF, interleaved"} <= set(results["double_well"])
    assert set(results["many_well"]) == {4}
    out = capsys.readouterr().out
    assert "double well" in out and "many-well" in out
