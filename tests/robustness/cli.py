"""CLI attacks: every subcommand and option found by walking the argparse parser of :mod:`flows.cli`.

For each option the walk picks bad values by the option's type (integers: non-numeric, fractional,
zero, negative, 2**70; floats: non-numeric, zero, negative, NaN, inf, 1e308; paths: missing, a
directory, a file that is not a checkpoint, a path under a regular file; choices: an unknown
choice; data: an empty CSV, a CSV with a NaN, a 1e30 or a text row) and runs the command in
process (``flows.cli.main``) on tiny data. A new option or command is attacked without a new test.

CLI oracle: a clear error is a documented exit status (2 for bad arguments or inputs, 1 for a
diverged run or failed checks) with exactly one ``error:`` line on stderr (argparse's usage lines
allowed), no traceback, naming the option, the value or the file; a right result is exit 0 with
a finite, sane result (a finite test log-likelihood, the samples file it reports). Values that can
never be right (NaN, negative counts, the issue's ``--draws 0`` and friends) must be refused.

Kill and concurrency attacks run ``flows fit`` in subprocesses: SIGKILL after the first epoch (and
after a checkpoint) then ``--resume`` must finish; a second ``flows fit`` on a run directory that a
live process holds must be refused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from tests.robustness.table import Attack, Outcome, Result, workspace

__all__ = ["attacks"]

ROOT = Path(__file__).resolve().parents[2]
FIT = ["--epochs", "1", "--transforms", "1", "--hidden", "4", "--batch-size", "16", "--no-plots", "--quiet"]
FIT += ["--time-budget", "2", "--threads", "1"]
INT_VALUES = {"non-numeric": "abc", "fraction": "1.5", "zero": "0", "negative": "-1", "huge": str(2**70)}
FLOAT_VALUES = {"non-numeric": "abc", "zero": "0", "negative": "-1", "nan": "nan", "inf": "inf", "huge": "1e308"}
PATH_VALUES = ("missing", "directory", "not-a-checkpoint", "under-a-file")
DATA_VALUES = ("missing", "directory", "empty-csv", "nan-csv", "huge-csv", "text-csv", "unknown-name")
# Values that can never be right: the command must refuse them.
REFUSE = {"non-numeric", "fraction", "negative", "nan", "unknown-choice", "unknown-name", "not-a-checkpoint"}
REFUSE |= {"under-a-file", "empty", "no-equals", "empty-csv", "text-csv", "directory-data", "nothing-to-resume"}
# Zero is refused where it has no meaning (issue 17 item 12 names --draws, --val-fraction and check --num).
REFUSE_ZERO = {"--draws", "--val-fraction", "--num", "--batch-size", "--threads", "--nproc", "--levels", "--hidden"}
REFUSE_SPECIFIC = {("fit", "--seed", "huge"), ("fit", "--option", "clamp-not-a-number")}
# Options whose attacks need a C++ compiler or several processes: out of the quick table.
SKIP = {"--compile", "--no-plots", "--quiet", "-h", "--help"}
# Values not tried: --nproc 2**70 would start torchrun with that many workers.
SKIP_VALUES = {("--nproc", "huge")}
# Options a run on a CSV file does not use: ignoring them is a right result.
UNUSED_WITH_CSV = {"--data-dir", "--key"}


# -- fixtures --------------------------------------------------------------------------------------


def _root() -> Path:
    root = workspace() / "cli"
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.cache
def _csv() -> Path:
    gen = np.random.default_rng(0)
    x = gen.normal(size=(80, 2)) @ np.array([[1.0, 0.5], [0.0, 0.7]])
    path = _root() / "tiny.csv"
    np.savetxt(path, x, delimiter=",", header="a,b", comments="")
    return path


@functools.cache
def _run() -> Path:
    """A trained run directory on the tiny CSV (shared by eval/sample/check attacks)."""
    out = _root() / "trained"
    code, _, err, crash = _invoke(["fit", "--data", str(_csv()), *FIT, "--out", str(out)])
    if code != 0:
        raise RuntimeError(f"could not train the fixture run: {crash or err}")
    return out


def _bad_path(kind: str, *, data: bool = False, root: Path | None = None) -> str:
    root = root or _root() / "bad"
    root.mkdir(parents=True, exist_ok=True)
    if kind == "missing":
        return str(root / "no-such-file.csv")
    if kind in ("directory", "directory-data"):
        (root / "a-directory").mkdir(exist_ok=True)
        return str(root / "a-directory")
    if kind == "not-a-checkpoint":
        (root / "notes.txt").write_text("hello\n")
        return str(root / "notes.txt")
    if kind == "under-a-file":
        (root / "plain-file").write_text("x")
        return str(root / "plain-file" / "below")
    if kind == "unknown-name":
        return "no-such-dataset"
    if not data:
        return str(root / f"{kind}.csv")
    rows = {"empty-csv": "a,b\n", "nan-csv": None, "huge-csv": None, "text-csv": None}[kind] if data else None
    path = root / f"{kind}.csv"
    if kind == "empty-csv":
        path.write_text(rows)
    else:
        lines = ["a,b"] + [f"{0.1 * i:.2f},{(-0.05) * i:.2f}" for i in range(60)]
        lines[17] = {"nan-csv": "nan,0.5", "huge-csv": "1e30,0.5", "text-csv": "oops,0.5"}[kind]
        path.write_text("\n".join(lines) + "\n")
    return str(path)


# -- running the command in process ----------------------------------------------------------------


def _invoke(argv: list[str]) -> tuple[int, str, str, str]:
    """``flows.cli.main(argv)``: (exit status, stdout, stderr, traceback of an escaped exception)."""
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    crash = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except Exception:
            code, crash = 1, traceback.format_exc()
    return int(code), out.getvalue(), err.getvalue(), crash


def _error_lines(stderr: str) -> tuple[list[str], list[str]]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    usage = [line for line in lines if line.startswith("usage:") or line.startswith(" ")]
    return [line for line in lines if line not in usage], usage


def _judge_error(code: int, stderr: str, names: tuple[str, ...]) -> Result:
    lines, _ = _error_lines(stderr)
    if code not in (1, 2):
        return Result(Outcome.RAW_CRASH, f"undocumented exit status {code}")
    if "Traceback" in stderr:
        return Result(Outcome.RAW_CRASH, "traceback on stderr")
    if len(lines) != 1 or "error:" not in lines[0]:
        return Result(Outcome.RAW_CRASH, f"expected one 'error:' line on stderr, got {len(lines)}: {lines[:3]}")
    line = lines[0]
    keys = (
        {n for n in names if n}
        | {n.lstrip("-") for n in names if n}
        | {n.lstrip("-").replace("-", "_") for n in names if n}
    )
    keys |= {n.lstrip("-").replace("-", " ") for n in names if n}
    if "expected" in line or any(k in line for k in keys if len(k) >= 3):
        return Result(Outcome.CLEAR_ERROR, f"exit {code}: {line[:200]}")
    return Result(Outcome.RAW_CRASH, f"the message names neither the option nor the value: {line[:200]}")


_NUMBER = r"(-?(?:\d+\.\d+|\d+|nan|inf))"


def _sane(command: str, argv: list[str], stdout: str) -> str | None:
    """What is wrong with a successful run's output (``None``: looks right)."""
    if command in ("fit", "eval"):
        if "--json" in argv:
            import json

            values = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            found = [v["log_likelihood"] for v in values]
        else:
            found = [float(m) for m in re.findall(r"log-likelihood: " + _NUMBER, stdout)]
        if not found and command == "fit" and "no test split" in stdout:
            return None  # --test-fraction 0: no test split, and the run says so
        if not found:
            return "exit 0 without a log-likelihood"
        value = found[-1]
        if not math.isfinite(value) or value < -50:
            return f"exit 0 with log-likelihood {value}"
    if command == "sample":
        match = re.search(r"wrote (\d+) samples .* to (\S+) and a picture", stdout)
        if not match:
            return "exit 0 without saying where the samples went"
        path = Path(match.group(2))
        if not path.is_file():
            return f"reported {path} but wrote no such file"
        samples = np.load(path)
        if samples.shape[0] != int(match.group(1)) or not np.isfinite(samples).all():
            return f"the samples file holds {samples.shape} (finite: {bool(np.isfinite(samples).all())})"
    if command == "models" and not stdout.strip():
        return "no models listed"
    return None


