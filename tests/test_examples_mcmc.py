"""The MCMC example and benchmark run end to end with tiny budgets (their numbers are not asserted)."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[1]


def _main(path: Path):
    return run_script(str(path), run_name="smoke")["main"]


def test_mcmc_mixture_example_smoke(tmp_path: Path, capsys) -> None:
    argv = ["--dim", "4", "--budget", "24", "--chains", "8", "--transforms", "2", "--hidden", "8"]
    errors = _main(ROOT / "examples" / "mcmc_mixture.py")([*argv, "--out", str(tmp_path)])
    assert set(errors) == {"MALA", "global-local", "NeuTra-MALA"}
    assert all(0.0 <= e <= 0.75 for e in errors.values())
    assert (tmp_path / "trace_global-local.png").stat().st_size > 1000
    assert (tmp_path / "pairs_mala.png").stat().st_size > 1000
    assert "mode weights" in capsys.readouterr().out


def test_mcmc_benchmark_smoke(capsys) -> None:
    argv = ["--dims", "4", "--budget", "40", "--chains", "6", "--hidden", "8", "--repeats", "1"]
    argv += ["--phi4-budget", "40", "--overhead-chains", "16"]
    out = _main(ROOT / "benchmarks" / "mcmc.py")([*argv, "--sections", "mixture", "funnel", "phi4", "overhead"])
    names = [row["sampler"] for row in out["mixture"][4]]
    assert names[0] == "global-local (flowMC)" and "NeuTra-MALA (flow)" in names and len(names) == 8
    assert "NeuTra-MALA (flow at 25%)" in names
    assert all(row["evals"] > 0 for row in out["funnel"] + out["phi4"])
    assert all(ratio > 0 for ratio in out["overhead"].values())
    assert all(name.endswith(", 16 chains") for name in out["overhead"]), "rows name the chains measured"
    assert "MALA step vs one target gradient" in capsys.readouterr().out
