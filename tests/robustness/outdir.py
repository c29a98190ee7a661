"""Output-folder attacks (family ``outdir``): what ``flows fit`` and ``flows sample`` do to the files in ``--out``.

The names attacked are derived from the code, not listed by hand: every entry of
:data:`flows.train.runs.RUN_FILES` (the names a run owns), and for the full-disk attacks every
file that a real run on the tiny CSV writes. For each:

* a user's own file of that name in ``--out`` is kept byte for byte and the run refused with one
  error line (exit 2); with ``--overwrite`` the run replaces it completely (the new run's file, or
  none if the run writes no such file);
* a write of that file failing with ``ENOSPC`` ends in one error line naming the file (exit 2);

and across the CLI: a failed ``--overwrite`` run leaves no old model beside its own ``run.json``
(``flows eval`` must not score the old model as the new run's), a run whose every step was
skipped fails (exit 1, no model), every objective-specific ``--option`` key given with another
objective is refused (:data:`flows.cli.fit.OBJECTIVE_OPTIONS`), ``flows sample`` keeps earlier
samples whole when a write fails under ``--overwrite``, and a sample count the memory cannot hold
is refused naming ``-n``. A few subprocess attacks send SIGINT (three times), SIGTERM and SIGHUP
during training: exit 130 with a checkpoint that ``--resume`` finishes, and Ctrl-C while the
command imports: exit 130, one line.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from tests.robustness.cli import FIT, _csv, _error_lines, _invoke, _judge_error, _long_fit, _root, _spawn, _wait_for
from tests.robustness.table import Attack, Outcome, Result

__all__ = ["attacks"]

USER_BYTES = b"a user's own file: keep me\n"


def _base() -> Path:
    root = _root() / "outdir"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _fit_argv(out: Path, *extra: str) -> list[str]:
    return ["fit", "--data", str(_csv()), *FIT, "--out", str(out), *extra]


def _one_line(code: int, stderr: str, expected_code: int, names: tuple[str, ...]) -> Result:
    result = _judge_error(code, stderr, names)
    if result.outcome is Outcome.CLEAR_ERROR and code != expected_code:
        return Result(Outcome.RAW_CRASH, f"exit {code}, expected {expected_code}: {stderr.strip()[:200]}")
    return result


def _place_user_file(path: Path) -> None:
    if path.suffix:  # a file name
        path.write_bytes(USER_BYTES)
    else:  # a directory name (tensorboard/): a user's file inside it
        path.mkdir()
        (path / "notes.txt").write_bytes(USER_BYTES)


def _is_user_file(path: Path) -> bool:
    inside = path / "notes.txt" if path.is_dir() else path
    return inside.is_file() and inside.read_bytes() == USER_BYTES


def _user_file(name: str) -> Result:
    """A user's file named like a run output: refused and kept; with --overwrite, replaced completely."""
    out = _base() / f"user-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _place_user_file(out / name)
    code, _, stderr, crash = _invoke(_fit_argv(out))
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if not _is_user_file(out / name):
        return Result(
            Outcome.SILENT_WRONG, f"exit {code}: the user's {name} was changed or removed without --overwrite"
        )
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"exit 0 with a user's {name} in --out (it was kept, but mixed with a run)")
    refused = _one_line(code, stderr, 2, (name, "--overwrite"))
    if refused.outcome is not Outcome.CLEAR_ERROR:
        return refused
    code, _, stderr, crash = _invoke(_fit_argv(out, "--overwrite"))
    if crash or code != 0:
        return Result(Outcome.RAW_CRASH, f"--overwrite run failed (exit {code}): {(crash or stderr).strip()[-200:]}")
    if _is_user_file(out / name):
        return Result(Outcome.SILENT_WRONG, f"--overwrite kept the old {name} beside the new run's files")
    return Result(Outcome.OK, f"refused ({refused.detail[:80]}); --overwrite replaced it")


