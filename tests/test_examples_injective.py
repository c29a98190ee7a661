"""The injective-flow examples run end to end with a tiny budget (full runs are documented in each script)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _main(name: str):
    return run_script(str(EXAMPLES / name), run_name="example")["main"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # the examples set one thread
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dim", [1, 2])
def test_injective_sine_smoke(dim: int, tmp_path: Path, capsys) -> None:
    argv = ["--dim", str(dim), "--steps", "20", "--hidden", "16", "--train-size", "512", "--test-size", "200"]
    results = _main("injective_sine.py")([*argv, "--out", str(tmp_path)])
    assert all(math.isfinite(v) for v in results.values())
    assert results["noisy_data_distance"] > 0.05  # σ = 0.1 noise, measured by the exact distance
    assert (tmp_path / f"samples_dim{dim}.png").stat().st_size > 1000
    assert "mean distance of samples to the manifold" in capsys.readouterr().out


def test_injective_tabular_smoke(tmp_path: Path, capsys) -> None:
    pytest.importorskip("sklearn", reason="the breast-cancer table ships with scikit-learn (test extra)")
    argv = ["--steps", "10", "--eval-every", "5", "--hidden", "16", "--latent", "4", "--out", str(tmp_path)]
    results = _main("injective_tabular.py")(argv)
    assert all(math.isfinite(v) for v in results.values())
    assert 0 < results["pca_unexplained_variance"] < 1
    assert (tmp_path / "samples_breast_cancer.png").stat().st_size > 1000
    assert "unexplained variance" in capsys.readouterr().out
