"""The attack table as tests: one test id per attack (``tests/robustness/table.py`` explains the oracles).

Every attack must end in the right result or a clear error. Attacks that fail on this branch
because their fix lands with another change are listed in ``KNOWN_FAILURES_AT_BRANCH.md`` and run
as non-strict ``xfail`` (an XPASS there means the fix arrived); delete the file to make every
listed attack a plain test again.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from tests.robustness.files import _evil_pickle
from tests.robustness.table import FAILURES, Outcome, all_attacks, run_attack, workspace

KNOWN = Path(__file__).with_name("KNOWN_FAILURES_AT_BRANCH.md")
KNOWN_IDS = set(re.findall(r"^- `([^`]+)`", KNOWN.read_text(), flags=re.M)) if KNOWN.exists() else set()
ATTACKS = all_attacks()


def _param(attack):
    marks = (
        [pytest.mark.xfail(reason="listed in KNOWN_FAILURES_AT_BRANCH.md", strict=False)]
        if attack.id in KNOWN_IDS
        else []
    )
    return pytest.param(attack, id=attack.id, marks=marks)


@pytest.mark.parametrize("attack", [_param(a) for a in ATTACKS])
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
        "cli",
        "kill",
        "concurrency",
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
