"""Crafted-checkpoint attacks: truncations, flipped bytes, huge header sizes, re-signed payloads.

Each corruption is applied to a real training checkpoint (``Trainer``), then opened through the
public entry points: :func:`flows.load_model` (kind ``model``: the model a checkpoint's config and
weights rebuild) and :meth:`flows.train.Trainer.resume` (kind ``training``). The promise: a damaged
or crafted file ends in a ``CheckpointError``, a ``ModelFileError`` (a config the model-file checks
refuse) or a ``FileNotFoundError`` that names the file or says what was expected, never in a raw exception,
never in an accepted load of changed bytes, and never in code execution (a crafted pickle that
would create a marker file). "Re-signed" files have a recomputed SHA-256, as an attacker would
write them, so they reach the parts behind the checksum.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from tests.robustness.table import Attack, Outcome, Result, expect_clear, judge_error, workspace

__all__ = ["attacks"]

MAGIC = b"FLOWSCKPT\n"
_START = len(MAGIC) + 8


@functools.cache
def _originals() -> dict[str, bytes]:
    """The bytes of a training checkpoint of a tiny RealNVP (attacked as both kinds: opened two ways)."""
    from flows import RealNVP
    from flows.model_file import describe_model
    from flows.train import MaximumLikelihood, Trainer

    root = workspace() / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = RealNVP(2, transforms=1, hidden=[4])
    config = describe_model(model)
    trainer = Trainer(model, MaximumLikelihood(), checkpoint=root / "training.ckpt", config=config, progress=False)
    trainer.fit(torch.randn(32, 2, generator=torch.Generator().manual_seed(0)), epochs=1, batch_size=16)
    trainer.save_checkpoint() if not (root / "training.ckpt").exists() else None
    data = (root / "training.ckpt").read_bytes()
    return {"model": data, "training": data}


def _split(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[len(MAGIC) : _START], "little")
    return json.loads(data[_START : _START + n]), data[_START + n : -32]


def _sign(header: dict | bytes, payload: bytes) -> bytes:
    """A well-formed file around ``header`` and ``payload`` with a correct SHA-256 (what an attacker writes)."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    if isinstance(header, dict):
        header = {**header, "payload_bytes": len(payload)}
        head = json.dumps(header).encode()
    body = MAGIC + len(head).to_bytes(8, "little") + head + payload
    return body + hashlib.sha256(body).digest()


def _flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0xFF
    return bytes(out)


