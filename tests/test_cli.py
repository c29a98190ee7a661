"""The flows command: fit/eval/sample/check on small data, clear errors, exit codes, SIGKILL and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from flows import Flow, load_model
from flows.cli import main
from flows.train import load_checkpoint, read_checkpoint_header, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")

TINY = ["--transforms", "2", "--hidden", "16", "--threads", "1"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_fit_eval_sample_check_on_a_2d_toy(tmp_path: Path, capsys) -> None:
    out = tmp_path / "moons"
    assert main(["fit", "--data", "moons", "--epochs", "2", "--out", str(out), "--no-plots", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "data moons: 2100 train / 300 val / 600 test, 2 dimensions" in printed
    assert "test log-likelihood:" in printed
    for name in (
        "run.json",
        "model.safetensors",
        "model.json",
        "checkpoint.ckpt",
        "metrics.json",
        "metrics.csv",
    ):
        assert (out / name).is_file(), name
    run = json.loads((out / "run.json").read_text())
    assert run["data"]["name"] == "moons" and run["result"]["epochs"] == 2
    assert len(json.loads((out / "metrics.json").read_text())["records"]) == 2

    assert main(["eval", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 600 and result["log_likelihood"] == pytest.approx(run["result"]["test"]["log_likelihood"])

    assert main(["sample", str(out), "-n", "10", "--out", str(tmp_path / "s.npy")]) == 0
    assert np.load(tmp_path / "s.npy").shape == (10, 2) and (tmp_path / "s.png").is_file()

    assert main(["check", str(out)]) == 0
    table = capsys.readouterr().out
    assert "Standardize" in table and "AffineCoupling" in table and "every layer passed" in table


def test_standardisation_is_part_of_the_saved_density(tmp_path: Path) -> None:
    """log_prob of raw data = log_prob of standardised data through the rest - sum log sigma."""
    data = torch.randn(300, 3, generator=torch.Generator().manual_seed(0)) * torch.tensor([100.0, 0.01, 1.0]) + 50
    np.save(tmp_path / "table.npy", data.numpy())
    out = tmp_path / "run"
    assert (
        main(
            [
                "fit",
                "--data",
                str(tmp_path / "table.npy"),
                "--epochs",
                "1",
                "--out",
                str(out),
                "--quiet",
                "--no-plots",
                *TINY,
            ]
        )
        == 0
    )
    model = load_model(out)
    standardize = model.transform.transforms[0]
    assert type(standardize).__name__ == "Standardize"
    x = data[:5]
    z = standardize(x)
    assert type(model).__name__ == "RealNVP"  # preprocessing keeps the builder's class
    rest = Flow(model.core, model.base)
    expected = rest.log_prob(z) - standardize.scale.log().sum()
    torch.testing.assert_close(model.log_prob(x), expected)


def test_digits_bits_per_dim_and_image_pictures(tmp_path: Path, capsys) -> None:
    out = tmp_path / "digits"
    assert main(["fit", "--epochs", "1", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "test bits/dim:" in printed and "17 levels" in printed
    for picture in ("samples.png", "curves.png"):
        assert (out / picture).stat().st_size > 1000
    bpd = json.loads((out / "run.json").read_text())["result"]["test"]["bits_per_dim"]
    assert 0.5 < bpd < 5.0  # log2(17) = 4.09 bits is the uniform density; one epoch already beats it
    assert main(["check", str(out)]) == 0  # the Logit layer gets dequantized test data, in [0, 1]
    table = capsys.readouterr().out
    assert "Logit" in table and "\n     all  Chain" in table and "every layer passed" in table


def test_errors_are_clear_and_exit_non_zero(tmp_path: Path, capsys) -> None:
    assert main(["fit", "--data", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "flows fit: error: unknown data set 'nope'" in capsys.readouterr().err
    assert main(["fit", "--data", "iris", "--model", "Bogus", "--out", str(tmp_path / "x")]) == 2
    assert "expected a builder among" in (err := capsys.readouterr().err) and "got 'Bogus'" in err
    assert main(["fit", "--data", "iris", "--model", "FreeFormInjectiveFlow", "--out", str(tmp_path / "x")]) == 2
    assert "not how FreeFormInjectiveFlow is trained" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "no run directory or model file at" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 2
    assert "no model.safetensors or checkpoint.ckpt" in capsys.readouterr().err
    (tmp_path / "fake.ckpt").write_bytes(b"not a checkpoint")
    assert main(["sample", str(tmp_path / "fake.ckpt")]) == 2
    assert "is not a flows checkpoint" in capsys.readouterr().err
    out = tmp_path / "iris"
    assert main(["fit", "--data", "iris", "--epochs", "1", "--out", str(out), "--quiet", "--no-plots", *TINY]) == 0
    assert main(["fit", "--data", "iris", "--epochs", "1", "--out", str(out), *TINY]) == 2
    assert "already holds a run (run.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--hidden", "a,b"])
    assert exit_info.value.code == 2 and "expected comma-separated integers" in capsys.readouterr().err


def test_help_lists_the_commands(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for command in ("fit", "eval", "sample", "check", "models"):
        assert command in text
    assert main(["models"]) == 0
    assert "RealNVP" in capsys.readouterr().out.split()


def test_nproc_relaunches_under_torchrun(monkeypatch) -> None:
    """--nproc N re-runs the same command under torch.distributed.run (the real launch is in the docs)."""
    calls = []

    def fake_run(command, env, check):
        calls.append((command, env))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert main(["fit", "--data", "iris", "--nproc", "2", "--epochs", "3"]) == 0
    command, env = calls[0]
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    assert command[6:] == ["flows.cli", "fit", "--data", "iris", "--epochs", "3"]
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)


def test_sigterm_stops_flows_fit_with_status_130_and_resume_finishes(tmp_path: Path, capsys) -> None:
    out = tmp_path / "wine"
    argv = ["fit", "--data", "wine", "--epochs", "400", "--patience", "0", "--out", str(out), "--no-plots", *TINY]

    def terminate_once_training() -> None:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.ckpt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=terminate_once_training)
    sender.start()
    status = main([*argv, "--checkpoint-every", "0"])
    sender.join()
    assert status == 130
    assert "stopped by signal 15" in capsys.readouterr().err and not (out / "model.safetensors").exists()
    info = read_checkpoint_header(out / "checkpoint.ckpt")["info"]
    assert 1 <= info["step"] < 400 * 8
    different = [*argv, "--hidden", "8", "--resume"]
    assert main(different) == 2
    assert "--resume: the model settings differ" in capsys.readouterr().err
    finish = [*argv[:4], str(info["epoch"] + 1), *argv[5:], "--resume"]  # a shorter run: ends soon
    assert main(finish) == 0
    assert (out / "model.safetensors").is_file() and f"resumed {str(out)!r}" in capsys.readouterr().out


def _fit_command(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "flows.cli", "fit", "--data", "wine", "--epochs", "12", "--batch-size", "16",
        "--patience", "0", "--out", str(out), "--quiet", "--no-plots", *TINY, *extra,
    ]  # fmt: skip


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    """Kill a training process with SIGKILL, resume it, and get bitwise the same model as without the kill."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reference = tmp_path / "reference"
    assert main(_fit_command(reference)[3:]) == 0

    killed = tmp_path / "killed"
    command = _fit_command(killed, "--checkpoint-every", "0")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    step = 0
    while time.monotonic() < deadline and process.poll() is None:
        try:
            step = read_checkpoint_header(killed / "checkpoint.ckpt")["info"]["step"]
        except Exception:  # not written yet, or being replaced right now
            step = 0
        if step >= 20:
            break
        time.sleep(0.05)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read().decode()}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    interrupted = load_checkpoint(killed / "checkpoint.ckpt")  # the last checkpoint survived the kill intact
    assert 20 <= interrupted.header["info"]["step"] < 12 * 8

    assert main(_fit_command(killed, "--resume")[3:]) == 0
    final = load_model(killed).state_dict()
    expected = load_model(reference).state_dict()
    for name, value in expected.items():
        assert torch.equal(final[name], value), name
    resumed_run = json.loads((killed / "run.json").read_text())["result"]
    assert resumed_run["steps"] == json.loads((reference / "run.json").read_text())["result"]["steps"]


