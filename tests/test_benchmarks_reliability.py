"""The reliability benchmark runs a slice of the attack table and writes its Markdown table between markers."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.scripts import run_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_reliability_smoke(tmp_path, capsys) -> None:
    doc = tmp_path / "reliability.md"
    doc.write_text("# R\n\n<!-- reliability-table:begin -->\nold\n<!-- reliability-table:end -->\n\nafter\n")
    threads = torch.get_num_threads()
    try:
        main = run_script(str(BENCHMARKS / "reliability.py"), run_name="benchmark")["main"]
        counts = main(["--match", "api/affine/", "--markdown", "--doc", str(doc)])
    finally:
        torch.set_num_threads(threads)
    total = sum(sum(c.values()) for c in counts.values())
    assert set(counts) == {"api"} and total >= 10
    out = capsys.readouterr().out
    assert "| family | attacks |" in out and f"{total} attacks in" in out
    text = doc.read_text()
    assert "old" not in text and "| **total** |" in text and text.endswith("after\n")
