"""Training never ends in a silent wrong answer: non-finite weights, lr backoff, best weights, honest resume,
early first checkpoints, one writer per run, files that keep the umask (issue 17, items 1-6 and 8)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import flows
import flows.train.trainer as trainer_module
from flows.cli import main
from flows.train import (
    Callback,
    EarlyStopping,
    MaximumLikelihood,
    NonFiniteGuard,
    Objective,
    Trainer,
    TrainingDiverged,
    TrainingWarning,
    load_checkpoint,
    read_checkpoint_header,
)
from flows.train._atomic import atomic_write_bytes, atomic_write_text, remove_stale_temporaries
from flows.train._lock import RunLockedError, hold_run_lock, lock_path
from flows.train.guard import all_finite, state_tensors
from tests.test_train import _ScriptedValidation, _Snapshots

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--transforms", "2", "--hidden", "16", "--threads", "1", "--quiet", "--no-plots"]


def _data(n: int = 200, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=g) * torch.tensor([2.0, 0.5]) + torch.tensor([1.0, -1.0])


def _model(seed: int = 0) -> flows.Flow:
    torch.manual_seed(seed)
    return flows.RealNVP(2, transforms=2, hidden=(16,))


def _finite(trainer: Trainer) -> bool:
    return all(bool(t.isfinite().all()) for t in state_tensors(trainer.model, trainer.optimizer))


# -- 1. non-finite weights never survive a step ---------------------------------------------------------------------
def test_all_finite_is_exact_for_huge_finite_values_and_any_nan_or_inf() -> None:
    assert all_finite([torch.full((3,), 3e38), torch.tensor([1e300], dtype=torch.float64)])  # 2-norms overflow
    assert not all_finite([torch.ones(4), torch.tensor([1.0, math.nan])])
    assert not all_finite([torch.tensor([3e38, -math.inf])])
    assert all_finite([]) and all_finite([torch.empty(0)])


def test_lr_inf_stops_with_an_error_and_never_keeps_or_saves_non_finite_weights(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    trainer = Trainer(_model(), lr=1e-2, checkpoint=path, guard=NonFiniteGuard(max_consecutive=2, max_rollbacks=1))
    trainer.fit(_data(), epochs=1, batch_size=50)
    good = path.read_bytes()
    for group in trainer.optimizer.param_groups:
        group["lr"] = math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingWarning)
        with pytest.raises(TrainingDiverged, match=r"non-finite parameters or optimizer state after the update.*kept"):
            trainer.fit(_data(), epochs=3, batch_size=50)
    assert _finite(trainer)  # the model in memory is the last good state, not the broken one
    assert path.read_bytes() == good  # the last good checkpoint stays
    assert all(bool(v.isfinite().all()) for v in load_checkpoint(path).state["model"].values())


class _Poisoning(torch.optim.SGD):
    """SGD with momentum whose second step leaves an infinite value in its state (finite weights)."""

    calls = 0

    def step(self, closure=None):
        super().step(closure)
        self.calls += 1
        if self.calls == 2:
            first = self.param_groups[0]["params"][0]
            self.state[first]["momentum_buffer"].view(-1)[0] = math.inf


def test_a_step_that_leaves_non_finite_optimizer_state_is_undone() -> None:
    def poisoning(params):
        return _Poisoning(params, lr=1e-2, momentum=0.9)

    trainer = Trainer(_model(), optimizer=poisoning, guard=NonFiniteGuard(snapshot_every=100))
    with pytest.warns(TrainingWarning, match="step 2: the update made .* undoing the 1 good step"):
        history = trainer.fit(_data(100), epochs=1, batch_size=25)
    assert history["skipped"] == [1.0] and trainer.guard.skipped == 1 and _finite(trainer)
    assert [e["step"] for e in history.events] == [2]  # the snapshot was the start: step 1 was undone, and said so
    with pytest.raises(FloatingPointError, match="step 2: non-finite parameters or optimizer state"):
        Trainer(_model(), optimizer=poisoning, guard=False).fit(_data(100), epochs=1, batch_size=25)


def test_cli_divergence_exits_1_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path: Path, capsys) -> None:
    out = tmp_path / "moons"
    argv = ["fit", "--data", "moons", "--epochs", "20", "--out", str(out), *TINY]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingWarning)
        assert main([*argv, "--lr", "1e30"]) == 1  # finite, but every step ends non-finite
    err = capsys.readouterr().err.strip()
    assert err.startswith("flows fit: error: training diverged at step") and "\n" not in err
    assert err.endswith(f"the last good checkpoint, {str(out / 'checkpoint.ckpt')!r}, is kept")
    state = load_checkpoint(out / "checkpoint.ckpt").state
    assert all(bool(v.isfinite().all()) for v in state["model"].values()) and not (out / "model.safetensors").exists()
    assert main([*argv, "--lr", "inf", "--overwrite"]) == 2
    assert "expected a finite --lr > 0, got inf" in capsys.readouterr().err


def test_cli_finite_divergence_is_an_error_not_a_result(tmp_path: Path, capsys) -> None:
    # --lr 0.3 on digits: the losses stay finite (1e6..1e16 nats; the guard may skip a step whose update made the
    # weights non-finite, with a warning), but the best epoch is still far worse than the untrained model; that
    # run used to end with exit 0 and a test log-likelihood of -8e6
    out = tmp_path / "digits"
    argv = ["fit", "--data", "digits", "--epochs", "4", "--out", str(out), "--no-plots", "--quiet", "--lr", "0.3"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown whether or not an earlier test raised it from the same line
        assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(
        "flows fit: error: training diverged: expected a validation loss near or below the untrained"
    )
    assert all(line.startswith(("flows fit: warning: ", "flows fit: error: ")) for line in lines), lines
    assert not (out / "model.safetensors").exists() and not (out / "model.json").exists()
    assert math.isfinite(json.loads((out / "run.json").read_text())["untrained_val_loss"])


def test_worse_than_untrained_allows_a_short_run_that_has_not_improved_yet() -> None:
    from flows.cli.fit import _worse_than_untrained
    from flows.train.history import History

    history = History()
    for value in (101.0, 100.5):
        history.append({"epoch": 1.0, "val_loss": value})
    assert _worse_than_untrained(history, 100.0) is None  # within the margin max(1, |L0|/2)
    assert _worse_than_untrained(history, 10.0) is not None  # 100.5 > 10 + 5
    assert _worse_than_untrained(history, None) is None and _worse_than_untrained(History(), 1.0) is None


def test_cli_a_non_finite_test_log_likelihood_is_an_error_not_a_result(tmp_path: Path, capsys, monkeypatch) -> None:
    import flows.train.runs as runs

    def nan_result(model, x, **kwargs):
        return {"log_likelihood": math.nan, "stderr": math.nan, "n": len(x)}

    monkeypatch.setattr(runs, "evaluate_log_likelihood", nan_result)
    assert main(["fit", "--data", "iris", "--epochs", "1", "--out", str(tmp_path / "r"), *TINY]) == 1
    assert "expected a finite test log-likelihood, got nan" in capsys.readouterr().err


def test_huge_finite_gradients_are_clipped_not_mistaken_for_non_finite_ones() -> None:
    class Huge(Objective):
        def __call__(self, model, batch):
            return MaximumLikelihood()(model, batch) + sum(p.sum() for p in model.parameters()) * 1e20

    trainer = Trainer(_model(), Huge(), lr=1e-3, clip_grad_norm=1.0)
    history = trainer.fit(_data(100), epochs=1, batch_size=50)
    assert "skipped" not in history.records[0] and trainer.guard.skipped == 0 and _finite(trainer)
    assert 1e20 < history["grad_norm"][0] < 1e23  # a float32 norm overflows to inf here


# -- 2. the lr backoff does not compound, and resume restores it -----------------------------------------------------
class _NaNSteps(Objective):
    def __init__(self, steps: set[int]) -> None:
        self.steps, self.calls = steps, 0

    def __call__(self, model, batch):
        self.calls += 1
        loss = MaximumLikelihood()(model, batch)
        return loss * math.nan if self.calls in self.steps else loss


def _constant_schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # lr = base_lrs, closed form


def test_consecutive_rollbacks_compound_the_backoff_and_resume_restores_the_reduced_lr(tmp_path: Path) -> None:
    """Issue 27: k rollbacks in a row (no good step between) give lr_factor**k of the snapshot's rate, not 0.5 each."""
    path = tmp_path / "run.ckpt"
    guard = NonFiniteGuard(max_consecutive=1, lr_factor=0.5, max_rollbacks=3)
    trainer = Trainer(
        _model(), _NaNSteps({2, 3, 4}), lr=0.1, guard=guard, scheduler=_constant_schedule, scheduler_interval="step"
    )
    trainer.checkpoint = path
    with pytest.warns(TrainingWarning):
        history = trainer.fit(_data(), epochs=1, batch_size=25)  # 3 bad steps in a row, then 4 good ones
    rollbacks = [e["message"] for e in history.events if "rolled back" in e["message"]]
    assert [re.search(r"learning rate to (\S+) ", m).group(1) for m in rollbacks] == ["0.05", "0.025", "0.0125"]
    assert trainer.lr == pytest.approx(0.1 / 8) and trainer.scheduler.base_lrs == pytest.approx([0.1 / 8])
    assert guard.rollbacks_in_a_row == 0  # the good steps after the third rollback reset the count

    resumed = Trainer(_model(), lr=0.1, scheduler=_constant_schedule, scheduler_interval="step").resume(path)
    assert resumed.lr == pytest.approx(0.1 / 8) and resumed.scheduler.base_lrs == pytest.approx([0.1 / 8])
    resumed.fit(_data(), epochs=2, batch_size=25)
    assert resumed.history["lr"][-1] == pytest.approx(0.1 / 8)


