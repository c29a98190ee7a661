"""Every example runs end to end with a tiny budget (the full runs are documented in each script)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import run_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytest.importorskip("sklearn", reason="the digits examples need scikit-learn (test extra)")


def _main(name: str):
    return run_script(str(EXAMPLES / name), run_name="example")["main"]


def test_fit_digits_smoke(tmp_path: Path, capsys) -> None:
    bpd = _main("fit_digits.py")(["--epochs", "1", "--transforms", "2", "--hidden", "16", "--out", str(tmp_path)])
    assert 0.5 < bpd < 8.0  # one epoch of a tiny model: far from converged, but a finite, sane bound
    assert (tmp_path / "samples.png").stat().st_size > 1000
    assert "test bits/dim" in capsys.readouterr().out


def test_dependent_data_smoke(capsys) -> None:
    result = _main("dependent_data.py")(["--seeds", "2", "--epochs", "1", "--individuals", "20", "--repeats", "3"])
    assert 0.0 < result["lam"] < 1.0 and result["se"] >= 0
    assert "gain of dependent over i.i.d. training" in capsys.readouterr().out