def _failed_overwrite() -> Result:
    """An --overwrite run that fails during training: no old model, metrics or pictures beside its run.json."""
    from flows.train.runs import read_run_file

    out = _base() / "failed-overwrite"
    shutil.rmtree(out, ignore_errors=True)
    code, *_ = _invoke(_fit_argv(out))
    if code != 0:
        return Result(Outcome.RAW_CRASH, f"the first run failed with exit {code}")
    old = {p.name for p in out.iterdir()}

    def broken_fit(self, *args, **kwargs):
        raise RuntimeError("expected a working disk, got an injected failure in the middle of training")

    with mock.patch("flows.train.trainer.Trainer.fit", broken_fit):
        code, _, stderr, crash = _invoke(_fit_argv(out, "--overwrite", "--seed", "7"))
    if crash or code == 0:
        return Result(Outcome.RAW_CRASH, f"the injected failure gave exit {code}: {(crash or stderr)[-200:]}")
    if read_run_file(out).get("fit", {}).get("seed") != 7:
        return Result(Outcome.SILENT_WRONG, "the failed run's run.json is not there (the old one is)")
    mixed = sorted(old & {p.name for p in out.iterdir()} - {"run.json", ".checkpoint.ckpt.lock"})
    if mixed:
        return Result(Outcome.SILENT_WRONG, f"the old run's {mixed} lie beside the failed run's run.json")
    code, stdout, stderr, _ = _invoke(["eval", str(out)])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"flows eval scored a model for the failed run: {stdout.strip()[:120]}")
    return Result(Outcome.OK, "no old file left; flows eval refuses the failed run")


def _all_skipped() -> Result:
    out = _base() / "all-skipped"
    shutil.rmtree(out, ignore_errors=True)
    argv = _fit_argv(out, "--model", "FFJORD", "--objective", "fm", "--sigma", "1e300", "--batch-size", "64")
    code, stdout, stderr, crash = _invoke(argv)
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"exit 0 for a run whose every step was skipped: {stdout.strip()[-120:]}")
    if (out / "model.safetensors").exists() or (out / "model.json").exists():
        return Result(Outcome.SILENT_WRONG, "the untrained model was saved as the result")
    lines = [line for line in _error_lines(stderr)[0] if "error:" in line]  # the guard's warnings come before it
    if code == 2:  # refused before training: FlowMatching bounds sigma when it is built
        return _one_line(code, lines[-1] if lines else stderr, 2, ("sigma",))
    return _one_line(code, lines[-1] if lines else stderr, 1, ("skipped", "non-finite"))


def _option_with_other_objective(key: str, objective: str) -> Result:
    out = _base() / f"option-{key}-{objective}"
    value = "true" if key == "adjoint" else "1.0"
    argv = _fit_argv(out, "--model", "FFJORD", "--objective", objective, "--option", f"{key}={value}")
    code, _, stderr, crash = _invoke(argv)
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"--option {key}={value} accepted with --objective {objective}")
    return _one_line(code, stderr, 2, (f"--option {key}",))


@contextlib.contextmanager
def _full_disk_for(name: str) -> Iterator[None]:
    """Creating or writing ``name`` (or its atomic temporary) fails with ENOSPC and no file name, as write(2) does."""
    real_open, real_os_open = open, os.open

    def hit(path: object) -> bool:
        if not isinstance(path, (str, os.PathLike)):
            return False
        base = os.path.basename(os.fspath(path))
        return base == name or (base.startswith(f".{name}.") and ".tmp" in base)  # the file or its temporary

    def fake_open(path, mode="r", *args, **kwargs):
        if hit(path) and any(c in mode for c in "wax+"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if hit(path) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_os_open(path, flags, *args, **kwargs)

    with mock.patch("builtins.open", fake_open), mock.patch("os.open", fake_os_open):
        yield


@functools.cache
def _csv3() -> Path:
    """A 3-column table: its runs draw a corner plot (2-D data gets density contours, images a grid)."""
    import numpy as np

    path = _base() / "tiny3.csv"
    np.savetxt(path, np.random.default_rng(1).normal(size=(80, 3)), delimiter=",", header="a,b,c", comments="")
    return path


def _plotting_fit(name: str, out: Path) -> list[str]:
    """A run with pictures on the data whose kind makes it write ``name`` (an image grid needs images, ...)."""
    data = {"samples.png": "digits", "corner.png": str(_csv3())}.get(name, str(_csv()))
    argv = [a for a in _fit_argv(out) if a != "--no-plots"]
    argv[argv.index("--data") + 1] = data
    return argv


def _enospc_fit(name: str) -> Result:
    out = _base() / f"enospc-{name}"
    shutil.rmtree(out, ignore_errors=True)
    reference = out.with_name(out.name + "-reference")
    shutil.rmtree(reference, ignore_errors=True)
    code, _, stderr, _ = _invoke(_plotting_fit(name, reference))
    if code != 0 or not os.path.lexists(reference / name):
        return Result(
            Outcome.RAW_CRASH, f"the reference run (exit {code}) wrote no {name}: fix the table ({stderr[-120:]})"
        )
    with _full_disk_for(name):
        code, _, stderr, crash = _invoke(_plotting_fit(name, out))
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"exit 0 although writing {name} failed")
    result = _one_line(code, stderr, 2, (str(out / name),))
    if result.outcome is Outcome.CLEAR_ERROR and str(out / name) not in stderr:
        return Result(Outcome.RAW_CRASH, f"the error does not name {str(out / name)!r}: {stderr.strip()[:200]}")
    return result


