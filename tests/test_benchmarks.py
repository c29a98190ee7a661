"""Benchmarks run end to end at toy sizes (their numbers are not asserted: speed is not a test)."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import run_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _main(name: str):
    return run_script(str(BENCHMARKS / name), run_name="benchmark")["main"]


def test_step_overhead_smoke(capsys) -> None:
    argv = ["--features", "8", "--batch", "16", "--transforms", "2", "--hidden", "8", "--repeats", "1", "--steps", "1"]
    ratios = _main("step_overhead.py")(argv)
    assert ratios["floor (bare conditioners)"] == 1.0 and ratios["flows RealNVP"] > 0
    assert "flows RealNVP" in capsys.readouterr().out


def test_sharing_smoke(capsys) -> None:
    summary = _main("sharing.py")(
        ["--epochs", "1", "--seeds", "1", "--models", "unshared K=8 h=64", "shared K=8 h=256"]
    )
    assert summary["shared K=8 h=256"]["params"] < summary["unshared K=8 h=64"]["params"] * 1.2
    assert all(0 < s["bpd"] < 10 for s in summary.values())
    assert "x fewer" in capsys.readouterr().out


def test_sharing_glow_smoke() -> None:
    summary = _main("sharing.py")(["--family", "glow", "--epochs", "1", "--seeds", "1", "--models", "glow shared h=64"])
    assert 0 < summary["glow shared h=64"]["bpd"] < 10


def test_step_overhead_compiled_smoke(capsys) -> None:
    argv = ["--features", "8", "--batch", "16", "--transforms", "2", "--hidden", "8", "--repeats", "1", "--steps", "1"]
    ratios = _main("step_overhead.py")([*argv, "--compile"])
    assert ratios["floor (compiled) vs compiled floor"] == 1.0 and ratios["flows RealNVP (compiled)"] > 0
    assert "against the compiled floor" in capsys.readouterr().out