def test_a_good_step_between_rollbacks_resets_the_backoff_to_one_factor() -> None:
    """The other direction: bad, good, bad gives one halving of the snapshot's rate at both rollbacks."""
    guard = NonFiniteGuard(max_consecutive=1, lr_factor=0.5, max_rollbacks=3)
    trainer = Trainer(_model(), _NaNSteps({2, 4}), lr=0.1, guard=guard)
    with pytest.warns(TrainingWarning):
        history = trainer.fit(_data(), epochs=1, batch_size=25)
    rollbacks = [e["message"] for e in history.events if "rolled back" in e["message"]]
    assert [re.search(r"learning rate to (\S+) ", m).group(1) for m in rollbacks] == ["0.05", "0.05"]
    assert all("rollback 1 in a row" in m for m in rollbacks)
    assert trainer.lr == pytest.approx(0.05)


def test_guard_state_dict_keeps_the_rollbacks_in_a_row_and_reads_older_checkpoints() -> None:
    guard = NonFiniteGuard()
    guard.rollbacks_in_a_row = 2
    again = NonFiniteGuard()
    again.load_state_dict(guard.state_dict())
    assert again.rollbacks_in_a_row == 2
    again.load_state_dict({"consecutive": 0, "skipped": 1, "rollbacks": 1})  # saved before the count existed
    assert again.rollbacks_in_a_row == 0


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="SIGHUP is POSIX")
def test_sighup_stops_training_at_a_step_boundary_like_sigint(tmp_path: Path) -> None:
    """A closed terminal (SIGHUP) stops like Ctrl-C: a whole number of steps in the checkpoint, the signal recorded."""

    class _HangUp(Callback):
        def on_step_end(self, trainer, metrics) -> None:
            if trainer.step == 3:
                os.kill(os.getpid(), signal.SIGHUP)

    previous = signal.getsignal(signal.SIGHUP)
    trainer = Trainer(_model(), lr=1e-2, checkpoint=tmp_path / "run.ckpt", callbacks=[_HangUp()])
    trainer.fit(_data(), epochs=5, batch_size=25)
    assert trainer.interrupted == signal.SIGHUP and trainer.step == 3
    assert signal.getsignal(signal.SIGHUP) == previous  # the handler is put back
    resumed = Trainer(_model(), lr=1e-2, callbacks=[_HangUp()]).resume(tmp_path / "run.ckpt")
    assert resumed.step == 3


