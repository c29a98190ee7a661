"""The flows command on bad input: one-line errors, documented exit codes, data fingerprints, honest output paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.cli import EXIT_CODES, main
from flows.data import load_dataset
from flows.data.dataset import data_fingerprint
from tests.cli_support import one_line_error

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sklearn", reason="the embedded data sets ship with scikit-learn (test extra)")

TINY = ["--transforms", "1", "--hidden", "4", "--threads", "1", "--epochs", "1", "--no-plots", "--quiet"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and standard error of ``flows ARGV`` (argparse errors exit through SystemExit)."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    return code, err


@pytest.fixture(scope="module")
def moons_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "moons"
    assert main(["fit", "--data", "moons", "--out", str(out), *TINY]) == 0
    return out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "RUN", "--draws", "0"], r"argument --draws: expected a number of draws between 1 and \d+, got 0"),
        (["eval", "RUN", "--draws", "-1"], r"argument --draws: expected a number of draws between 1 and \d+, got -1"),
        (["eval", "RUN", "--draws", "ten"], r"argument --draws: expected a number of draws, got 'ten'"),
        (["check", "RUN", "--num", "0"], r"argument --num: expected a number of test points >= 1, got 0"),
        (["check", "RUN", "--atol", "nan"], r"argument --atol: expected a finite number > 0, got nan"),
        (["sample", "RUN", "-n", "-3"], r"argument -n/--num: expected a number of samples >= 1, got -3"),
        (["sample", "RUN", "--seed", str(2**70)], r"argument --seed: expected a seed between 0 and \d+, got \d+"),
        (["fit", "--val-fraction", "0"], r"argument --val-fraction: expected a finite number > 0 and < 1, got 0"),
        (["fit", "--test-fraction", "1"], r"argument --test-fraction: expected a finite number >= 0 and < 1, got 1"),
        (["fit", "--seed", str(2**70)], r"argument --seed: expected a seed between 0 and 9223372036854775807"),
        (["fit", "--seed", "-1"], r"argument --seed: expected a seed between 0"),
        (["fit", "--epochs", "0"], r"argument --epochs: expected a number of epochs >= 1, got 0"),
        (["fit", "--batch-size", "0"], r"argument --batch-size: expected a batch size >= 1, got 0"),
        (["fit", "--lr", "0"], r"argument --lr: expected a number > 0, got 0"),
        (["fit", "--lr", "nan"], r"argument --lr: expected a number > 0, got nan"),
        (["fit", "--lr", "abc"], r"argument --lr: expected a number, got 'abc'"),
        (["fit", "--clip", "-1"], r"argument --clip: expected a finite number >= 0, got -1"),
        (["fit", "--time-budget", "0"], r"argument --time-budget: expected a finite number > 0, got 0"),
        (["fit", "--checkpoint-every", "inf"], r"argument --checkpoint-every: expected a finite number >= 0, got inf"),
        (["fit", "--patience", "-1"], r"argument --patience: expected a number of epochs >= 0, got -1"),
        (["fit", "--transforms", "100000000"], r"argument --transforms: expected a number of layers between 1 and"),
        (["fit", "--hidden", "99999999999"], r"argument --hidden: expected positive widths of at most"),
        (["fit", "--threads", "100000"], r"argument --threads: expected a number of threads between 1 and"),
        (["fit", "--nproc", "0"], r"argument --nproc: expected a number of processes between 1 and 1024, got 0"),
        (["fit", "--levels", "1"], r"argument --levels: expected an integer number of levels >= 2, got 1"),
        (["fit", "--option", "=3"], r"argument --option: expected KEY=VALUE"),
    ],
)
def test_bad_option_values_are_one_line_with_status_2(argv, message, capsys, tmp_path: Path) -> None:
    argv = [str(tmp_path / "run") if a == "RUN" else a for a in argv]
    code, err = _run(argv, capsys)
    assert code == 2
    line = one_line_error(err, argv[0])
    assert re.search(message, line), line


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"expected a CSV table with at least one row of numbers, got an empty file"),
        ("a,b\n", r"expected at least one row of numbers below the header, got none"),
        (
            "a,b\n1,2\n3,4\n1e30,5\n" + "1,2\n" * 20,
            r"bad.csv: expected values of magnitude at most 1.8e\+19, .* line 4",
        ),
        ("1,2\n3,4\nnan,5\n" + "1,2\n" * 20, r"bad.csv: expected finite values, .* the first at line 3, column 1"),
        ("1,2\n3,4\n5,inf\n" + "1,2\n" * 20, r"bad.csv: expected finite values, .* the first at line 3, column 2"),
        ("1,2\n3,x\n", r"expected a numeric CSV table"),
        ("1,2\n", r"expected at least 2 training rows after the splits, got 1"),
    ],
)
def test_bad_csv_files_are_named_with_their_line(content: str, message: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.csv").write_text(content)
    code, err = _run(["fit", "--data", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "o"), *TINY], capsys)
    assert code == 2
    assert re.search(message, one_line_error(err, "fit"))
    assert not (tmp_path / "o").exists()  # nothing was written for a refused input


def test_os_errors_exit_2_with_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "garbage.npy").write_bytes(b"garbage")
    cases = [
        (["fit", "--data", str(tmp_path / "missing.csv")], "no such data file"),
        (["fit", "--data", str(tmp_path)], "got the directory"),
        (["fit", "--data", str(tmp_path / "garbage.npy")], "expected a .npy array of numbers"),
        (["fit", "--data", "moons", "--out", str(tmp_path / "afile")], "--out: expected a directory, got the file"),
        (["fit", "--data", "moons", "--out", str(tmp_path / "afile" / "sub")], "is a file, not a directory"),
        (["fit", "--data", "moons", "--key", "x"], "key= and levels= apply to data files"),
        (["eval", str(tmp_path / "missing")], "no run directory or model file at"),
        (["check", str(tmp_path / "afile")], "expected a run directory, a model file (.safetensors or .json) or a"),
        (["check", str(tmp_path / "afile.ckpt")], "no run directory or model file at"),
    ]
    for argv, message in cases:
        if argv[0] == "fit" and "--out" not in argv:
            argv = [*argv, "--out", str(tmp_path / "o")]
        code, err = _run([*argv, *(TINY if argv[0] == "fit" else [])], capsys)
        assert code == 2, (argv, err)
        assert message in one_line_error(err, argv[0])


def test_an_unreadable_data_file_is_an_os_error_with_status_2(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "t.csv").write_text("1,2\n" * 30)
    real_open = open

    def refuse(file, *args, **kwargs):
        if str(file).endswith("t.csv"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)
    code, err = _run(["fit", "--data", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o"), *TINY], capsys)
    assert code == 2
    assert one_line_error(err, "fit").endswith(f"{str(tmp_path / 't.csv')!r}: permission denied")


def test_option_values_are_checked_against_the_builder(tmp_path: Path, capsys) -> None:
    for option, message in (
        ("clamp=abc", "--option clamp: expected float or null such as clamp=3.0, got 'abc'"),
        ("clamp=NaN", "--option clamp=nan: expected a finite number"),
        ("bogus=3", "--option bogus=...: expected one of RealNVP's options"),
        ("share_conditioner=2", "--option share_conditioner: expected bool such as share_conditioner=false, got 2"),
    ):
        code, err = _run(["fit", "--data", "moons", "--option", option, "--out", str(tmp_path / "o"), *TINY], capsys)
        assert code == 2
        assert message in one_line_error(err, "fit")


def test_an_internal_error_is_one_line_with_status_3(tmp_path: Path, capsys, monkeypatch) -> None:
    from flows.cli import models as models_command

    def broken(args):
        raise KeyError("oops")

    monkeypatch.setattr(models_command, "models", broken)
    monkeypatch.delenv("FLOWS_TRACEBACK", raising=False)
    code, err = _run(["models"], capsys)
    assert code == 3
    assert "internal error (KeyError: 'oops'); set FLOWS_TRACEBACK=1" in one_line_error(err, "models")
    monkeypatch.setenv("FLOWS_TRACEBACK", "1")
    with pytest.raises(KeyError, match="oops"):
        main(["models"])


def test_exit_codes_are_documented_in_the_help_epilog(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for code in EXIT_CODES:
        assert f"\n  {code:>3}  " in text
    docs = (ROOT / "docs" / "guide" / "cli.md").read_text()
    for code in EXIT_CODES:
        assert f"| {code} |" in docs


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "sample", str(tmp_path / "afile")],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("flows sample: error: ")


def test_sample_reports_the_paths_it_wrote(moons_run: Path, tmp_path: Path, capsys) -> None:
    assert main(["sample", str(moons_run), "-n", "5", "--out", str(tmp_path / "noext")]) == 0
    printed = capsys.readouterr().out
    assert f"to {tmp_path / 'noext.npy'} and a picture to {tmp_path / 'noext.png'}" in printed
    assert np.load(tmp_path / "noext.npy").shape == (5, 2) and (tmp_path / "noext.png").is_file()
    code, err = _run(["sample", str(moons_run), "--out", str(tmp_path)], capsys)
    assert code == 2 and "--out: expected a file path, got the directory" in one_line_error(err, "sample")
    assert not (tmp_path.parent / f"{tmp_path.name}.npy").exists()
    code, err = _run(["sample", str(moons_run), "--out", str(tmp_path / "s.npy"), "--picture", "x.xyz"], capsys)
    assert code == 2 and "--picture: expected a file name ending in one of" in one_line_error(err, "sample")
    assert not (tmp_path / "s.npy").exists()  # refused before sampling, not after


def test_data_fingerprint_follows_the_values() -> None:
    a = data_fingerprint(load_dataset("moons"))
    assert a == data_fingerprint(load_dataset("moons")) and len(a["sha256"]) == 64
    assert a != data_fingerprint(load_dataset("moons", seed=1))  # other splits are other data
    assert "file_sha256" not in a


def test_runs_record_their_data_and_refuse_changed_data(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    table = tmp_path / "table.csv"
    np.savetxt(table, rng.normal(size=(60, 2)), delimiter=",")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(table), "--out", str(out), *TINY]) == 0
    run = json.loads((out / "run.json").read_text())
    recorded = run["data_fingerprint"]
    assert recorded == data_fingerprint(load_dataset(table)) and len(recorded["file_sha256"]) == 64
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0  # unchanged data: no warning
    assert "warning" not in capsys.readouterr().err

    np.savetxt(table, rng.normal(size=(60, 2)), delimiter=",")  # same shape, other values
    code, err = _run(["eval", str(out)], capsys)
    assert code == 2
    line = one_line_error(err, "eval")
    assert "the data changed since the run" in line and f"expected data with sha256 {recorded['sha256'][:16]}" in line
    assert "--allow-changed-data" in line and "table.csv' was modified" in line
    code, err = _run(["check", str(out)], capsys)
    assert code == 2 and "the data changed since the run" in one_line_error(err, "check")

    assert main(["eval", str(out), "--allow-changed-data"]) == 0
    assert "flows eval: warning: the data changed since the run" in capsys.readouterr().err
    assert main(["sample", str(out), "-n", "3"]) == 0  # samples do not depend on the data: a warning only
    assert "flows sample: warning: the data changed" in capsys.readouterr().err

    code, err = _run(["fit", "--data", str(table), "--out", str(out), "--resume", *TINY], capsys)
    assert code == 2 and "the data changed since the run" in one_line_error(err, "fit")


def test_reformatting_a_file_keeps_its_values_and_its_run(tmp_path: Path, capsys) -> None:
    table = tmp_path / "table.csv"
    values = np.random.default_rng(1).normal(size=(60, 2)).astype(np.float32)
    np.savetxt(table, values, delimiter=",", fmt="%.9g")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(table), "--out", str(out), *TINY]) == 0
    table.write_text("x,y\n" + "".join(f"{a!r}, {b!r}\n" for a, b in values.tolist()))  # header, spaces
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_options_the_command_line_cannot_carry_are_refused(tmp_path: Path, capsys) -> None:
    for argv, message in (
        (["--option", "activation=Foo"], "--option activation: expected a plain value (number, string, bool, null)"),
        (["--option", "hidden=[0]"], "--option hidden=...: expected --hidden to set the hidden"),
        (["--model", "Glow"], "--model Glow: expected a builder that flows fit can build and train"),
    ):
        code, err = _run(["fit", "--data", "moons", *argv, "--out", str(tmp_path / "o"), *TINY], capsys)
        assert code == 2
        assert message in one_line_error(err, "fit")


def test_sample_warns_about_non_finite_samples(moons_run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from flows.cli import evaluate

    broken = torch.nn.Module()
    broken.sample = lambda shape: torch.full((*shape, 2), float("nan"))
    monkeypatch.setattr(evaluate, "load_run_model", lambda args, command, **kwargs: (broken, None))
    assert main(["sample", str(moons_run), "-n", "4", "--out", str(tmp_path / "s.npy")]) == 0
    captured = capsys.readouterr()
    assert "flows sample: warning: 4 of 4 samples have non-finite values" in captured.err
    assert f"to {tmp_path / 's.npy'} (no picture: none is finite)" in captured.out
    assert np.isnan(np.load(tmp_path / "s.npy")).all() and not (tmp_path / "s.png").exists()