def _resave(kind: str, edit: Callable[[dict], None]) -> bytes:
    header, payload = _split(_originals()[kind])
    state = torch.load(io.BytesIO(payload), weights_only=True)
    edit(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return _sign(header, buffer.getvalue())


class _Marker:
    """Unpickling this creates the marker file (the code execution the attacks look for)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"model": _Marker(str(marker))}, protocol=2)


def _evil_zip(marker: Path) -> bytes:
    """A torch.save-style zip archive whose data.pkl calls ``Path.touch`` when unpickled."""
    buffer = io.BytesIO()
    torch.save({"model": {}}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("data.pkl"):
                data = _evil_pickle(marker)
            target.writestr(item, data)
    return out.getvalue()


def _corruptions(kind: str, marker: Path) -> dict[str, Callable[[], bytes]]:
    def original() -> bytes:
        return _originals()[kind]

    def header_length() -> int:
        return int.from_bytes(original()[len(MAGIC) : _START], "little")

    def length(value: int) -> bytes:
        d = original()
        return d[: len(MAGIC)] + value.to_bytes(8, "little") + d[_START:]

    def resigned_header(edit: Callable[[dict], object]) -> bytes:
        header, payload = _split(original())
        edited = edit(header)
        return _sign(header if edited is None else edited, payload)

    missing = "optimizer" if kind == "training" else "model"
    return {
        "empty-file": lambda: b"",
        "truncated-in-magic": lambda: original()[:5],
        "truncated-in-length": lambda: original()[: len(MAGIC) + 3],
        "truncated-in-header": lambda: original()[: _START + header_length() // 2],
        "truncated-in-payload": lambda: original()[: len(original()) // 2 + _START],
        "truncated-last-byte": lambda: original()[:-1],
        "flipped-magic": lambda: _flip(original(), 0),
        "flipped-length": lambda: _flip(original(), len(MAGIC)),
        "flipped-header": lambda: _flip(original(), _START + 20),
        "flipped-payload": lambda: _flip(original(), _START + header_length() + 100),
        "flipped-digest": lambda: _flip(original(), len(original()) - 1),
        "huge-header-size": lambda: length(2**62),
        "header-size-past-end": lambda: length(len(original())),
        "header-size-zero": lambda: length(0),
        "resigned-header-not-json": lambda: _sign(b"{not json", _split(original())[1]),
        "resigned-header-list": lambda: _sign(b"[1, 2]", _split(original())[1]),
        "resigned-version-99": lambda: resigned_header(lambda h: h.update(version=99)),
        "resigned-payload-bytes-lie": lambda: _sign(
            json.dumps({**_split(original())[0], "payload_bytes": 7}).encode(), _split(original())[1]
        ),
        "resigned-unknown-builder": lambda: resigned_header(lambda h: h["config"].update(builder="NoSuchFlow")),
        "resigned-config-features-changed": lambda: resigned_header(
            lambda h: h["config"]["arguments"].update(features=3)
        ),
        "resigned-payload-not-torch": lambda: _sign(_split(original())[0], b"\x00" * 64),
        "resigned-payload-list": lambda: _sign(_split(original())[0], _torch_bytes([1, 2, 3])),
        f"resigned-missing-{missing}": lambda: _resave(kind, lambda s: s.pop(missing)),
        "resigned-model-nan-weights": lambda: _resave(kind, _nan_weights),
        "resigned-stride-zero-1e11-tensor": lambda: _resave(kind, _stride_zero),
        "resigned-pickle-code": lambda: _sign(_split(original())[0], _evil_pickle(marker)),
        "resigned-zip-code": lambda: _sign(_split(original())[0], _evil_zip(marker)),
        "raw-pickle-code": lambda: _evil_pickle(marker),
    }


def _torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _nan_weights(state: dict) -> None:
    first = next(k for k, v in state["model"].items() if v.is_floating_point() and v.numel())
    state["model"][first] = torch.full_like(state["model"][first], float("nan"))


def _stride_zero(state: dict) -> None:
    """A tensor of 10^11 elements over a one-element storage (stride 0): 400 GB once anything touches it."""
    first = next(k for k, v in state["model"].items() if v.is_floating_point() and v.numel())
    state["model"][first] = torch.ones(1).expand(10**11)


def _open(kind: str, path: Path):
    from flows import load_model
    from flows.train import MaximumLikelihood, Trainer

    if kind == "model":
        return load_model(path)
    model = load_model(path).train()  # the model the header's config describes; then resume itself
    return Trainer(model, MaximumLikelihood(), checkpoint=path, progress=False).resume()


def _attack(kind: str, corruption: str) -> Result:
    root = workspace() / "checkpoints" / kind / corruption
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "code-ran"
    data = _corruptions(kind, marker)[corruption]()
    path = root / ("model.ckpt" if kind == "model" else "checkpoint.ckpt")
    path.write_bytes(data)
    result = expect_clear(lambda: _open(kind, path), names=(str(path),), accepted=f"loaded a {corruption} file")
    if marker.exists():
        return Result(Outcome.CODE_EXECUTION, f"unpickling the {corruption} file ran code")
    if corruption == "resigned-model-nan-weights" and result.outcome is Outcome.SILENT_WRONG:
        return Result(Outcome.SILENT_WRONG, "loaded non-finite weights without a word")
    return result


def _missing_file(kind: str) -> Result:
    path = workspace() / "checkpoints" / "does-not-exist.ckpt"
    try:
        _open(kind, path)
    except Exception as error:
        return judge_error(error, names=(str(path),))
    return Result(Outcome.SILENT_WRONG, "opened a file that does not exist")


def attacks() -> list[Attack]:
    """The checkpoint part of the table, and the model-file family (:mod:`tests.robustness.model_files`)."""
    from tests.robustness import model_files

    out = model_files.attacks()
    for kind in ("model", "training"):
        for corruption in _corruptions(kind, Path("unused")):
            out.append(
                Attack(f"checkpoint/{kind}/{corruption}", "checkpoint", functools.partial(_attack, kind, corruption))
            )
        out.append(Attack(f"checkpoint/{kind}/missing-file", "checkpoint", functools.partial(_missing_file, kind)))
    return out