_SAVER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_atomic", sys.argv[1])  # stdlib only: starts in milliseconds
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
versions = [open(name, "rb").read() for name in sys.argv[3:]]
i = 0
while True:
    atomic.atomic_write_bytes(sys.argv[2], versions[i % len(versions)])
    i += 1
    print(i, flush=True)
"""


def test_sigkill_during_saves_never_leaves_a_broken_checkpoint(tmp_path: Path) -> None:
    """A process rewriting a 6 MB checkpoint in a loop (the write path of save_checkpoint) is killed at
    random moments, ten times: the checkpoint always loads, as one of the versions written."""
    versions = []
    for i in range(2):
        save_checkpoint(tmp_path / f"v{i}.ckpt", {"i": i, "w": torch.full((1_500_000,), float(i))}, kind="model")
        versions.append(str(tmp_path / f"v{i}.ckpt"))
    path = tmp_path / "run" / "c.ckpt"
    atomic = str(ROOT / "flows" / "train" / "_atomic.py")
    rng = np.random.default_rng(0)
    for _ in range(10):
        process = subprocess.Popen([sys.executable, "-c", _SAVER, atomic, str(path), *versions], stdout=subprocess.PIPE)
        assert process.stdout.readline()  # at least one save completed
        time.sleep(float(rng.uniform(0.0, 0.2)))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
        state = load_checkpoint(path).state
        assert torch.equal(state["w"], torch.full((1_500_000,), float(state["i"])))
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "c.ckpt"]
    assert all(name.startswith(".c.ckpt.") and name.endswith(".tmp") for name in leftovers)


def test_fit_with_compile_trains_the_same_model(tmp_path: Path, capsys, monkeypatch) -> None:
    compiled = []
    original = torch.compile

    def spy(fn, **kwargs):
        compiled.append(kwargs)
        return original(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    results = []
    for extra in ([], ["--compile"]):
        out = tmp_path / f"moons{len(extra)}"
        assert main(["fit", "--data", "moons", "--epochs", "1", "--out", str(out), "--no-plots", *TINY, *extra]) == 0
        results.append(json.loads((out / "run.json").read_text())["result"]["test"]["log_likelihood"])
    capsys.readouterr()
    assert len(compiled) == 1, "--compile did not reach torch.compile (or the plain run compiled too)"
    assert results[1] == pytest.approx(results[0], rel=1e-4)


def test_help_opens_with_what_the_command_does(capsys) -> None:
    """The summary comes from the package's own words, not from an internal module's docstring."""
    import flows.cli

    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    first = flows.cli.__doc__.split("\n\n")[0].replace("``", "")
    assert first in out and "argument parser" not in out
    for command in ("fit", "eval", "sample", "check", "models"):
        assert command in out
