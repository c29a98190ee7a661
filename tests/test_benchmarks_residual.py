"""benchmarks/residual.py runs end to end at a toy budget (its numbers are not asserted: speed is not a test)."""

from __future__ import annotations

import runpy
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_residual_benchmark_smoke(capsys) -> None:
    main = runpy.run_path(str(BENCHMARKS / "residual.py"), run_name="benchmark")["main"]
    results = main(["--budget", "0.05", "--chunk", "1", "--ladj-rounds", "1", "--contenders", "flows"])
    assert results["flows"]["steps"] >= 1 and results["flows"]["nll"] == results["flows"]["nll"]
    assert "test NLL" in capsys.readouterr().out