def _cli_attack(command: str, option: str, label: str, value: str | None, must_refuse: bool) -> Result:
    fresh = _root() / "out" / f"{command}{option}-{label}".replace("/", "_")
    if value is not None and value.startswith("@"):  # a bad path, made in this attack's own directory
        kind = value[1:]
        value = _bad_path(kind, data=option == "--data", root=fresh.with_name(fresh.name + "-input"))
    base = {
        "fit": ["fit", "--data", str(_csv()), *FIT, "--out", str(fresh)],
        "eval": ["eval", str(_run()) if command == "eval" else ""],
        "sample": ["sample", str(_run()) if command == "sample" else "", "-n", "3", "--out", str(fresh / "s.npy")],
        "check": ["check", str(_run()) if command == "check" else ""],
        "models": ["models"],
    }.get(command, [command])
    argv = list(base)
    if option == "run":  # the positional run directory
        argv[1] = value
    elif option in argv:
        i = argv.index(option)
        if value is None:
            argv.pop(i) if option in ("--quiet", "--no-plots") else None
        else:
            argv[i + 1] = value
    else:
        argv += [option] if value is None else [f"{option}={value}" if value.startswith("-") else option, value]
        if value is not None and value.startswith("-"):
            argv.pop()  # the --opt=-1 spelling already holds the value
    code, stdout, stderr, crash = _invoke(argv)
    if crash:
        last = crash.strip().splitlines()[-1]
        return Result(Outcome.RAW_CRASH, f"traceback: {last[:200]}")
    if code == 0:
        if must_refuse:
            return Result(Outcome.SILENT_WRONG, f"exit 0 for {option} {value!r}")
        problem = _sane(command, argv, stdout)
        return Result(Outcome.SILENT_WRONG, problem) if problem else Result(Outcome.OK, "exit 0, sane result")
    if command == "check" and code == 1 and "failure(s)" in stdout:
        return Result(Outcome.CLEAR_ERROR, "exit 1, failures reported")
    return _judge_error(code, stderr, (option, value or ""))


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from flows.cli import _parser

    parser = _parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _values(command: str, action: argparse.Action) -> dict[str, str | None]:
    name = action.option_strings[-1] if action.option_strings else action.dest
    if isinstance(action, argparse._StoreTrueAction):
        return {"nothing-to-resume": None} if name == "--resume" else {"flag": None}
    if action.choices is not None:
        return {"unknown-choice": "bogus"}
    number = getattr(action.type, "number", action.type)  # the CLI's range-checked types say what they parse
    if number is int:
        return dict(INT_VALUES)
    if number is float:
        return dict(FLOAT_VALUES)
    if name == "--option":
        return {
            "clamp-not-a-number": "clamp=abc",
            "no-equals": "noequals",
            "empty-key": "=1",
            "unknown-key": "nosuch=1",
        }
    if name == "--hidden":
        return {"empty": "", "non-numeric": "abc", "zero": "0", "negative": "-1", "huge": str(2**70)}
    if name == "--data":
        return {kind: "@" + kind for kind in DATA_VALUES}
    if action.type is Path or name in ("--data-dir", "run"):
        return {kind: "@" + kind for kind in PATH_VALUES}
    return {"unknown-name": "no-such-thing", "empty": ""}


