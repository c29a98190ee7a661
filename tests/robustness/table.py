"""The attack table: outcomes, attacks, oracles and the runner shared by the tests and the benchmark.

Every attack is a zero-argument-ish callable run under :func:`run_attack`, which classifies what
happened into exactly one :class:`Outcome`:

* ``ok``: the right result (checked against a reference: an empty batch gives an empty output of
  the right shape, clean rows of a poisoned batch are unchanged, a run resumes and finishes, ...);
* ``clear_error``: an exception of a documented type (``ValueError``, ``TypeError``,
  ``FileNotFoundError``, ``CheckpointError``, ...) whose message says what was expected and what
  came; for the CLI a documented non-zero exit status with one error line and no traceback;
* ``silent_wrong``: a finite wrong number, a NaN where the answer is finite, or data silently
  dropped or accepted where the promise says it is refused;
* ``raw_crash``: a traceback, an undocumented exception type (``KeyError``, ``IndexError``,
  a ``RuntimeError`` from torch internals), an error message that does not say what was expected;
* ``hang``: no answer within the attack's time limit;
* ``code_execution``: a crafted file ran code (a marker file appeared);
* ``lost_run``: a killed run could not be continued (its work is lost).

The attacks themselves live in :mod:`tests.robustness.api`, :mod:`tests.robustness.files`,
:mod:`tests.robustness.cli` and :mod:`tests.robustness.outdir`; :func:`all_attacks` gathers them (and is what
``benchmarks/reliability.py`` imports).
"""

from __future__ import annotations

import enum
import signal
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FAILURES",
    "Attack",
    "AttackFailed",
    "Outcome",
    "Result",
    "all_attacks",
    "expect_clear",
    "expect_right_or_clear",
    "run_attack",
    "workspace",
]


class Outcome(str, enum.Enum):
    """How an attack ended (one per attack)."""

    OK = "ok"
    CLEAR_ERROR = "clear_error"
    SILENT_WRONG = "silent_wrong"
    RAW_CRASH = "raw_crash"
    HANG = "hang"
    CODE_EXECUTION = "code_execution"
    LOST_RUN = "lost_run"


FAILURES = frozenset({Outcome.SILENT_WRONG, Outcome.RAW_CRASH, Outcome.HANG, Outcome.CODE_EXECUTION, Outcome.LOST_RUN})
"""The outcomes that break the promise (the target is zero of each)."""


@dataclass(frozen=True)
class Result:
    """An outcome and one line saying what happened."""

    outcome: Outcome
    detail: str = ""