# -- 3. early stopping keeps the best weights whatever the patience --------------------------------------------------
@pytest.mark.parametrize(("patience", "epochs"), [(0, [1, 2, 3]), (2, [1, 2, 3, 4]), (None, [1, 2, 3, 4, 5])])
def test_early_stopping_counts_patience_exactly_and_always_ends_with_the_best_weights(patience, epochs) -> None:
    snapshots, stopper = _Snapshots(), EarlyStopping(patience=patience)
    trainer = Trainer(_model(), _ScriptedValidation([3.0, 1.0, 2.0, 1.5, 1.2]), lr=1e-2, callbacks=[snapshots, stopper])
    history = trainer.fit(_data(100), _data(20, 1), epochs=5, batch_size=50)
    assert history["epoch"] == epochs  # patience p: stop after p epochs without improvement (None: never)
    assert stopper.best_epoch == 2
    final = trainer.model.state_dict()
    assert all(torch.equal(final[k], v) for k, v in snapshots.states[2].items())
    assert not torch.equal(final["transform.transforms.1.conditioner.net.0.weight"],
                           snapshots.states[epochs[-1]]["transform.transforms.1.conditioner.net.0.weight"])  # fmt: skip


def test_early_stopping_says_so_when_no_epoch_had_a_finite_metric() -> None:
    trainer = Trainer(_model(), _ScriptedValidation([math.nan, math.nan]), callbacks=[EarlyStopping(patience=None)])
    with pytest.warns(TrainingWarning, match="expected a finite val_loss in some epoch, got none in 2"):
        history = trainer.fit(_data(100), _data(20, 1), epochs=2, batch_size=50)
    assert "the model keeps its last weights" in history.events[-1]["message"]