def _cli_attacks() -> list[Attack]:
    out = []
    for command, sub in _subparsers().items():
        actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            out.append(
                Attack(
                    f"cli/{command}/extra-argument",
                    "cli",
                    functools.partial(_cli_attack, command, "--bogus", "x", "x", True),
                )
            )
        for action in actions:
            name = action.option_strings[-1] if action.option_strings else action.dest
            if name in SKIP or set(action.option_strings) & SKIP:
                continue
            for label, value in _values(command, action).items():
                must = (
                    label in REFUSE
                    or (label == "zero" and name in REFUSE_ZERO)
                    or (command, name, label) in REFUSE_SPECIFIC
                    or (label == "missing" and name in ("run", "--data", "--data-dir"))
                    or (label == "directory" and name in ("run",) and False)
                    or (label in ("directory", "missing") and name == "--data")
                )
                if label == "under-a-file" or (label == "not-a-checkpoint" and name != "run"):
                    must = name in ("run", "--out", "--picture", "--data-dir")
                if label == "directory" and name in ("--out",) and command == "fit":
                    must = False
                if label == "missing" and name in ("--out", "--picture"):
                    must = False
                if label == "flag" or name in UNUSED_WITH_CSV or (name == "--seed" and label == "negative"):
                    must = False  # flags, options a CSV run ignores, and negative seeds (legal for torch)
                if (name, label) in SKIP_VALUES:
                    continue
                if label == "unknown-name" and name == "--key":
                    must = False  # a CSV has no arrays to name: ignoring --key is a right result
                out.append(
                    Attack(
                        f"cli/{command}/{name}={label}",
                        "cli",
                        functools.partial(_cli_attack, command, name, label, value, must),
                        timeout=40.0,
                    )
                )
    return out


