"""The image examples and the image benchmark run end to end with a tiny budget."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("sklearn", reason="the digits need scikit-learn (test extra)")


def _main(path: str):
    return run_script(str(ROOT / path), run_name="example")["main"]


TINY = ["--steps", "1", "--hidden", "8", "--eval-every", "0.5", "--threads", "1", "--warmup", "5"]


@pytest.mark.parametrize(
    "options", [[], ["--split", "eiw", "--dequantization", "variational", "--ema", "0"], ["--share-conditioner"]]
)
def test_glow_mnist_on_the_digits(tmp_path: Path, capsys, options: list[str]) -> None:
    metrics = _main("examples/glow_mnist.py")(
        ["--data", "digits", "--time-budget", "1.5", *TINY, *options, "--out", str(tmp_path)]
    )
    assert 0.5 < metrics["final_test_bpd"] < 8.0  # a few steps of a tiny model: a finite, sane bound
    assert len(metrics["history"]) >= 2 and metrics["train_seconds"] >= 1.5
    for name in ("samples.png", "curve.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == metrics["steps"]
    assert "final test bits/dim" in capsys.readouterr().out


def test_glow_mnist_on_mnist(tmp_path: Path) -> None:
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not (Path(directory) / "mnist.npz").is_file():
        pytest.skip("FLOWS_DATA_DIR with mnist.npz is not set (CI sets it)")
    limits = ["--train-limit", "128", "--test-limit", "64", "--eval-size", "32", "--epochs", "1"]
    metrics = _main("examples/glow_mnist.py")(["--time-budget", "60", *TINY, *limits, "--out", str(tmp_path)])
    assert 1.0 < metrics["final_test_bpd"] < 9.0 and metrics["steps"] == 2  # one epoch of 128 images
    assert (tmp_path / "samples.png").stat().st_size > 1000


NAMES = ["ours/static/1x1", "ours/eiw/lu", "normflows", "nflows"]


def test_image_density_benchmark_smoke(capsys) -> None:
    pytest.importorskip("normflows", reason="the benchmark compares with normflows (bench extra)")
    pytest.importorskip("nflows", reason="the benchmark compares with nflows (bench extra)")
    results = _main("benchmarks/image_density.py")(
        ["--epochs", "1", "--seeds", "1", "--steps", "1", "--hidden", "8", "--draws", "1", "--contenders", *NAMES]
    )
    assert set(results) == set(NAMES)
    assert all(0.5 < runs[0]["bpd"] < 8.0 for runs in results.values())
    assert "time ratio" in capsys.readouterr().out
