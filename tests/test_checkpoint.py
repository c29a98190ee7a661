"""Checkpoints: exact resume, integrity checks, atomic writes, and loading that never runs code."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pickle
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

import flows
from flows import load_model
from flows.model_file import ModelFileError, describe_model
from flows.train import (
    Callback,
    CheckpointError,
    EarlyStopping,
    MaximumLikelihood,
    Trainer,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from flows.train import checkpoint as checkpoint_module

SENTINEL_ENV = "FLOWS_TEST_SENTINEL"


def _levels_data(n: int = 120) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 4, (n, 4), generator=g, dtype=torch.uint8)


def _model() -> flows.RealNVP:
    model = flows.RealNVP(4, transforms=2, hidden=[8])
    return model.prepend(flows.Logit(4, alpha=0.05), options=[{"alpha": 0.05}])


def _trainer(path: Path | None = None) -> Trainer:
    torch.manual_seed(0)
    model = _model()
    config = describe_model(model)
    return Trainer(
        model,
        MaximumLikelihood(levels=4),
        lr=1e-2,
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5),
        callbacks=[EarlyStopping(patience=50)],
        checkpoint=path,
        config=config,
    )


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resume_mid_epoch_is_bitwise_identical(tmp_path: Path) -> None:
    """Uninterrupted vs stopped after 7 steps (mid-epoch), saved, rebuilt from scratch and resumed."""
    x = _levels_data()
    full = _trainer()
    full.fit(x[:100], x[100:], epochs=3, batch_size=25)
    reference = _params(full.model)

    first = _trainer(tmp_path / "run.ckpt")
    first.fit(x[:100], x[100:], epochs=3, batch_size=25, max_steps=7)
    torch.manual_seed(123)  # the resumed process starts with different random state
    resumed = _trainer(tmp_path / "run.ckpt").resume()
    assert resumed.step == 7 and resumed.epoch == 1 and resumed.epoch_step == 3
    history = resumed.fit(x[:100], x[100:], epochs=3, batch_size=25)
    for name, value in _params(resumed.model).items():
        assert torch.equal(value, reference[name]), name
    assert history["epoch"] == [1, 1.75, 2, 3]
    assert history["val_loss"][-1] == full.history["val_loss"][-1]


def _same(a: object, b: object) -> bool:
    """Nested containers equal, tensors bitwise."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _without_time(records: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in record.items() if k != "time"} for record in records]


class _KeepState(Callback):
    """Takes the training state at the end of fit, before EarlyStopping puts the best weights in the model."""

    state: dict | None = None

    def on_fit_end(self, trainer) -> None:
        self.state = copy.deepcopy(trainer.state_dict())


def test_state_dict_round_trip_into_a_fresh_trainer_continues_bitwise() -> None:
    """In memory, no file: stop mid-epoch, copy the state, load it into a new trainer, finish the run."""
    x = _levels_data()
    full = _trainer()
    full.callbacks.insert(0, _KeepState())
    full.fit(x[:100], x[100:], epochs=3, batch_size=25)

    first = _trainer()
    first.callbacks.insert(0, keep := _KeepState())
    first.fit(x[:100], x[100:], epochs=3, batch_size=25, max_steps=7)
    del first
    torch.manual_seed(123)  # every global generator elsewhere: the state must bring its own back
    np.random.seed(123)  # noqa: NPY002
    random.seed(123)
    fresh = _trainer()
    fresh.callbacks.insert(0, _KeepState())
    fresh.load_state_dict(keep.state)
    assert (fresh.step, fresh.epoch, fresh.epoch_step) == (7, 1, 3)
    history = fresh.fit(x[:100], x[100:], epochs=3, batch_size=25)
    final, reference = fresh.callbacks[0].state, full.callbacks[0].state  # training states, not the best weights
    for name, value in reference["model"].items():
        assert torch.equal(final["model"][name], value), name
    for name, value in _params(full.model).items():  # the best weights EarlyStopping restored are the same too
        assert torch.equal(fresh.model.state_dict()[name], value), name
    stop = history.records[1:2]  # the record of the stop after 7 steps (epoch 1.75)
    expected = [*full.history.records[:1], *stop, *full.history.records[1:]]
    assert _without_time(history.records) == _without_time(expected)
    assert history["epoch"] == [1, 1.75, 2, 3]
    assert torch.equal(final["rng"]["torch"], reference["rng"]["torch"])
    for key in ("optimizer", "scheduler", "callbacks", "guard"):
        assert _same(final[key], reference[key]), key
    assert final["trainer"] == {**reference["trainer"], "elapsed": final["trainer"]["elapsed"]}