class AttackFailed(Exception):
    """Raised by an oracle when a result is wrong; carries the outcome to report."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


@dataclass(frozen=True)
class Attack:
    """One row of the table.

    Attributes:
        id: stable test id, ``family/target/attack`` (e.g. ``api/affine/nan-row``).
        family: ``api``, ``builder``, ``target``, ``mcmc``, ``checkpoint``, ``cli``, ``kill``, ``concurrency``
            or ``outdir``.
        run: performs the attack and returns its :class:`Result` (the runner turns exceptions
            that escape it into ``raw_crash``).
        timeout: seconds after which the attack counts as a ``hang``.
    """

    id: str
    family: str
    run: Callable[[], Result] = field(repr=False, compare=False)
    timeout: float = 30.0


# Exception types that the library documents for bad inputs; anything else that escapes is a raw crash.
_CLEAR_TYPES: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    FileNotFoundError,
    NotImplementedError,
    FloatingPointError,  # the ODE solvers' documented error for a failed solve (CNF, FFJORD)
)
# Exception types that a clear error must not be, even though they subclass a documented one.
_RAW_TYPES: tuple[type[BaseException], ...] = (KeyError, IndexError)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def judge_error(error: BaseException, *, names: tuple[str, ...] = ()) -> Result:
    """Classify an exception raised by an attacked call.

    A clear error has a documented type and a message that says what was expected: it contains
    ``expected`` (the house style), or names one of ``names`` (the file, the option).
    """
    from flows.train.checkpoint import CheckpointError

    if isinstance(error, _RAW_TYPES) or not isinstance(error, (*_CLEAR_TYPES, CheckpointError)):
        return Result(Outcome.RAW_CRASH, _first_line(error))
    message = str(error)
    if "expected" in message.lower() or " got " in message or any(n and n in message for n in names):
        return Result(Outcome.CLEAR_ERROR, _first_line(error))
    if isinstance(error, CheckpointError):  # the documented type for damaged files; it names the file
        return Result(Outcome.CLEAR_ERROR, _first_line(error))
    return Result(Outcome.RAW_CRASH, "message does not say what was expected: " + _first_line(error))


def expect_clear(call: Callable[[], object], *, names: tuple[str, ...] = (), accepted: str = "accepted") -> Result:
    """Oracle "clear error": ``call`` must raise a clear error; returning is ``silent_wrong``."""
    try:
        call()
    except AttackFailed as failed:
        return Result(failed.outcome, str(failed))
    except Exception as error:
        return judge_error(error, names=names)
    return Result(Outcome.SILENT_WRONG, accepted)


def expect_right_or_clear(
    call: Callable[[], object], check: Callable[[object], str | None], *, names: tuple[str, ...] = ()
) -> Result:
    """Oracle "right result or clear error": ``check(result)`` returns ``None`` or what is wrong."""
    try:
        result = call()
    except AttackFailed as failed:
        return Result(failed.outcome, str(failed))
    except Exception as error:
        return judge_error(error, names=names)
    try:
        problem = check(result)
    except AttackFailed as failed:
        return Result(failed.outcome, str(failed))
    if problem:
        return Result(Outcome.SILENT_WRONG, problem)
    return Result(Outcome.OK, "right result")


class _Timeout(BaseException):
    """Raised by the alarm handler; a BaseException so that library ``except Exception`` cannot eat it."""


def run_attack(attack: Attack) -> Result:
    """Run one attack under a time limit and classify anything that escapes it."""
    import torch

    def on_alarm(signum, frame):
        raise _Timeout

    threads = torch.get_num_threads()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, attack.timeout)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the same classification under pytest's warning filters
            result = attack.run()
        if result.outcome is Outcome.SILENT_WRONG and caught:
            result = Result(result.outcome, f"{result.detail} (with a warning: {str(caught[0].message)[:120]})")
        return result
    except _Timeout:
        return Result(Outcome.HANG, f"no answer within {attack.timeout:g} s")
    except AttackFailed as failed:
        return Result(failed.outcome, str(failed))
    except Exception as error:
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return Result(Outcome.RAW_CRASH, _first_line(error) + where)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        torch.set_num_threads(threads)


_WORKSPACE: list[Path] = []


def workspace() -> Path:
    """A scratch directory shared by the attacks of one process (removed at exit)."""
    if not _WORKSPACE:
        holder = tempfile.TemporaryDirectory(prefix="flows-robustness-")
        _WORKSPACE.append(Path(holder.name))
        _WORKSPACE.append(holder)  # type: ignore[arg-type]  # keeps the directory alive
    return _WORKSPACE[0]


def all_attacks(families: tuple[str, ...] | None = None) -> list[Attack]:
    """Every attack of the table (optionally only some families), ids unique and stable."""
    from tests.robustness import api, cli, files, outdir, values
    from tests.robustness import objectives as objective_and_option_attacks

    attacks = [*api.attacks(), *files.attacks(), *cli.attacks(), *outdir.attacks()]
    attacks += values.attacks()  # metric, particles, distribution
    attacks += objective_and_option_attacks.attacks()
    if families is not None:
        attacks = [a for a in attacks if a.family in families]
    ids = [a.id for a in attacks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"robustness table: duplicate attack ids {duplicates[:10]}")
    return attacks
