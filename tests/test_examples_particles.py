"""The particle Boltzmann-generator example and benchmark run end to end with tiny budgets (numbers not asserted)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.get("FLOWS_DATA_DIR")
pytestmark = pytest.mark.skipif(
    not DATA or not (Path(DATA) / "dw4_reference_samples.npz").exists(),
    reason="needs the DW4/LJ13 reference samples in $FLOWS_DATA_DIR",
)


def _main(folder: str, name: str):
    return run_script(str(ROOT / folder / name), run_name="example")["main"]


def test_particles_example_smoke(tmp_path: Path, capsys) -> None:
    argv = ["--steps", "2", "--hidden", "8", "--layers", "1", "--batch", "8", "--test", "10", "--samples", "20"]
    argv += ["--compile-trace"]  # the evaluation's divergence through torch.compile
    result = _main("examples", "boltzmann_particles.py")([*argv, "--tol", "1e-3", "--out", str(tmp_path)])
    assert result["steps"] == 2 and 0 < result["ess"] <= 1
    assert math.isclose(result["nll"] - result["nll_bgflow"], 3 * math.log(2 * math.pi))
    assert (tmp_path / "histograms.png").stat().st_size > 1000
    assert "bgflow convention" in capsys.readouterr().out


def test_particles_benchmark_smoke(capsys) -> None:
    argv = ["--systems", "dw4", "--budget", "1", "--max-steps", "2", "--hidden", "8", "--layers", "1", "--batch", "8"]
    argv += ["--test", "10", "--samples", "20", "--mcmc-chains", "4", "--mcmc-steps", "10", "--path-samples", "16"]
    argv += ["--mcmc-warmup", "5", "--mcmc-thin", "2"]
    argv += ["--speed-batch", "1", "--eval-batch", "10", "--rtol", "1e-3", "--atol", "1e-3"]
    results = _main("benchmarks", "particles.py")(argv)
    assert set(results["dw4"]["rows"]) == {
        "ML (exact trace)",
        "FM independent",
        "FM OT",
        "FM equivariant OT",
        "generic CNF, FM OT",
    }
    assert all(r["steps"] == 2 and 0 < r["ess"] <= 1 for r in results["dw4"]["rows"].values())
    assert set(results["dw4_paths"]) == {"independent", "OT", "equivariant OT"}
    assert set(results["speed"]) == {
        "divergence (ours)",
        "ours, torch.compile",
        "dense hand JVPs",
        "batched reverse",
        "naive per-coordinate",
        "reference formulation",
        "reference, column leaves",
    }
    out = capsys.readouterr().out
    assert "trained on train (100k), tested on test" in out and "divergence (ours) vs naive per-coordinate" in out


def test_particles_example_ema_evaluates_the_average_of_the_weights(tmp_path: Path) -> None:
    """``--ema 0.5`` after two steps saves (w1 + w2) / 2, w_k the weights after step k (same seed, same draws)."""
    import torch

    tiny = ["--hidden", "8", "--layers", "1", "--batch", "8", "--test", "4", "--samples", "8", "--tol", "1e-3"]
    main = _main("examples", "boltzmann_particles.py")
    weights = {}
    runs = {"w1": ["--steps", "1"], "w2": ["--steps", "2"], "ema": ["--steps", "2", "--ema", "0.5"]}
    for name, extra in runs.items():
        main([*tiny, *extra, "--out", str(tmp_path / name)])
        weights[name] = torch.load(tmp_path / name / "model.pt")
    assert any(not torch.equal(weights["w1"][k], weights["w2"][k]) for k in weights["w1"])
    for key, value in weights["ema"].items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.5 * (weights["w1"][key] + weights["w2"][key]))