def test_load_state_dict_refuses_a_state_it_cannot_continue() -> None:
    trainer = _trainer()
    trainer.fit(_levels_data(), epochs=1, batch_size=30)
    state = trainer.state_dict()
    with pytest.raises(ValueError, match=r"Trainer.load_state_dict: expected a training state with .*lacks \['rng'\]"):
        _trainer().load_state_dict({k: v for k, v in state.items() if k != "rng"})
    with pytest.raises(ValueError, match="state for 1 callbacks, this trainer has 0; resume with the same callbacks"):
        Trainer(_model()).load_state_dict(state)


class _SendSignal(Callback):
    def __init__(self, at_step: int, signum: int) -> None:
        self.at_step, self.signum = at_step, signum

    def on_step_end(self, trainer, metrics) -> None:
        if trainer.step == self.at_step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_at_a_step_boundary_with_a_checkpoint_that_resumes_exactly(tmp_path: Path, signum) -> None:
    x = _levels_data()
    full = _trainer()
    full.fit(x[:100], epochs=2, batch_size=25)

    stopped = _trainer(tmp_path / "run.ckpt")
    stopped.callbacks.append(_SendSignal(5, signum))
    stopped.fit(x[:100], epochs=2, batch_size=25)
    assert stopped.interrupted == signum and stopped.step == 5
    assert signal.getsignal(signal.SIGINT) is not None  # handlers restored (pytest's own is back)
    resumed = _trainer(tmp_path / "run.ckpt")
    resumed.callbacks.append(_SendSignal(-1, signum))
    resumed.resume().fit(x[:100], epochs=2, batch_size=25)
    assert resumed.interrupted is None and resumed.step == 8
    for name, value in _params(full.model).items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_a_checkpoint_rebuilds_its_model_from_the_model_config_in_its_header(tmp_path: Path) -> None:
    model = flows.NICE(3, transforms=2, hidden=[8]).prepend(flows.Reverse(3))
    flows.testing.perturb_parameters(model)
    config = describe_model(model)
    path = save_checkpoint(tmp_path / "m.ckpt", {"model": model.state_dict()}, config=config, info={"data": "toy"})
    header = read_checkpoint_header(path)
    assert header["config"] == config and header["info"] == {"data": "toy"}
    assert config["builder"] == "NICE" and config["preprocessing"] == [{"layer": "Reverse", "options": {}}]
    x = torch.randn(5, 3)
    torch.testing.assert_close(load_model(path).log_prob(x), model.log_prob(x), rtol=0, atol=0)


def test_training_checkpoint_header_is_plain_json(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "c.ckpt")
    trainer.fit(_levels_data(), epochs=1, batch_size=30)
    raw = (tmp_path / "c.ckpt").read_bytes()
    length = int.from_bytes(raw[10:18], "little")
    header = json.loads(raw[18 : 18 + length])
    assert header["kind"] == "training" and header["info"]["epoch"] == 1 and header["config"]["builder"] == "RealNVP"


