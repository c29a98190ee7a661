"""benchmarks/_harness.py: its timing rounds, neutral loop, bits/dim and printer; every benchmark has a smoke test."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import flows
from flows.data import DIGITS_LEVELS, uniform_dequantize
from flows.metrics import bits_per_dim
from tests.scripts import ROOT, run_script

HARNESS = run_script("benchmarks/_harness.py", run_name="_harness")


def test_every_benchmark_script_is_run_by_a_test() -> None:
    """A benchmark without a tiny-budget run in the suite rots unseen: each is named by some test file."""
    sources = "\n".join(path.read_text() for path in (ROOT / "tests").glob("test_*.py"))
    scripts = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if not p.name.startswith("_")]
    missing = [name for name in scripts if not re.search(rf"\b{re.escape(name)}\b", sources)]
    assert len(scripts) >= 15 and missing == []


def test_no_benchmark_edits_sys_path_or_runs_another_script() -> None:
    offenders = [
        f"{path.name}: {word}"
        for path in sorted((ROOT / "benchmarks").glob("*.py"))
        for word in re.findall(r"sys\.path\.\w+|import runpy|runpy\.\w+", path.read_text())
    ]
    assert offenders == []


def test_interleaved_times_rotate_the_order_and_count_every_round() -> None:
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = HARNESS["interleaved_times"](steps, rounds=3, inner=2, warmup=1)
    assert {name: len(pairs) for name, pairs in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[:3] == ["a", "b", "c"]  # the warm-up
    rounds = calls[3:]
    assert rounds == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a", "c", "c", "a", "a", "b", "b"]
    medians = HARNESS["interleaved_medians"](steps, rounds=1, warmup=0)
    assert set(medians) == {"a", "b", "c"} and all(t >= 0 for t in medians.values())
    with pytest.raises(ValueError, match="rounds >= 1"):
        HARNESS["interleaved_times"](steps, rounds=0)


def test_test_bits_per_dim_is_the_library_formula() -> None:
    torch.manual_seed(0)
    model = flows.RealNVP(4, transforms=2, hidden=(8,))
    data = torch.randint(0, DIGITS_LEVELS, (10, 4))
    got = HARNESS["test_bits_per_dim"](model, data, levels=DIGITS_LEVELS, draws=3, seed=5)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        log_p = torch.stack(
            [model.log_prob(uniform_dequantize(data, DIGITS_LEVELS, generator=generator)) for _ in "abc"]
        )
    assert got == pytest.approx(float(bits_per_dim(log_p, 4, DIGITS_LEVELS).mean()), rel=1e-6)


def test_the_neutral_loop_trains_and_times_a_contender() -> None:
    torch.manual_seed(0)
    data = torch.randn(64, 2) * 0.5 + 1.0
    contender = HARNESS["Contender"]("affine", flows.Flow(flows.Affine(2), flows.StandardNormal(2)), lr=0.1)
    losses = [
        HARNESS["train_epoch"](contender, data, batch_size=16, generator=torch.Generator().manual_seed(0))
        for _ in range(5)
    ]
    assert losses[-1] < losses[0] and len(contender.epoch_times) == 5 and len(contender.step_times) == 20
    assert contender.parameters == 4


def test_the_parser_has_the_common_flags_and_setup_sets_the_threads() -> None:
    parser = HARNESS["parser"]("doc", budget=5.0, epochs=3)
    args = parser.parse_args(["--threads", "1"])
    assert (args.threads, args.seed, args.budget, args.epochs) == (1, 0, 5.0, 3)
    assert HARNESS["setup"](args) is args and torch.get_num_threads() == 1
    assert not hasattr(HARNESS["parser"]("doc", seed=None).parse_args([]), "seed")
    with pytest.raises(SystemExit):
        HARNESS["setup"](parser.parse_args(["--threads", "0"]))


def test_markdown_table_formats_numbers_strings_and_gaps() -> None:
    table = HARNESS["markdown_table"](
        [{"name": "a", "bpd": 1.23456}, {"name": "b", "bpd": math.nan}, {"name": "c"}],
        [("name", "model", "s"), ("bpd", "test bits/dim", ".3f")],
    )
    assert table.splitlines() == [
        "| model | test bits/dim |",
        "|---|---:|",
        "| a | 1.235 |",
        "| b | nan |",
        "| c | — |",
    ]


def test_load_example_imports_without_running_main(capsys) -> None:
    module = HARNESS["load_example"]("boltzmann_double_well.py")
    assert callable(module.build) and callable(module.main)
    assert capsys.readouterr().out == ""
    with pytest.raises(FileNotFoundError):
        HARNESS["load_example"]("no_such_example.py")


def test_scripts_find_the_harness_like_python_does(tmp_path: Path) -> None:
    """``tests.scripts.run_script`` puts a script's folder on ``sys.path`` only for the run."""
    import sys

    before = list(sys.path)
    namespace = run_script("benchmarks/sharing.py")
    assert "main" in namespace and sys.path == before
