"""The trainer-overhead benchmark runs end to end at toy sizes (its ratios are printed, not asserted)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.scripts import run_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_trainer_overhead_smoke(capsys) -> None:
    threads = torch.get_num_threads()
    try:
        main = run_script(str(BENCHMARKS / "trainer_overhead.py"), run_name="benchmark")["main"]
        ratios = main(["--epochs", "1", "--scale", "0.05"])
    finally:
        torch.set_num_threads(threads)
    assert set(ratios) == {"tiny", "digits"} and all(r > 0 for r in ratios.values())
    assert "Trainer ms/step" in capsys.readouterr().out