# -- kills and concurrent writers (subprocesses) ---------------------------------------------------


def _spawn(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _long_fit(out: Path, *extra: str) -> list[str]:
    """A run on the tiny CSV that lasts a few seconds (many short epochs), for kills and second writers."""
    head = ["fit", "--data", str(_csv()), "--epochs", "20", "--transforms", "1", "--hidden", "4", "--batch-size", "8"]
    return [*head, "--no-plots", "--quiet", "--patience", "0", "--schedule", "none", "--out", str(out), *extra]


def _wait_for(predicate, process: subprocess.Popen, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _epochs_done(out: Path) -> int:
    metrics = out / "metrics.csv"
    return max(0, len(metrics.read_text().splitlines()) - 1) if metrics.exists() else 0


def _kill_then_resume(after: str) -> Result:
    out = _root() / f"kill-{after}"
    extra = ("--checkpoint-every", "0.2") if after == "checkpoint" else ()
    first = _spawn(_long_fit(out, *extra))
    try:
        ready = (
            (lambda: (out / "checkpoint.ckpt").exists()) if after == "checkpoint" else (lambda: _epochs_done(out) >= 1)
        )
        if not _wait_for(ready, first, 120):
            first.kill()
            _, err = first.communicate()
            return Result(Outcome.RAW_CRASH, f"the run ended or stalled before the kill point: {err.strip()[-200:]}")
        first.send_signal(signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    second = _spawn([*_long_fit(out, *extra), "--resume"])
    stdout, stderr = second.communicate(timeout=120)
    if second.returncode != 0:
        return Result(
            Outcome.LOST_RUN, f"--resume after SIGKILL ({after}) exited {second.returncode}: {stderr.strip()[-200:]}"
        )
    if "Traceback" in stderr or not re.search(r"log-likelihood: -?\d", stdout):
        return Result(Outcome.RAW_CRASH, f"resume finished without a result: {stderr.strip()[-200:]}")
    leftovers = list(out.glob("*.tmp"))
    if leftovers:
        return Result(Outcome.SILENT_WRONG, f"stale temporary files after resume: {[p.name for p in leftovers]}")
    return Result(Outcome.OK, "resumed and finished")


def _two_writers() -> Result:
    """Two identical ``flows fit`` started together on one fresh run directory: one must be refused."""
    out = _root() / "two-writers"
    processes = [_spawn(_long_fit(out)) for _ in range(2)]
    results = [p.communicate(timeout=200) for p in processes]
    codes = [p.returncode for p in processes]
    if codes.count(0) == 2:
        return Result(Outcome.SILENT_WRONG, "two writers ran on one run directory at the same time, both exit 0")
    if 0 not in codes:
        return Result(Outcome.LOST_RUN, f"both writers failed ({codes}): {results[0][1].strip()[-200:]}")
    refused = codes.index(0) ^ 1
    return _judge_error(codes[refused], results[refused][1], ("--out", str(out), "lock", "another", "running"))


def attacks() -> list[Attack]:
    """The CLI part of the table, then the (few, quick) kill and concurrency attacks."""
    return [
        *_cli_attacks(),
        Attack(
            "kill/fit/sigkill-after-first-epoch-then-resume", "kill", functools.partial(_kill_then_resume, "epoch"), 240
        ),
        Attack(
            "kill/fit/sigkill-after-checkpoint-then-resume",
            "kill",
            functools.partial(_kill_then_resume, "checkpoint"),
            240,
        ),
        Attack("concurrency/fit/two-fits-one-run-directory", "concurrency", _two_writers, 240),
    ]