def test_cli_patience_zero_saves_the_best_epoch_weights(tmp_path: Path) -> None:
    out = tmp_path / "iris"
    assert main(["fit", "--data", "iris", "--epochs", "3", "--patience", "0", "--out", str(out), *TINY]) == 0
    stopper = load_checkpoint(out / "checkpoint.ckpt").state["callbacks"][0]
    model = flows.load_model(out).state_dict()
    assert stopper["best_epoch"] is not None and stopper["stopped_epoch"] is None  # kept the best, never stopped
    assert all(torch.equal(model[k], v) for k, v in stopper["best_state"].items())


# -- 4. --resume is honest -------------------------------------------------------------------------------------------
def test_resume_refuses_changed_run_flags_and_records_changed_stopping_rules(tmp_path: Path, capsys) -> None:
    out = tmp_path / "iris"
    argv = ["fit", "--data", "iris", "--epochs", "2", "--patience", "5", "--out", str(out), *TINY]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--lr", "0.01", "--batch-size", "32", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume: expected the settings of the run" in err
    assert "--lr 0.01 (the run has 0.002)" in err and "--batch-size 32 (the run has 128)" in err
    assert json.loads((out / "run.json").read_text())["fit"]["lr"] == 0.002  # nothing recorded for a refused run
    assert main([*argv, "--schedule", "none", "--resume"]) == 2
    assert "--schedule none (the run has cosine)" in capsys.readouterr().err

    longer = [*argv[:4], "3", *argv[5:], "--resume"]
    assert main(longer) == 0  # the same run, trained for one more epoch
    run = json.loads((out / "run.json").read_text())
    assert run["fit"]["epochs"] == 3 and run["result"]["epochs"] == 3
    assert run["resumes"] == [{"step": 2 * 1, "epoch": 2, "changed": {"epochs": [2, 3]}}]
    events = load_checkpoint(out / "checkpoint.ckpt").state["history"]["events"]
    assert any("resumed at epoch 2 with --epochs 3 (was 2)" in e["message"] for e in events)
    assert main([*argv[:4], "3", *argv[5:], "--resume"]) == 0  # same flags: resumes (nothing left to train)
    assert json.loads((out / "run.json").read_text())["resumes"][-1]["changed"] == {}


def test_resume_refuses_another_objective_or_flow_matching_setting(tmp_path: Path, capsys) -> None:
    out = tmp_path / "moons"
    cnf = ["--model", "FFJORD", "--transforms", "1", "--hidden", "8", "--objective", "fm", "--sigma", "0.1"]
    argv = ["fit", "--data", "moons", "--epochs", "1", "--out", str(out), *TINY, *cnf]
    assert main(argv) == 0
    capsys.readouterr()
    for flags, expected in (
        (["--objective", "ml", "--sigma", "0"], "--objective ml (the run has fm)"),
        (["--sigma", "0.2"], "--sigma 0.2 (the run has 0.1)"),
        (["--coupling", "ot"], "--coupling ot (the run has independent)"),
        (["--velocity", "stable"], "--velocity stable (the run has conditional)"),
        (["--velocity", "stable", "--reference-size", "64"], "--reference-size 64 (the run has 512)"),
        (["--time-power", "2"], "--time-power 2.0 (the run has 1.0)"),
    ):
        assert main([*argv, *flags, "--resume"]) == 2, flags
        err = capsys.readouterr().err
        assert "--resume: expected the settings of the run" in err and expected in err, err
    assert main([*argv[:4], "2", *argv[5:], "--resume"]) == 0  # the same settings resume


# -- 5 and 6. early first checkpoint, SIGKILL then resume, stale temporaries, one writer per run ---------------------
def test_first_checkpoint_comes_after_the_first_epoch_whatever_the_interval(tmp_path: Path) -> None:
    seen = []

    class Look(Callback):
        def on_epoch_start(self, trainer) -> None:
            seen.append((trainer.epoch, (tmp_path / "run.ckpt").is_file()))

    trainer = Trainer(_model(), checkpoint=tmp_path / "run.ckpt", checkpoint_every=1e9, callbacks=[Look()])
    trainer.fit(_data(), epochs=3, batch_size=50)
    assert seen == [(0, False), (1, True), (2, True)]
    assert read_checkpoint_header(tmp_path / "run.ckpt")["info"]["step"] == 12