@functools.cache
def _trained() -> Path:
    out = _base() / "trained"
    shutil.rmtree(out, ignore_errors=True)
    code, _, stderr, _ = _invoke(_fit_argv(out))
    if code != 0:
        raise RuntimeError(f"could not train the fixture run: {stderr[-200:]}")
    return out


def _enospc_sample(suffix: str) -> Result:
    """Earlier samples stay whole when a write fails under --overwrite, and the error names the file."""
    target = _base() / f"sample-{suffix.strip('.')}" / "s.npy"
    target.parent.mkdir(parents=True, exist_ok=True)
    code, *_ = _invoke(["sample", str(_trained()), "-n", "4", "--out", str(target), "--overwrite"])
    if code != 0:
        return Result(Outcome.RAW_CRASH, f"the first flows sample failed with exit {code}")
    before = target.read_bytes()
    failing = target.with_suffix(suffix)
    with _full_disk_for(failing.name):
        code, _, stderr, crash = _invoke(["sample", str(_trained()), "-n", "9", "--out", str(target), "--overwrite"])
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"exit 0 although writing {failing.name} failed")
    if suffix == ".npy" and target.read_bytes() != before:
        return Result(Outcome.SILENT_WRONG, "the earlier samples file was changed by the failed write")
    if list(target.parent.glob(".s.*")):
        return Result(Outcome.SILENT_WRONG, "a temporary file was left behind")
    result = _one_line(code, stderr, 2, (str(failing),))
    if result.outcome is Outcome.CLEAR_ERROR and str(failing) not in stderr:
        return Result(Outcome.RAW_CRASH, f"the error does not name {str(failing)!r}: {stderr.strip()[:200]}")
    return result


def _sample_count_too_large() -> Result:
    count = str(10**15)
    out = _base() / "sample-huge" / "s.npy"
    code, _, stderr, crash = _invoke(["sample", str(_trained()), "-n", count, "--out", str(out)])
    if crash:
        return Result(Outcome.RAW_CRASH, crash.strip().splitlines()[-1][:200])
    if code == 0:
        return Result(Outcome.SILENT_WRONG, f"exit 0 for -n {count}")
    result = _one_line(code, stderr, 2, ("--num", count))
    if result.outcome is Outcome.CLEAR_ERROR and not ("-n" in stderr and count in stderr):
        return Result(Outcome.RAW_CRASH, f"the error names neither -n nor {count}: {stderr.strip()[:200]}")
    return result


# -- signals (subprocesses: a few seconds each) ----------------------------------------------------------------------


