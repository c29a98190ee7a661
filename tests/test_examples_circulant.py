"""The circulant family's example and benchmarks run end to end with tiny budgets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def _main(path: str):
    return run_script(str(ROOT / path), run_name="example")["main"]


def test_periodic_signals_smoke(tmp_path: Path, capsys) -> None:
    args = ["--n", "16", "--train-size", "64", "--val-size", "64", "--test-size", "256", "--steps", "20"]
    args += ["--eval-every", "10", "--transforms", "2", "--hidden", "8", "--threads", "1", "--out", str(tmp_path)]
    results = _main("examples/periodic_signals.py")(args)
    assert set(results) >= {"gaussian-mle-full", "gaussian-mle-circulant", "cd-gaussian", "coupling-cd"}
    assert all(math.isfinite(v) for v in results.values())
    # with 64 signals of 16 sites, the shift-invariant Gaussian MLE generalises better than the full one
    assert results["gaussian-mle-circulant"] < results["gaussian-mle-full"]
    assert (tmp_path / "samples.png").stat().st_size > 1000
    assert "test NLL/site" in capsys.readouterr().out


def test_linear_layers_benchmark_smoke(capsys) -> None:
    results = _main("benchmarks/linear_layers.py")(
        ["--sizes", "8", "--budget", "0", "--images", "--channels", "4", "--image-shape", "1", "2", "2"]
    )
    assert results[8]["rounds"] == 3 and results[-4]["rounds"] == 3
    assert results[8][("CD m=3", "ladj")] > 0 and results[8][("min", "dense", "inv+ladj")] > 0
    assert "faster than dense" in capsys.readouterr().out


def test_circulant_ablation_smoke(capsys) -> None:
    pytest.importorskip("sklearn", reason="the digits ablation needs scikit-learn (test extra)")
    results = _main("benchmarks/circulant_ablation.py")(
        ["--epochs", "1", "--seeds", "1", "--transforms", "2", "--hidden", "8", "--mixers", "none", "cd2"]
    )
    assert set(results) == {"none", "cd2"}
    assert all(0.5 < r["bpd"] < 10.0 for r in results.values())  # one epoch: finite, sane
    assert results["cd2"]["params"] == results["none"]["params"] + (2 * 2 - 1) * 64 + 64  # one CD layer
    assert "time ratio" in capsys.readouterr().out
