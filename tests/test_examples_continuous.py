"""The continuous-flow examples and benchmark run end to end with tiny budgets (numbers not asserted as speed)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("sklearn", reason="the toy and table examples need scikit-learn (test extra)")


def _main(path: Path):
    return run_script(str(path), run_name="example")["main"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # the scripts set one thread
    yield
    torch.set_num_threads(threads)


def test_cnf_toy_smoke(tmp_path: Path, capsys) -> None:
    argv = ["--epochs", "2", "--limit", "200", "--hidden", "8", "--rnode", "0.01", "--out", str(tmp_path)]
    nll = _main(ROOT / "examples" / "cnf_toy.py")(argv)
    assert 0.0 < nll < 3.0  # moons after two tiny epochs: near a Gaussian fit (about 1.5 nats in data units)
    assert (tmp_path / "density.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "test NLL" in out and "nfe" in out and "aux_rnode_kinetic" in out


def test_cnf_tabular_smoke_offline(capsys) -> None:
    nll = _main(ROOT / "examples" / "cnf_tabular.py")(["--dataset", "wine", "--epochs", "1", "--hidden", "8"])
    assert math.isfinite(nll) and nll > 0  # 13 standardised features: far from converged, finite
    assert "test NLL (exact trace)" in capsys.readouterr().out


def test_cnf_tabular_smoke_miniboone(capsys) -> None:
    if not os.environ.get("FLOWS_DATA_DIR"):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    argv = ["--epochs", "1", "--limit", "256", "--hidden", "8", "--batch-size", "128"]
    nll = _main(ROOT / "examples" / "cnf_tabular.py")(argv)
    assert math.isfinite(nll)
    assert "not comparable to published numbers" in capsys.readouterr().out


def test_cnf_benchmark_smoke(capsys) -> None:
    pytest.importorskip("zuko", reason="the benchmark compares with zuko (bench extra)")
    argv = ["--problem", "moons", "--epochs", "1", "--limit", "64", "--batch-size", "32", "--reference-rows", "16"]
    results = _main(ROOT / "benchmarks" / "cnf.py")(argv)
    assert set(results) == {
        "zuko CNF (exact, ELU)",
        "flows FFJORD (exact)",
        "flows FFJORD (exact, zuko's field)",
        "flows FFJORD (exact) + RNODE 0.01",
    }
    assert results["zuko CNF (exact, ELU)"]["time_ratio"] == 1.0
    assert all(math.isfinite(r["test_nll"]) and r["train_nfe"] > 0 for r in results.values())
    assert all(r["reference_error"] < 1e-3 for r in results.values())  # each solve agrees with a tight one
    assert "test NLL" in capsys.readouterr().out


def test_cnf_benchmark_options_smoke(capsys) -> None:
    argv = ["--problem", "circles", "--epochs", "2", "--limit", "64", "--batch-size", "32", "--reference-rows", "0"]
    argv += ["--hidden", "8", "--cosine", "--contenders", "flows+rnode0.1", "--rnode", "0.1"]
    results = _main(ROOT / "benchmarks" / "cnf.py")(argv)
    (row,) = results.values()
    assert math.isfinite(row["test_nll"]) and row["test_nfe"] > 0
    out = capsys.readouterr().out
    assert "problem circles" in out and "(cosine lr)" in out and "hidden (8,)" in out


def test_cnf_trace_cost_smoke(capsys) -> None:
    results = _main(ROOT / "benchmarks" / "cnf.py")(["--problem", "trace", "--repeats", "1", "--batch-size", "4"])
    assert set(results) == {"2", "43"} and all(len(r) == 4 and min(r.values()) > 0 for r in results.values())
    assert "autograd exact" in capsys.readouterr().out
