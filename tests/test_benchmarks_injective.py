"""The injective benchmark runs end to end at a toy size (its numbers are not asserted: speed is not a test)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.scripts import run_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_injective_cost_smoke(capsys) -> None:
    threads = torch.get_num_threads()
    try:
        main = run_script(str(BENCHMARKS / "injective.py"), run_name="benchmark")["main"]
        ratios = main(["--part", "cost", "--tiny", "--repeats", "1", "--inner", "1"])
    finally:
        torch.set_num_threads(threads)
    assert ratios["tiny: autoencoder step"] == 1.0
    assert ratios["tiny: FIF step (double_backward)"] > 0 and ratios["tiny: exact log_prob (no grad)"] > 0
    assert "x autoencoder step" in capsys.readouterr().out