def test_first_checkpoint_comes_after_a_few_seconds_inside_a_long_epoch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trainer_module, "FIRST_CHECKPOINT_SECONDS", 0.0)
    steps = []

    class Look(Callback):
        def on_step_end(self, trainer, metrics) -> None:
            steps.append((tmp_path / "run.ckpt").is_file())

    trainer = Trainer(_model(), checkpoint=tmp_path / "run.ckpt", checkpoint_every=1e9, callbacks=[Look()])
    trainer.fit(_data(), epochs=1, batch_size=50)
    assert steps == [False, True, True, True]  # written after step 1 (the hook runs before the save)


def test_sigkill_early_then_resume_and_a_second_writer_is_refused_while_the_first_lives(tmp_path: Path, capsys) -> None:
    out = tmp_path / "wine"
    argv = ["fit", "--data", "wine", "--epochs", "400", "--batch-size", "16", "--out", str(out), *TINY]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "flows.cli", *argv, "--checkpoint-every", "1e9"]  # only the early first save
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.ckpt").is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read().decode()
        assert (out / "checkpoint.ckpt").is_file(), "no first checkpoint within 120 s"
        for second in ([*argv, "--resume"], [*argv, "--overwrite"]):
            assert main(second) == 2
            err = capsys.readouterr().err
            assert (
                f"is in use: expected no other process writing to 'checkpoint.ckpt', got process {process.pid}" in err
            )
        with pytest.raises(RunLockedError, match=str(process.pid)):
            Trainer(_model(), checkpoint=out / "checkpoint.ckpt").fit(_data(), epochs=1)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    info = read_checkpoint_header(out / "checkpoint.ckpt")["info"]
    step = info["step"]
    assert step >= 1
    stale = [out / ".checkpoint.ckpt.0123abcd.tmp", out / ".run.json.0123abcd.tmp"]  # as a kill mid-save leaves them
    for path in stale:
        path.write_bytes(b"half a file")
    finish = [*argv[:4], str(info["epoch"] + 1), *argv[5:], "--resume"]  # one more epoch
    assert main(finish) == 0  # the lock died with its holder
    assert not any(path.exists() for path in stale)
    run = json.loads((out / "run.json").read_text())
    assert run["resumes"][0]["step"] == step and run["result"]["steps"] > step


def test_the_lock_is_exclusive_between_processes_reentrant_within_one_and_free_after_its_holder_dies(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "run" / "c.ckpt"
    holder = (
        "import importlib.util, sys, time\n"  # stdlib only: starts in milliseconds
        "spec = importlib.util.spec_from_file_location('_lock', sys.argv[1])\n"
        "lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock)\n"
        "with lock.hold_run_lock(sys.argv[2]):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(ROOT / "flows/train/_lock.py"), str(checkpoint)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"got process {process.pid} holding"):
            with hold_run_lock(checkpoint):
                pass
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
    with hold_run_lock(checkpoint), hold_run_lock(checkpoint):  # free again; re-entrant in this process
        assert lock_path(checkpoint).read_text().strip() == str(os.getpid())
    assert lock_path(checkpoint).read_text() == ""


# -- 8. files keep the user's umask ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_writes_keep_the_umask(tmp_path: Path, mask: int) -> None:
    previous = os.umask(mask)
    try:
        path = atomic_write_bytes(tmp_path / "a.bin", b"x")
        atomic_write_text(path, "replaced")  # replacing an existing file, too
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert path.read_text() == "replaced" and [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_run_files_keep_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        assert main(["fit", "--data", "iris", "--epochs", "1", "--out", str(tmp_path / "r"), *TINY]) == 0
    finally:
        os.umask(previous)
    for name in ("run.json", "checkpoint.ckpt", "metrics.json", "metrics.csv", "model.safetensors", "model.json"):
        assert stat.S_IMODE((tmp_path / "r" / name).stat().st_mode) == 0o644, name


def test_remove_stale_temporaries_removes_only_the_atomic_writes_leftovers(tmp_path: Path) -> None:
    for name in (".c.ckpt.ab12.tmp", ".run.json.cd34.tmp", "c.ckpt", "notes.tmp", ".c.ckpt.lock"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in remove_stale_temporaries(tmp_path, "c.ckpt")] == [".c.ckpt.ab12.tmp"]
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [".run.json.cd34.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".c.ckpt.lock", "c.ckpt", "notes.tmp"]