def _signal_then_resume(signame: str, times: int) -> Result:
    out = _base() / f"signal-{signame}-{times}"
    shutil.rmtree(out, ignore_errors=True)
    argv = _long_fit(out, "--checkpoint-every", "0.2")
    argv[argv.index("--epochs") + 1] = "400"
    process = _spawn(argv)
    try:
        if not _wait_for(lambda: (out / "checkpoint.ckpt").exists(), process, 120):
            process.kill()
            _, err = process.communicate()
            return Result(Outcome.RAW_CRASH, f"the run ended or stalled before its first checkpoint: {err[-200:]}")
        for _ in range(times):
            process.send_signal(getattr(signal, signame))
            time.sleep(0.05)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    if process.returncode != 130 or "Traceback" in stderr or len(_error_lines(stderr)[0]) != 1:
        return Result(Outcome.RAW_CRASH, f"{signame} x{times}: exit {process.returncode}: {stderr.strip()[-200:]}")
    argv[argv.index("--epochs") + 1] = "2"
    second = _spawn([*argv, "--resume"])
    stdout, stderr = second.communicate(timeout=120)
    if second.returncode != 0 or "log-likelihood" not in stdout:
        return Result(Outcome.LOST_RUN, f"--resume after {signame} exited {second.returncode}: {stderr[-200:]}")
    return Result(Outcome.OK, f"{signame} x{times}: exit 130, one line; --resume finished")


def _ctrl_c_while_importing() -> Result:
    process = _spawn(["models"])
    time.sleep(0.4)  # importing torch takes seconds
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    if process.returncode == 0:
        return Result(Outcome.OK, "the command finished before the signal came")
    if process.returncode != 130 or "Traceback" in stderr or len(stderr.strip().splitlines()) != 1:
        return Result(Outcome.RAW_CRASH, f"exit {process.returncode}: {stderr.strip()[-200:]}")
    return Result(Outcome.OK, f"exit 130: {stderr.strip()}")


def attacks() -> list[Attack]:
    """The ``outdir`` family: names derived from :data:`~flows.train.runs.RUN_FILES` and from a real run."""
    from flows.cli.fit import OBJECTIVE_OPTIONS
    from flows.train.runs import RUN_FILES

    found = [
        Attack(f"outdir/fit/user-file={name}", "outdir", functools.partial(_user_file, name), 60) for name in RUN_FILES
    ]
    found += [Attack("outdir/fit/failed-overwrite-leaves-no-old-model", "outdir", _failed_overwrite, 60)]
    found += [Attack("outdir/fit/all-steps-skipped", "outdir", _all_skipped, 90)]
    found += [
        Attack(
            f"outdir/fit/option={key}-with-{other}",
            "outdir",
            functools.partial(_option_with_other_objective, key, other),
        )
        for objective, keys in OBJECTIVE_OPTIONS.items()
        for key in keys
        for other in OBJECTIVE_OPTIONS
        if other != objective and key not in OBJECTIVE_OPTIONS[other]
    ]
    # every file a run owns, written by a run on data of the kind that writes it. The tensorboard/ folder is
    # not attacked here: its event files are written by TensorBoard's own thread through io.open, which the
    # full-disk patch (builtins.open, os.open, by file name) does not reach, so the attack could not fail a write
    # and would call the run that did not fail "silent" (it is still attacked as a user's folder in --out).
    names = [n for n in RUN_FILES if n != "tensorboard"]
    found += [Attack(f"outdir/fit/enospc={n}", "outdir", functools.partial(_enospc_fit, n), 90) for n in names]
    found += [
        Attack(f"outdir/sample/enospc={s}", "outdir", functools.partial(_enospc_sample, s), 60)
        for s in (".npy", ".png")
    ]
    found += [Attack("outdir/sample/num=allocation-sized", "outdir", _sample_count_too_large, 60)]
    found += [
        Attack(
            f"outdir/signal/{name}x{times}-then-resume",
            "outdir",
            functools.partial(_signal_then_resume, name, times),
            240,
        )
        for name, times in (("SIGINT", 3), ("SIGTERM", 1), ("SIGHUP", 1))
        if hasattr(signal, name)
    ]
    found += [Attack("outdir/signal/ctrl-c-while-importing", "outdir", _ctrl_c_while_importing, 60)]
    return found


if sys.platform == "win32":  # pragma: no cover - the signal attacks are POSIX
    raise ImportError("tests.robustness.outdir runs on POSIX systems")
