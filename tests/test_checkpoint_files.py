"""Crafted checkpoint files: size fields bounded before allocation, checksum before header, clear missing entries."""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
from pathlib import Path

import pytest
import torch

from flows import RealNVP, load_model
from flows.model_file import ModelFileError, describe_model
from flows.train import (
    CheckpointError,
    Trainer,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from flows.train.checkpoint import MAGIC

DIGEST = 32


def _craft(path: Path, header: dict, state: dict, *, header_length: int | None = None) -> Path:
    """A checkpoint written by hand, with a valid SHA-256 over whatever it holds (as an attacker can)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = {"format": "flows-checkpoint", "version": 1, "payload_bytes": len(payload), **header}
    header_bytes = json.dumps(header).encode()
    length = len(header_bytes) if header_length is None else header_length
    body = MAGIC + length.to_bytes(8, "little") + header_bytes + payload
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


@pytest.mark.parametrize("length", [2**63 - 1, 160 * 10**9, 10**6])
def test_a_huge_header_length_is_refused_before_any_allocation(tmp_path: Path, length: int) -> None:
    path = _craft(tmp_path / "c.ckpt", {"kind": "model"}, {"w": torch.ones(2)}, header_length=length)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        for read in (read_checkpoint_header, load_checkpoint):
            with pytest.raises(
                CheckpointError, match=rf"expected a header of at most \d+ bytes \(the file has {size}\)"
            ):
                read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing near the claimed size was ever asked for


def test_the_checksum_is_verified_before_the_header_is_trusted(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt", {"w": torch.arange(100.0)}, kind="model", info={"note": "x"})
    raw = bytearray(path.read_bytes())
    # a flip in the payload leaves the header parseable: the header reader must still refuse the file
    flipped = bytearray(raw)
    flipped[len(raw) - DIGEST - 10] ^= 0x01
    (tmp_path / "payload.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint_header(tmp_path / "payload.ckpt")
    # a flip inside the header JSON that keeps it valid JSON ("kind": "model" -> "modem")
    at = bytes(raw).index(b'"model"') + 5
    flipped = bytearray(raw)
    flipped[at] ^= ord("l") ^ ord("m")
    (tmp_path / "header.ckpt").write_bytes(bytes(flipped))
    for read in (read_checkpoint_header, load_checkpoint):
        with pytest.raises(CheckpointError, match="SHA-256"):
            read(tmp_path / "header.ckpt")
    # the untouched file reads back
    assert read_checkpoint_header(path)["info"] == {"note": "x"}


def test_truncations_at_every_boundary_are_clear(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt", {"w": torch.arange(50.0)}, kind="model")
    raw = path.read_bytes()
    header_end = len(MAGIC) + 8 + int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
    for cut in (
        0,
        len(MAGIC),
        len(MAGIC) + 4,
        len(MAGIC) + 8,
        header_end - 1,
        header_end,
        len(raw) - DIGEST,
        len(raw) - 1,
    ):
        (tmp_path / "t.ckpt").write_bytes(raw[:cut])
        for read in (read_checkpoint_header, load_checkpoint):
            with pytest.raises(CheckpointError, match=r"truncated|not a flows checkpoint|SHA-256"):
                read(tmp_path / "t.ckpt")


def test_a_directory_or_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        read_checkpoint_header(tmp_path / "missing.ckpt")


def test_payload_size_and_header_shape_are_checked(tmp_path: Path) -> None:
    path = _craft(tmp_path / "c.ckpt", {"kind": "model", "payload_bytes": 7}, {"w": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"expected a payload of 7 bytes \(its header\), got \d+"):
        load_checkpoint(path)
    path = _craft(tmp_path / "i.ckpt", {"kind": "model", "info": [1, 2]}, {"w": torch.ones(2)})
    with pytest.raises(CheckpointError, match="expected a dict 'info'"):
        read_checkpoint_header(path)


def test_a_missing_optimizer_state_is_a_clear_error_not_a_key_error(tmp_path: Path) -> None:
    config = describe_model(RealNVP(2, transforms=1, hidden=[4]))
    trainer = Trainer(RealNVP(2, transforms=1, hidden=[4]), checkpoint=tmp_path / "run.ckpt", config=config)
    trainer.fit(torch.randn(16, 2), epochs=1, batch_size=8)
    state = dict(load_checkpoint(tmp_path / "run.ckpt").state)
    header = read_checkpoint_header(tmp_path / "run.ckpt")
    del state["optimizer"]
    crafted = _craft(tmp_path / "crafted.ckpt", {k: header[k] for k in ("kind", "config", "info")}, state)
    fresh = Trainer(RealNVP(2, transforms=1, hidden=[4]), config=config)
    with pytest.raises(CheckpointError, match=r"expected a training state with .*, it lacks \['optimizer'\]") as caught:
        fresh.resume(crafted)
    assert not isinstance(caught.value, KeyError)
    assert "crafted.ckpt" in str(caught.value)


def test_a_model_checkpoint_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    config = describe_model(RealNVP(2, transforms=1, hidden=[4]))
    path = _craft(tmp_path / "m.ckpt", {"kind": "model", "config": config, "info": {}}, {"weights": torch.ones(1)})
    with pytest.raises(ModelFileError, match=r"expected the model's weights under 'model' .*, it has \['weights'\]"):
        load_model(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s["optimizer"].pop("param_groups"),
            r"expected state\['optimizer'\] to have .*lacks \['param_groups'\]",
        ),
        (lambda s: s.__setitem__("optimizer", [1, 2]), r"expected state\['optimizer'\] to be a dict, got list"),
        (lambda s: s["trainer"].pop("epoch"), r"expected state\['trainer'\] to have .*lacks \['epoch'\]"),
        (lambda s: s.pop("rng"), r"it lacks \['rng'\]"),
    ],
)
def test_damaged_entries_of_a_training_state_are_named(tmp_path: Path, edit, message: str) -> None:
    config = describe_model(RealNVP(2, transforms=1, hidden=[4]))
    trainer = Trainer(RealNVP(2, transforms=1, hidden=[4]), checkpoint=tmp_path / "run.ckpt", config=config)
    trainer.fit(torch.randn(16, 2), epochs=1, batch_size=8)
    header = read_checkpoint_header(tmp_path / "run.ckpt")
    state = load_checkpoint(tmp_path / "run.ckpt").state
    edit(state)
    crafted = _craft(tmp_path / "crafted.ckpt", {k: header[k] for k in ("kind", "config", "info")}, state)
    with pytest.raises(CheckpointError, match=message):
        Trainer(RealNVP(2, transforms=1, hidden=[4]), config=config).resume(crafted)


def _shrunk_record(state: dict) -> bytes:
    """A torch.save archive of ``state`` whose first storage record is cut to 4 bytes (its pickle claims more)."""
    import zipfile

    buffer = io.BytesIO()
    torch.save(state, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            target.writestr(item, data[:4] if item.filename.endswith("data/0") else data)
    return out.getvalue()


def test_a_stride_zero_tensor_of_1e11_elements_is_refused_before_allocating(tmp_path: Path) -> None:
    # torch.save writes the one-element storage with size (1e11,) and stride (0,): 400 GB once materialized
    path = save_checkpoint(tmp_path / "x.ckpt", {"model": {"w": torch.ones(1).expand(10**11)}}, kind="model")
    # (were it materialized, torch would fail with a RuntimeError from its allocator, not this error)
    with pytest.raises(CheckpointError, match=r"tensor of 100000000000 elements .* over a storage of 1"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="refused before allocating"):
        load_model(path)


def test_a_storage_larger_than_its_record_is_refused(tmp_path: Path) -> None:
    payload = _shrunk_record({"model": {"w": torch.ones(1000)}})
    header = json.dumps({"format": "flows-checkpoint", "version": 1, "kind": "model", "payload_bytes": len(payload)})
    body = MAGIC + len(header).to_bytes(8, "little") + header.encode() + payload
    path = tmp_path / "x.ckpt"
    path.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(CheckpointError, match="a storage of 4000 bytes whose record holds 4 bytes"):
        load_checkpoint(path)


def test_views_and_empty_tensors_still_load(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    state = {"model": {"column": base[:, 1], "empty": torch.ones(0, 5), "t": base.t()}, "n": [1, (2, 3)]}
    loaded = load_checkpoint(save_checkpoint(tmp_path / "x.ckpt", state, kind="model")).state
    assert torch.equal(loaded["model"]["column"], base[:, 1]) and loaded["model"]["empty"].shape == (0, 5)
    assert torch.equal(loaded["model"]["t"], base.t()) and loaded["n"] == [1, (2, 3)]
