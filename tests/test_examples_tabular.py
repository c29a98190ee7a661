"""The tabular family's example and benchmarks run end to end with tiny budgets (no timings asserted)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("sklearn", reason="the examples and benchmarks need scikit-learn (test extra)")


def _main(path: str):
    return run_script(str(ROOT / path), run_name="example")["main"]


def test_fit_two_moons_smoke(tmp_path: Path, capsys) -> None:
    args = ["--steps", "3", "--hidden", "8", "--threads", "1", "--out", str(tmp_path)]
    results = _main("examples/fit_two_moons.py")(args)
    assert set(results) == {"MAF", "NSF (autoregressive)", "NSF (coupling, LU)"}
    assert all(-6.0 < v < 0.0 for v in results.values())  # a few steps in: finite, far from converged
    assert (tmp_path / "densities.png").stat().st_size > 1000
    assert "test log-likelihood" in capsys.readouterr().out


def test_digits_benchmark_smoke(capsys) -> None:
    results = _main("benchmarks/digits_density.py")(
        ["--epochs", "1", "--models", "gaussian", "flows-nsf", "flows-best", "--hidden", "8", "--best-hidden", "8"]
    )
    assert set(results) == {"gaussian", "flows-nsf", "flows-best"}
    assert all(1.0 < bpd < 8.0 for bpd, _ in results.values())
    assert "test bits/dim" in capsys.readouterr().out


def test_nsf_speed_benchmark_smoke(capsys) -> None:
    sizes = ["--features", "4", "--transforms", "2", "--hidden", "8", "--batch", "16", "--samples", "8"]
    results = _main("benchmarks/nsf_speed.py")([*sizes, "--rounds", "1", "--sample-rounds", "1", "--no-zuko"])
    assert results["step_ratio"] > 0 and math.isfinite(results["step_ratio"])
    assert "training step" in capsys.readouterr().out


def test_miniboone_benchmark_smoke(capsys) -> None:
    from flows.data import data_dir

    try:
        data_dir()
    except FileNotFoundError:
        pytest.skip("FLOWS_DATA_DIR is not set (CI points it at ../shared/data)")
    results = _main("benchmarks/miniboone_small.py")(
        ["--epochs", "1", "--models", "flows-maf", "flows-nsf-c", "--transforms", "1", "--hidden", "8"]
    )
    assert all(math.isfinite(mean) for mean, _, _ in results.values())
    assert "NOT comparable" in capsys.readouterr().out
