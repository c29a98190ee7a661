"""benchmarks/monotone.py runs end to end at a toy budget (its numbers are not asserted: speed is not a test)."""

from __future__ import annotations

import runpy
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_monotone_benchmark_smoke(capsys) -> None:
    main = runpy.run_path(str(BENCHMARKS / "monotone.py"), run_name="benchmark")["main"]
    argv = ["--budget", "0.05", "--turn", "0.01", "--samples", "5", "--repeats", "1", "--data", "moons", "digits"]
    every = main([*argv, "--contenders", "flows-naf", "flows-bpf"])
    assert set(every) == {"moons", "digits"}
    for results in every.values():
        assert set(results) == {"flows-naf", "flows-bpf"}
        assert all(r["steps"] >= 1 and r["nll"] == r["nll"] and r["candidate"] in r["val"] for r in results.values())
    assert "test NLL" in capsys.readouterr().out