def test_truncated_and_tampered_checkpoints_are_rejected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt", {"w": torch.arange(1000.0)}, kind="model")
    raw = path.read_bytes()
    for cut in (5, 15, len(raw) // 2, len(raw) - 1):
        (tmp_path / "t.ckpt").write_bytes(raw[:cut])
        with pytest.raises(CheckpointError, match=r"truncated|not a flows checkpoint|SHA-256"):
            load_checkpoint(tmp_path / "t.ckpt")
    for position in (len(raw) // 2, len(raw) - 40, 30):  # payload, end of payload, header
        tampered = bytearray(raw)
        tampered[position] ^= 0x01
        (tmp_path / "x.ckpt").write_bytes(bytes(tampered))
        with pytest.raises(CheckpointError):
            load_checkpoint(tmp_path / "x.ckpt")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.ckpt")


def test_a_checkpoint_without_config_says_what_it_lacks(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt", {"model": {}})
    with pytest.raises(ModelFileError, match=r"expected a checkpoint whose header holds a model config"):
        load_model(path)


class _Exploit:
    """Unpickling this writes a sentinel file: proof that code ran."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def test_malicious_pickles_never_run(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned.txt"
    exploit = {"model": _Exploit(str(sentinel))}
    # the exploit works when unpickled naively (so the test would notice if loading ran it)
    pickle.loads(pickle.dumps(exploit))
    assert sentinel.exists()
    sentinel.unlink()

    # 1. a raw pickle, and a torch.save archive, under the checkpoint's name
    (tmp_path / "raw.ckpt").write_bytes(pickle.dumps(exploit))
    buffer = io.BytesIO()
    torch.save(exploit, buffer)
    (tmp_path / "torch.ckpt").write_bytes(buffer.getvalue())
    for name in ("raw.ckpt", "torch.ckpt"):
        with pytest.raises(CheckpointError, match="not a flows checkpoint"):
            load_checkpoint(tmp_path / name)
        with pytest.raises(CheckpointError):
            load_model(tmp_path / name)

    # 2. a well-formed container (valid header and checksum) whose payload is the exploit
    header = json.dumps(
        {
            "format": "flows-checkpoint",
            "version": 1,
            "kind": "model",
            "payload_bytes": len(buffer.getvalue()),
            "config": None,
        }
    ).encode()
    body = checkpoint_module.MAGIC + len(header).to_bytes(8, "little") + header + buffer.getvalue()
    (tmp_path / "forged.ckpt").write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(CheckpointError, match="not plain tensors and containers; refused to load it"):
        load_checkpoint(tmp_path / "forged.ckpt")
    assert not sentinel.exists()


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt", {"w": torch.ones(3)}, kind="model")

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, {"w": torch.zeros(3)}, kind="model")
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path).state["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.ckpt"]  # no temporary file left behind


def test_resume_requires_matching_callbacks_and_a_training_checkpoint(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "c.ckpt")
    trainer.fit(_levels_data(), epochs=1, batch_size=30)
    bare = Trainer(_model())
    with pytest.raises(CheckpointError, match="state for 1 callbacks, this trainer has 0"):
        bare.resume(tmp_path / "c.ckpt")
    save_checkpoint(tmp_path / "m.ckpt", {"model": trainer.model.state_dict()}, config=trainer.config, kind="model")
    with pytest.raises(CheckpointError, match="is a 'model' checkpoint, not a training one"):
        _trainer().resume(tmp_path / "m.ckpt")


def test_config_errors_are_clear(tmp_path: Path) -> None:
    model = flows.RealNVP(3, transforms=1, hidden=[4])
    config = describe_model(model)
    for edit, message in (
        ({"builder": "Nope"}, r"expected a builder among \[.*'RealNVP'.*\], got 'Nope'"),
        ({"preprocessing": [{"layer": "Bogus"}]}, r"expected preprocessing layers among .*got \{'layer': 'Bogus'\}"),
        ({"arguments": {**config["arguments"], "transforms": "2"}}, r"expected argument 'transforms' .* got '2'"),
        ({"format": "other"}, r"expected a checkpoint whose header holds a model config \(format 'flows.model'"),
    ):
        path = save_checkpoint(tmp_path / "c.ckpt", {"model": model.state_dict()}, config={**config, **edit})
        with pytest.raises(ModelFileError, match=message):
            load_model(path)
    with pytest.raises(ModelFileError, match="expected a model made by one of the builders"):
        describe_model(flows.Flow(flows.Affine(3), flows.StandardNormal(3)))
