"""The flow-map example runs end to end with tiny budgets (numbers are not asserted as speed or quality)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # the script sets one thread
    yield
    torch.set_num_threads(threads)


def test_flow_maps_example_smoke(capsys) -> None:
    main = run_script(str(ROOT / "examples" / "flow_maps.py"), run_name="example")["main"]
    argv = ["--cnf-steps", "2", "--cnf-hidden", "8", "--steps", "3", "--rkl-steps", "3", "--transforms", "2"]
    argv += ["--hidden", "8", "--pairs", "300", "--val-pairs", "50", "--samples", "500", "--ot", "--ot-batch", "64"]
    argv += ["--timing-samples", "100", "--repeats", "1"]
    results = main(argv)
    assert set(results) == {"mixture", "double_well"}
    for table in results.values():
        assert set(table) == {
            "CNF (teacher)",
            "CNF, rtol 0.001",
            "distilled",
            "OT-regressed",
            "reverse KL",
        }
        for r in table.values():
            assert 0 < r["ess"] <= 1 and math.isfinite(r["log_z_error"]) and r["sample_s"] > 0
        assert table["CNF (teacher)"]["speedup"] == 1.0
        assert table["distilled"]["params"] == table["reverse KL"]["params"]
    out = capsys.readouterr().out
    assert "ESS gap CNF − distilled" in out and "speed-up" in out
