"""Honest benchmarks: a benchmark that chooses a configuration chooses it on a validation split.

``benchmarks/digits_density.py --select`` scores its candidates on images held out from the
training split and evaluates the test split once, for the chosen model only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def test_digits_selection_never_looks_at_the_test_split(capsys) -> None:
    namespace = run_script(str(ROOT / "benchmarks" / "digits_density.py"), run_name="benchmark")
    main, evaluate = namespace["main"], namespace["test_bits_per_dim"]
    _, test = namespace["load_digits"](test_size=0.2, seed=0)
    scored: list[torch.Tensor] = []

    def spy(model, data, **options):
        scored.append(data)
        return evaluate(model, data, **options)

    main.__globals__["test_bits_per_dim"] = spy  # the function main and select_best call
    sizes = ["--hidden", "4", "--best-hidden", "6"]
    results = main(["--select", "--epochs", "1", "--select-epochs", "1", "--models", "flows-best", *sizes])
    assert set(results) == {"flows-best"}
    grid = len(namespace["GRID"])
    assert len(scored) == grid + 1  # every candidate on validation images, then the chosen model on test once
    test_rows = {tuple(row.tolist()) for row in test}
    for data in scored[:grid]:
        assert len(data) == round(0.2 * 1437) and not test_rows & {tuple(row.tolist()) for row in data}
    assert torch.equal(scored[-1], test)
    out = capsys.readouterr().out
    assert "test untouched" in out and "chosen for flows-best" in out
