"""``flows fit --out`` and ``flows sample``: the run's own files only, whole or not at all (issue 27, class 2).

A run owns the names in :data:`flows.train.runs.RUN_FILES`; a user's file of such a name is never
replaced without ``--overwrite``, a failed ``--overwrite`` run never leaves the old model beside
its own files, a run that trained nothing fails, an option the objective ignores is refused,
and a full disk names the file it could not write.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.cli import main
from flows.cli.fit import OBJECTIVE_OPTIONS
from flows.train.runs import RUN_FILES, read_run_file

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")

TINY = ["--transforms", "1", "--hidden", "4", "--threads", "1", "--epochs", "1", "--quiet"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    return lines[0]


def _fail_writes_of(monkeypatch, name: str) -> None:
    """Every write of ``name`` (or of its atomic temporary) fails as on a full disk, with no file name."""
    real_open, real_os_open = open, os.open

    def hit(path) -> bool:
        base = os.path.basename(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else ""
        return base == name or base.startswith(f".{name}.")

    def fake_open(path, mode="r", *args, **kwargs):
        if hit(path) and any(c in mode for c in "wax+"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if hit(path) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)


def test_run_files_are_exactly_what_a_run_writes(tmp_path: Path) -> None:
    """The list a run owns is derived from what it writes: a full run (pictures included) writes nothing else."""
    for data, picture in (("iris", "corner.png"), ("moons", "density.png"), ("digits", "samples.png")):
        out = tmp_path / data
        assert main(["fit", "--data", data, "--out", str(out), *TINY]) == 0
        written = {p.name for p in out.iterdir()} - {".checkpoint.ckpt.lock"}
        assert written <= set(RUN_FILES), written - set(RUN_FILES)
        expected = {"run.json", "model.safetensors", "model.json", "checkpoint.ckpt", "metrics.csv", "curves.png"}
        assert {*expected, picture} <= written


@pytest.mark.parametrize("name", ["metrics.csv", "run.json", "model.json", "curves.png", "model.safetensors"])
def test_a_user_file_of_a_run_name_is_kept_and_the_run_refused(tmp_path: Path, capsys, name: str) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_bytes(b"my own work\n")
    (out / "notes.txt").write_bytes(b"unrelated\n")
    code, err = _run(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"], capsys)
    assert code == 2 and name in _one_error(err) and "--overwrite" in err
    assert (out / name).read_bytes() == b"my own work\n"
    assert sorted(p.name for p in out.iterdir()) == sorted([name, "notes.txt"])  # no lock file, nothing written

    assert main(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots", "--overwrite"]) == 0
    # replaced completely: a file this run writes is new, one it does not write (curves.png under --no-plots) is gone
    assert not (out / name).exists() if name == "curves.png" else (out / name).read_bytes() != b"my own work\n"
    assert (out / "notes.txt").read_bytes() == b"unrelated\n"  # not a run's name: never touched


def test_a_failed_overwrite_run_leaves_no_old_model_beside_its_run_json(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    assert main(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"]) == 0
    old = read_run_file(out)
    assert "result" in old and (out / "model.safetensors").is_file()

    import flows.train.trainer as trainer_module

    def broken_fit(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "checkpoint.ckpt"))

    monkeypatch.setattr(trainer_module.Trainer, "fit", broken_fit)
    code, err = _run(
        ["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots", "--overwrite", "--seed", "1"], capsys
    )
    assert code == 2 and "checkpoint.ckpt" in _one_error(err)
    now = read_run_file(out)
    assert now["fit"]["seed"] == 1 and "result" not in now  # the new run's file, without a result
    assert not any((out / n).exists() for n in ("model.safetensors", "model.json", "metrics.csv"))
    monkeypatch.undo()
    code, err = _run(["eval", str(out)], capsys)
    assert code == 2 and "no model.safetensors or checkpoint.ckpt" in err  # never the old run's model as this run's


def test_an_early_refusal_under_overwrite_keeps_the_old_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code, err = _run(["fit", "--data", "no-such-data", "--out", str(out), *TINY, "--overwrite"], capsys)
    assert code == 2 and "no-such-data" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_run_whose_every_step_was_skipped_fails_without_a_model(tmp_path: Path, capsys, monkeypatch) -> None:
    # FlowMatching now refuses sigma=1e300 when it is built, so a loss that is never finite stands in for it
    from flows.train.flow_matching import FlowMatching

    monkeypatch.setattr(FlowMatching, "__call__", lambda self, model, batch: torch.tensor(float("nan")))
    out = tmp_path / "fm"
    argv = ["fit", "--data", "moons", "--model", "FFJORD", "--objective", "fm", "--out", str(out)]
    code, err = _run([*argv, *TINY, "--no-plots", "--batch-size", "512", "--val-fraction", "0.01"], capsys)
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 1 and len(lines) == 1 and "skipped as non-finite" in lines[0], err
    assert not (out / "model.safetensors").exists() and not (out / "model.json").exists()


@pytest.mark.parametrize("key", OBJECTIVE_OPTIONS["ml"])
def test_an_option_the_objective_ignores_is_refused(tmp_path: Path, capsys, key: str) -> None:
    value = "true" if key == "adjoint" else "1.0"
    argv = ["fit", "--data", "moons", "--model", "FFJORD", "--objective", "fm", "--option", f"{key}={value}"]
    code, err = _run([*argv, "--out", str(tmp_path / "x"), *TINY], capsys)
    line = _one_error(err)
    assert code == 2 and f"--option {key}=" in line and "--objective ml" in line
    assert not (tmp_path / "x").exists()


def test_binary_columns_are_refused_unless_dequantized(tmp_path: Path, capsys) -> None:
    gen = np.random.default_rng(0)
    path = tmp_path / "flags.npy"
    np.save(path, gen.random((60, 3)) < 0.5)  # a bool array
    code, err = _run(["fit", "--data", str(path), "--out", str(tmp_path / "a"), *TINY, "--no-plots"], capsys)
    assert code == 2 and "only 0 and 1" in _one_error(err) and "--levels 2" in err
    mixed = tmp_path / "mixed.csv"
    rows = np.column_stack([gen.normal(size=60), gen.integers(0, 2, 60)])
    np.savetxt(mixed, rows, delimiter=",", header="x,flag", comments="")
    code, err = _run(["fit", "--data", str(mixed), "--out", str(tmp_path / "b"), *TINY, "--no-plots"], capsys)
    assert code == 2 and "['flag']" in _one_error(err)
    argv = ["fit", "--data", str(path), "--levels", "2", "--out", str(tmp_path / "c"), *TINY, "--no-plots"]
    assert main(argv) == 0


@pytest.mark.parametrize("value", ["1e-300", "-3e-25", "1e200"])
def test_values_float32_training_cannot_hold_are_refused_by_one_rule(tmp_path: Path, capsys, value: str) -> None:
    path = tmp_path / "t.csv"
    lines = ["a,b"] + [f"{0.1 * i:.2f},{1 + 0.05 * i:.2f}" for i in range(40)]
    lines[7] = f"0.5,{value}"
    path.write_text("\n".join(lines) + "\n")
    code, err = _run(["fit", "--data", str(path), "--out", str(tmp_path / "x"), *TINY], capsys)
    assert code == 2 and f"line 8, column 2 (value {float(value)!r})" in _one_error(err)


def test_a_full_disk_during_fit_names_the_file(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    _fail_writes_of(monkeypatch, "metrics.csv")
    code, err = _run(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"], capsys)
    line = _one_error(err)
    assert code == 2 and str(out / "metrics.csv") in line and "no space left on device" in line


def test_sample_is_atomic_under_overwrite_and_names_the_file_on_a_full_disk(tmp_path: Path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"]) == 0
    target = tmp_path / "s.npy"
    assert main(["sample", str(out), "-n", "5", "--out", str(target)]) == 0
    before = target.read_bytes()
    for name in ("s.npy", "s.png"):
        with monkeypatch.context() as patch:
            _fail_writes_of(patch, name)
            code, err = _run(["sample", str(out), "-n", "7", "--out", str(target), "--overwrite"], capsys)
        assert code == 2 and str(tmp_path / name) in _one_error(err), err
        assert target.read_bytes() == before if name == "s.npy" else np.load(target).shape == (7, 4)
        assert not list(tmp_path.glob(".s.*"))  # no temporary left behind


def test_sample_refuses_a_count_that_cannot_fit_in_memory_naming_the_flag(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["fit", "--data", "iris", "--out", str(out), *TINY, "--no-plots"]) == 0
    code, err = _run(["sample", str(out), "-n", str(10**15)], capsys)
    assert code == 2 and f"-n/--num {10**15}" in _one_error(err)
    assert not (out / "samples.npy").exists()


def test_ctrl_c_while_the_command_imports_exits_130_with_one_line(tmp_path) -> None:
    # A sitecustomize makes `import torch` announce itself and then take 30 s, so the signal lands
    # inside the imports however fast the machine's file cache makes them (a fixed sleep did not).
    started = tmp_path / "importing-torch"
    (tmp_path / "sitecustomize.py").write_text(
        "import sys, time\n"
        "class _SlowTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            sys.meta_path.remove(self)\n"
        f"            open({str(started)!r}, 'w').close()\n"
        "            time.sleep(30)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _SlowTorch())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "models"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a test run started in the background inherits an ignored SIGINT, which the command rightly keeps
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not started.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists(), "the command never began importing torch"
    process.send_signal(2)
    _, err = process.communicate(timeout=60)
    text = err.decode()
    assert process.returncode == 130, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1 and "interrupted" in text
