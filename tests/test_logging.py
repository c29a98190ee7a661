"""Progress and logs: lines above the tqdm bar (tqdm.write), logging records, TensorBoard scalars, CSV history."""

from __future__ import annotations

import csv
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

import flows
from flows.train import Callback, MetricsLogger, PrintMetrics, Trainer
from flows.train import callbacks as callbacks_module


def _data(n: int = 60, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))


def _model() -> flows.Flow:
    torch.manual_seed(0)
    return flows.RealNVP(2, transforms=1, hidden=(4,))


def _visible_lines(text: str) -> list[str]:
    """What a terminal shows per line: the text after the last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_print_metrics_writes_above_the_bar_not_into_it(capsys: pytest.CaptureFixture[str]) -> None:
    """With the bar and the lines on one stream, every epoch line starts a line of its own."""
    Trainer(_model(), progress=True, callbacks=[PrintMetrics(stream=sys.stderr)]).fit(_data(), epochs=3, batch_size=20)
    err = capsys.readouterr().err
    epoch_lines = [line for line in _visible_lines(err) if "epoch" in line]
    assert len(epoch_lines) == 3, err
    assert all(line.startswith("epoch") for line in epoch_lines), err
    assert "9/9" in err  # the bar was shown


class _Noisy(Callback):
    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        logging.getLogger("flows.test").warning("a log record at epoch %d", record["epoch"])
        warnings.warn(f"a warning at epoch {record['epoch']}", UserWarning, stacklevel=1)


def test_logging_and_warnings_go_above_the_bar(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    shown = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = shown  # catch_warnings restores it; the trainer swaps it while the bar is up
            Trainer(_model(), progress=True, callbacks=[_Noisy()]).fit(_data(), epochs=2, batch_size=20)
            assert warnings.showwarning is shown  # restored after the run
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    lines = _visible_lines(err)
    records = [line for line in lines if "a log record" in line]
    warned = [line for line in lines if "UserWarning: a warning at epoch" in line]
    assert len(records) == 2 and all(line.startswith("a log record") for line in records), err
    assert len(warned) == 2 and all(line.startswith(__file__) for line in warned), err


def test_history_events_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    from flows.train import History

    history = History()
    with caplog.at_level(logging.INFO, logger="flows.train"):
        history.event(12, "restored the best weights (epoch 3)")
    assert history.events == [{"step": 12, "message": "restored the best weights (epoch 3)"}]
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("flows.train", logging.INFO, "step 12: restored the best weights (epoch 3)")
    ]


class _FakeWriter:
    def __init__(self, log_dir: Path, purge_step: int | None) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.scalars.append((tag, value, global_step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_metrics_logger_writes_scalars_to_tensorboard_and_the_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers: list[_FakeWriter] = []
    monkeypatch.setattr(
        callbacks_module,
        "_summary_writer",
        lambda log_dir, purge_step: writers.append(_FakeWriter(log_dir, purge_step)) or writers[-1],
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.tensorboard = True  # as if tensorboard were installed; the writer is the fake one
    history = Trainer(_model(), callbacks=[logger]).fit(_data(), _data(20, 1), epochs=2, batch_size=20)
    (writer,) = writers
    assert writer.log_dir == tmp_path / "tensorboard" and writer.purge_step is None and writer.closed
    tags = {tag for tag, _, _ in writer.scalars}
    assert {"loss", "val_loss", "lr"} <= tags and "epoch" not in tags and "step" not in tags
    expected = [(r["step"], r["val_loss"]) for r in history.records]
    assert [(step, value) for tag, value, step in writer.scalars if tag == "val_loss"] == expected
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and float(rows[1]["val_loss"]) == pytest.approx(history.records[1]["val_loss"])


def test_tensorboard_true_without_the_package_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callbacks_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="expected the tensorboard package"):
        MetricsLogger("unused", tensorboard=True)
    assert MetricsLogger("unused").tensorboard is False  # the default follows what is installed


def test_real_tensorboard_event_files(tmp_path: Path) -> None:
    """With tensorboard installed (the ``tensorboard`` extra), the events read back with its own reader."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history = Trainer(_model(), callbacks=[MetricsLogger(tmp_path)]).fit(_data(), _data(20, 1), epochs=2, batch_size=20)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    values = [(e.step, e.value) for e in events.Scalars("val_loss")]
    assert values == [(r["step"], pytest.approx(r["val_loss"], rel=1e-6)) for r in history.records]


def test_flows_sample_keeps_earlier_samples_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from flows.cli import main

    out = tmp_path / "run"
    tiny = ["--epochs", "1", "--transforms", "1", "--hidden", "4", "--no-plots", "--quiet", "--patience", "0"]
    assert main(["fit", "--data", "moons", "--out", str(out), *tiny]) == 0
    assert main(["sample", str(out), "-n", "5", "--seed", "1"]) == 0
    first = np.load(out / "samples.npy")
    assert main(["sample", str(out), "-n", "5", "--seed", "2"]) == 0  # numbered, the first one kept
    assert (out / "samples-2.npy").is_file() and (out / "samples-2.png").is_file()
    np.testing.assert_array_equal(np.load(out / "samples.npy"), first)
    assert "samples-2.png" in capsys.readouterr().out
    assert main(["sample", str(out), "-n", "5", "--out", str(out / "samples.npy")]) == 2  # a named file: refused
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["sample", str(out), "-n", "5", "--seed", "3", "--overwrite"]) == 0
    assert not np.array_equal(np.load(out / "samples.npy"), first)
    assert not (out / "samples-3.npy").exists()
