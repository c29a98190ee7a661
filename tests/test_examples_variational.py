"""examples/variational_inference.py runs end to end with a tiny budget."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import run_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_variational_inference_smoke(capsys) -> None:
    main = run_script(str(EXAMPLES / "variational_inference.py"), run_name="example")["main"]
    results = main(["--steps", "2", "--batch", "32", "--families", "planar", "sylvester"])
    assert set(results) == {"planar", "sylvester"}
    assert all(r["kl"] > -0.5 and 0 < r["ess"] <= 1 for r in results.values())  # KL >= 0 up to MC error
    assert "KL(q||p)" in capsys.readouterr().out
