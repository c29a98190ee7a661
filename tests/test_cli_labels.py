"""Labelled data through the flows command: ``fit --labels``, ``eval --classify``, ``sample --class/--guidance``.

The oracles: labels stay with their rows through the seeded splits (each row's label is one the
raw data set gives that row), unlabelled splits and their fingerprint are those of runs written
before labels existed, the CLI's accuracy is :func:`flows.classify.bayes_classifier` computed here
on the same model and the same dequantized data, and guidance 0 draws what plain sampling draws.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import flows
from flows.cli import main
from flows.data import load_dataset
from flows.data.dataset import data_fingerprint, split_data, split_labelled
from tests.cli_support import one_line_error

pytest.importorskip("sklearn", reason="the digits data ship with scikit-learn (test extra)")

TARFLOW = ["--model", "TarFlow", "--transforms", "2", "--hidden", "16,16", "--option", "patch=2"]
QUICK = ["--epochs", "1", "--threads", "1", "--no-plots", "--quiet"]

#: ``data_fingerprint(load_dataset("digits"))["sha256"]`` as runs recorded it before labels existed (commit 97b7402):
#: unlabelled loading must not change it, or every existing run would read as trained on other data.
DIGITS_SHA256 = "42d4627e38b2da64f865da2b0d771ef3ecb1e82280982fed27571d099abacb8f"


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, standard output and standard error of ``flows ARGV``."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "digits-labels"
    assert main(["fit", "--data", "digits", "--labels", *TARFLOW, *QUICK, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "moons"
    argv = ["fit", "--data", "moons", "--transforms", "1", "--hidden", "4", *QUICK, "--out", str(out)]
    assert main(argv) == 0
    return out


def test_split_labelled_keeps_rows_and_labels_paired_and_cuts_the_rows_of_split_data() -> None:
    rows = torch.arange(50) * 7
    pieces = split_labelled(rows, torch.arange(50), (0.2, 0.1), seed=3)
    for (piece, labels), alone in zip(pieces, split_data(rows, (0.2, 0.1), seed=3), strict=True):
        assert torch.equal(piece, 7 * labels) and torch.equal(piece, alone)
    with pytest.raises(ValueError, match=r"expected one label per row \(50\), got 49"):
        split_labelled(rows, torch.arange(49), (0.2,))


def test_digits_labels_are_the_labels_of_their_rows_after_the_splits() -> None:
    import sklearn.datasets

    raw = sklearn.datasets.load_digits()
    seen: dict[bytes, set[int]] = {}
    for row, label in zip(raw.data.astype("uint8"), raw.target, strict=True):
        seen.setdefault(row.tobytes(), set()).add(int(label))
    data = load_dataset("digits", labels=True, seed=5)
    plain = load_dataset("digits", seed=5)
    assert data.num_classes == 10 and "10 classes" in data.describe()
    for split in ("train", "val", "test"):
        rows, labels = getattr(data, split), data.labels_of(split)
        assert labels.dtype == torch.int64 and labels.shape == (len(rows),)
        assert torch.equal(rows, getattr(plain, split))  # the rows of labels=False
        assert all(int(y) in seen[bytes(r.numpy().astype("uint8"))] for r, y in zip(rows, labels, strict=True))
    assert set(data.train_labels.tolist()) == set(range(10))


def test_mnist_labels_are_split_with_the_rows(monkeypatch) -> None:
    import flows.data.dataset as dataset

    def fake_mnist(data_dir=None, *, image=True, verify=True, labels=False):
        rows = torch.arange(200 * 4).reshape(200, 4) % 256
        y = rows[:, 0] % 10
        return ((rows, y), (rows[:20], y[:20])) if labels else (rows, rows[:20])

    monkeypatch.setattr(dataset, "load_mnist", fake_mnist)
    data = load_dataset("mnist", labels=True)
    assert data.num_classes == 10 and len(data.val_labels) == 20 and torch.equal(data.test_labels, data.test[:, 0] % 10)
    for split in ("train", "val"):
        assert torch.equal(data.labels_of(split), getattr(data, split)[:, 0] % 10)


def test_unlabelled_loading_keeps_its_fingerprint_and_labels_change_it() -> None:
    plain, labelled = load_dataset("digits"), load_dataset("digits", labels=True)
    assert data_fingerprint(plain)["sha256"] == DIGITS_SHA256
    assert plain.train_labels is None and plain.num_classes is None
    assert data_fingerprint(labelled)["sha256"] != DIGITS_SHA256
    with pytest.raises(ValueError, match=r"labels=True: expected a data set with labels \(digits, mnist\), got 'iris'"):
        load_dataset("iris", labels=True)


def test_fit_labels_records_them_and_eval_classify_is_bayes_classifier(labelled_run: Path, capsys) -> None:
    from flows.classify import bayes_classifier
    from flows.data.dequantization import uniform_dequantize

    record = json.loads((labelled_run / "run.json").read_text())
    assert record["data"]["labels"] is True and record["result"]["test"]["conditional"] is True
    assert json.loads((labelled_run / "model.json").read_text())["info"]["data"]["labels"] is True
    code, out, _ = _run(["eval", labelled_run, "--classify", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert 0 <= result["accuracy"] <= 1 and result["n"] == 360 and result["num_classes"] == 10
    model, data = flows.load_model(labelled_run).eval(), load_dataset("digits", labels=True)
    assert model.num_classes == 10 and [p["layer"] for p in model.preprocessing] == ["Logit"]
    x = uniform_dequantize(data.test, 17, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    with torch.no_grad():
        expected = (bayes_classifier(model, x, 10).argmax(-1) == data.test_labels).double().mean().item()
    assert result["accuracy"] == pytest.approx(expected, abs=1e-12)
    code, out, _ = _run(["eval", labelled_run, "--classify"], capsys)
    assert code == 0 and out.strip() == f"test accuracy: {expected:.3f} (360 samples, 10 classes, Bayes rule)"
    code, out, _ = _run(["eval", labelled_run], capsys)  # the log-likelihood is the conditional one, and says so
    assert code == 0 and "test log-likelihood (conditional, log p(x|y)):" in out


def test_the_conditional_test_log_likelihood_of_fit_is_log_p_x_given_y(labelled_run: Path, capsys) -> None:
    from flows.train.runs import evaluate_log_likelihood

    record = json.loads((labelled_run / "run.json").read_text())["result"]["test"]
    model, data = flows.load_model(labelled_run), load_dataset("digits", labels=True)
    given = evaluate_log_likelihood(
        model, data.test, levels=17, draws=10, context=model.class_context(data.test_labels)
    )
    wrong = evaluate_log_likelihood(
        model, data.test, levels=17, draws=10, context=model.class_context((data.test_labels + 1) % 10)
    )
    assert record["log_likelihood"] == pytest.approx(given["log_likelihood"], rel=1e-6)
    assert given["log_likelihood"] != wrong["log_likelihood"]


def test_sample_class_writes_n_samples_and_guidance_0_is_plain_sampling(labelled_run: Path, tmp_path, capsys) -> None:
    files = {name: tmp_path / f"{name}.npy" for name in ("plain", "zero", "two")}
    for name, extra in (("plain", []), ("zero", ["--guidance", "0"]), ("two", ["--guidance", "2"])):
        code, out, _ = _run(["sample", labelled_run, "--class", "3", "-n", "5", *extra, "--out", files[name]], capsys)
        assert code == 0 and f"wrote 5 samples of shape (64,) to {files[name]}" in out
    plain, zero, two = (np.load(files[name]) for name in ("plain", "zero", "two"))
    assert plain.shape == (5, 64) and np.isfinite(plain).all()
    np.testing.assert_allclose(zero, plain, rtol=1e-5, atol=1e-5)
    assert not np.allclose(two, plain, rtol=1e-5, atol=1e-5)  # the weight reaches the decoder
    model = flows.load_model(labelled_run).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        expected = model.sample(context=model.class_context(torch.full((5,), 3)))
    np.testing.assert_allclose(plain, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_sample_without_class_cycles_through_the_classes_and_says_so(
    labelled_run: Path, tmp_path, capsys, monkeypatch
) -> None:
    import flows.plot

    titles = []
    monkeypatch.setattr(flows.plot, "plot_image_grid", lambda *a, title="", **k: titles.append(title))
    code, _, _ = _run(["sample", labelled_run, "-n", "12", "--out", tmp_path / "all.npy"], capsys)
    assert code == 0 and titles == ["12 samples, classes 0..9 in turn"]
    model = flows.load_model(labelled_run).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        expected = model.sample(context=model.class_context(torch.arange(12) % 10))
    np.testing.assert_allclose(np.load(tmp_path / "all.npy"), expected.numpy(), rtol=1e-6, atol=1e-6)


def test_check_runs_a_labelled_model_at_its_classes(labelled_run: Path, capsys) -> None:
    code, out, _ = _run(["check", labelled_run, "--num", "2"], capsys)
    assert code == 0 and "every layer passed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["fit", "--data", "iris", "--labels", *TARFLOW],
            r"--labels: expected --data with class labels \(digits, mnist\)",
        ),
        (["fit", "--data", "digits", "--labels", "--model", "RealNVP"], r"--labels: expected a builder that takes "),
        (
            ["fit", "--data", "digits", *TARFLOW, "--option", "num_classes=3"],
            r"--option num_classes=...: expected --labels",
        ),
        (["sample", "LABELLED", "--class", "10"], r"--class 10: expected a class in 0\.\.9, got 10"),
        (["sample", "LABELLED", "--schedule", "linear"], r"--schedule linear: expected it with --guidance"),
        (["sample", "LABELLED", "--denoise"], r"--denoise: expected a model trained with noise augmentation"),
        (["sample", "PLAIN", "--guidance", "1"], r"--guidance 1.0: expected a class-conditional model .* got RealNVP"),
        (["sample", "PLAIN", "--class", "2"], r"--class 2: expected a class-conditional model .* got RealNVP"),
        (["eval", "PLAIN", "--classify"], r"--classify: expected a run of a class-conditional flow .* has no classes"),
        (["eval", "LABELLED", "--classify", "--draws", "3"], r"--draws 3: expected it without --classify"),
    ],
)
def test_labelled_errors_are_one_line_with_status_2(
    argv, message, labelled_run: Path, plain_run: Path, tmp_path, capsys
) -> None:
    runs = {"LABELLED": str(labelled_run), "PLAIN": str(plain_run)}
    argv = [runs.get(a, a) for a in argv]
    if argv[0] == "fit":
        argv += [*QUICK, "--out", str(tmp_path / "o")]
    else:
        argv += ["--out", str(tmp_path / "s.npy")] if argv[0] == "sample" else []
    code, _, err = _run(argv, capsys)
    assert code == 2, err
    assert __import__("re").search(message, one_line_error(err, argv[0])), err
    assert not (tmp_path / "o" / "run.json").exists() and not (tmp_path / "s.npy").exists()


def test_labels_survive_resume_and_a_changed_labels_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    common = ["--data", "digits", *TARFLOW, *QUICK[2:], "--out", out, "--checkpoint-every", "0"]
    first = ["fit", "--labels", "--option", "label_dropout=0.1", *common]
    assert _run([*first, "--epochs", "1"], capsys)[0] == 0
    assert flows.load_model(out).label_dropout == 0.1
    code, out_text, err = _run([*first, "--epochs", "2", "--resume"], capsys)
    assert code == 0, err
    record = json.loads((out / "run.json").read_text())
    assert record["data"]["labels"] is True and record["result"]["epochs"] == 2 and record["resumes"]
    assert "test log-likelihood (conditional, log p(x|y))" in out_text
    unlabelled = ["fit", *common]  # without label_dropout too: TarFlow refuses it without classes
    code, _, err = _run([*unlabelled, "--epochs", "3", "--resume"], capsys)
    assert code == 2
    line = one_line_error(err, "fit")
    assert "--resume: expected the run's --labels setting, got a command without --labels" in line
    assert "trained with --labels" in line
    plain = tmp_path / "plain"
    assert _run(["fit", "--data", "digits", *TARFLOW, *QUICK, "--out", plain], capsys)[0] == 0
    code, _, err = _run(["fit", "--data", "digits", "--labels", *TARFLOW, *QUICK, "--out", plain, "--resume"], capsys)
    assert code == 2 and "trained without --labels (unconditional)" in one_line_error(err, "fit")


def test_eval_of_a_conditional_model_without_labels_in_its_data_spec_is_one_line(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model = flows.TarFlow(64, transforms=1, hidden=(8,), patch=8, num_classes=10)  # trained from Python, say
    spec = {"name": "digits", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}  # no labels
    flows.save_model(model, tmp_path / "run", info={"data": spec})
    code, out, err = _run(["eval", tmp_path / "run", "--allow-changed-data"], capsys)
    assert code == 2 and out == "", err
    assert "a conditional model (1 context features) whose data spec has no labels for the test split" in (
        one_line_error(err, "eval")
    )
