"""benchmarks/sbi_npe.py end to end at a toy size (its numbers are not asserted: speed is not a test)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("sbi", reason="the optional dependency sbi (pip install 'flows[sbi]') is not installed")


def test_sbi_benchmark_smoke(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sbi_npe.py"
    main = runpy.run_path(str(path), run_name="benchmark")["main"]
    argv = ["--seeds", "1", "--simulations", "200", "--epochs", "1", "--observations", "1", "--kl-samples", "100"]
    results = main([*argv, "--models", "flows MAF", "sbi maf (nflows)", "--tasks", "linear"])
    row = results["linear Gaussian"]["flows MAF"]
    assert row["cpu_s"] > 0 and row["kl"] == row["kl"]  # finite numbers, not NaN
    assert "| flows MAF" in capsys.readouterr().out
    assert not (tmp_path / "sbi-logs").exists()
