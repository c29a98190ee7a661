"""The attack table as tests: one test id per attack (``tests/robustness/table.py`` explains the oracles).

Every attack must end in the right result or a clear error; there is no list of tolerated failures.
"""

from __future__ import annotations

import pickle

import pytest

from tests.robustness.files import _evil_pickle
from tests.robustness.table import FAILURES, Outcome, all_attacks, run_attack, workspace

ATTACKS = all_attacks()


@pytest.mark.parametrize("attack", [pytest.param(a, id=a.id) for a in ATTACKS])
def test_attack(attack) -> None:
    result = run_attack(attack)
    assert result.outcome not in FAILURES, f"{attack.id}: {result.outcome.value}: {result.detail}"


def test_ids_are_unique_and_cover_every_family() -> None:
    assert len({a.id for a in ATTACKS}) == len(ATTACKS)
    assert {a.family for a in ATTACKS} >= {
        "api",
        "builder",
        "target",
        "mcmc",
        "checkpoint",
        "model-file",
        "cli",
        "kill",
        "concurrency",
        "metric",
        "particles",
        "distribution",
        "outdir",
    }


def test_code_execution_oracle_can_fire() -> None:
    """The crafted pickle really runs code when loaded unsafely, so a missing marker means a refusal."""
    marker = workspace() / "oracle-check"
    pickle.loads(_evil_pickle(marker))
    assert marker.exists()


def test_silent_wrong_oracle_can_fire() -> None:
    """An attack whose call returns where a refusal is promised is classified silent_wrong."""
    from tests.robustness.table import Attack, expect_clear

    result = run_attack(Attack("self/accepts", "self", lambda: expect_clear(lambda: None)))
    assert result.outcome is Outcome.SILENT_WRONG
    crash = run_attack(Attack("self/keyerror", "self", lambda: expect_clear(lambda: {}["x"])))
    assert crash.outcome is Outcome.RAW_CRASH
