"""The alanine-dipeptide example runs end to end on a tiny budget (numbers are not asserted beyond their ranges)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def test_boltzmann_alanine_example_smoke(tmp_path: Path, capsys) -> None:
    pytest.importorskip("openmm")
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not os.path.exists(os.path.join(directory, "aldp_vacuum_1000K_md.npz")):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    main = run_script(str(ROOT / "examples" / "boltzmann_alanine.py"), run_name="example")["main"]
    argv = ["--steps", "3", "--transforms", "2", "--hidden", "8", "--samples", "300", "--train-frames", "500"]
    result = main([*argv, "--out", str(tmp_path)])
    assert result["steps"] == 3 and result["n"] == 300
    assert 0 < result["ess"] <= 1 and math.isfinite(result["test_nll"])
    assert 0 <= result["p_b_raw"] <= 1 and result["kl_phi_raw"] >= 0
    assert (tmp_path / "ramachandran.png").stat().st_size > 1000
    assert "Kish ESS" in capsys.readouterr().out


def test_alanine_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("openmm")
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not os.path.exists(os.path.join(directory, "aldp_vacuum_1000K_md.npz")):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    main = run_script(str(ROOT / "benchmarks" / "alanine.py"))["main"]
    argv = ["--max-steps", "2", "--transforms", "2", "--hidden", "8", "--samples", "300", "--train-frames", "300"]
    ml, tuned = main([*argv, "--ft-batch", "16", "--energy-cut", "1000", "--out", str(tmp_path)])
    assert ml["stage"] == "ml" and tuned["stage"] == "finetuned" and tuned["steps"] == 2
    assert 0 < tuned["ess"] <= 1 and math.isfinite(tuned["test_nll"]) and tuned["kl_rama_raw"] >= 0
    assert not tuned["delta_f_agrees"] or tuned["ess_abs_times_p_b"] >= 100
    assert (tmp_path / "ramachandran_1000K_finetuned.png").stat().st_size > 1000
