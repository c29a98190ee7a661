r"""Checkpoints that never lose work and never run code: an integrity-checked container, written atomically.

File layout (one file)::

    b"FLOWSCKPT\\n" | header length (8 bytes, little endian) | header (JSON) | payload | SHA-256 (32 bytes)

* the **header** is plain JSON: format version, kind (``"training"``), the model config that
  rebuilds the model (:func:`flows.model_file.describe_model`, the dict a model file stores; so
  :func:`flows.load_model` rebuilds a checkpoint's model), library versions and free-form info.
  It is parsed only after the whole file has passed its checksum (:func:`read_checkpoint_header`);
* the **payload** is a ``torch.save`` archive of tensors and plain containers only (state dicts,
  optimizer and scheduler state, random generator states, counters). It is read with
  ``torch.load(weights_only=True)``, which refuses to construct arbitrary objects, and only after
* the trailing **SHA-256 of everything before it** has been verified, so a truncated, tampered or
  half-written file is rejected with a :class:`CheckpointError` before any unpickling starts.

Every length field is bounded by the file's size before anything is allocated, the checksum is
verified before the header is parsed, the payload's pickle is walked with inert stand-ins before
``torch.load`` so that a tensor larger than its storage (a stride-0 tensor of 10^11 elements over
one stored number) or a storage larger than its record is refused before any allocation, and
:func:`check_training_state` names what a training state lacks (``state["optimizer"]`` of a
hand-edited checkpoint) instead of a ``KeyError``.

Files are written atomically (temporary file, ``fsync``, rename): a process killed in the middle
of a save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import math
import os
import pickle
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flows.train._atomic import atomic_write_bytes

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "capture_rng_state",
    "check_finite_state",
    "check_training_state",
    "load_checkpoint",
    "read_checkpoint_header",
    "restore_rng_state",
    "save_checkpoint",
    "training_state_problem",
]

MAGIC = b"FLOWSCKPT\n"
FORMAT_VERSION = 1
_DIGEST = 32


class CheckpointError(ValueError):
    """A file is not a flows checkpoint, or is truncated, corrupted, tampered with or unsupported."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: its JSON ``header`` and the ``state`` dict of its payload."""

    header: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any] | None:
        """The model config (``None`` when the model was not built from one)."""
        return self.header.get("config")


def _versions() -> dict[str, str]:
    from flows import __version__

    return {"flows": __version__, "torch": torch.__version__}


def save_checkpoint(
    path: str | os.PathLike,
    state: dict[str, Any],
    *,
    config: dict[str, Any] | None = None,
    kind: str = "training",
    info: dict[str, Any] | None = None,
) -> Path:
    """Write ``state`` (tensors and plain containers) with a JSON header, atomically.

    Args:
        path: destination file (parent directories are created).
        state: the payload; must load under ``torch.load(weights_only=True)`` (tensors, numbers,
            strings, ``None``, lists, tuples, dicts).
        config: the model config that rebuilds the model (:func:`flows.model_file.describe_model`).
        kind: ``"training"`` (a resumable run; models are saved as model files, :func:`flows.save_model`).
        info: extra JSON-serialisable facts for the header (data set, metrics, ...).

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mkdtemp() + "/x.ckpt"
        >>> _ = save_checkpoint(path, {"w": torch.ones(2)}, kind="model")
        >>> load_checkpoint(path).state["w"].tolist()
        [1.0, 1.0]
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    header = {
        "format": "flows-checkpoint",
        "version": FORMAT_VERSION,
        "kind": kind,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "payload_bytes": len(payload),
        "config": config,
        "info": info or {},
    }
    try:
        header_bytes = json.dumps(header, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise TypeError(f"save_checkpoint: expected JSON values in config and info, got an error: {error}") from error
    body = MAGIC + len(header_bytes).to_bytes(8, "little") + header_bytes + payload
    return atomic_write_bytes(path, body + hashlib.sha256(body).digest())


TRAINING_ENTRIES: dict[str, tuple[str, ...]] = {
    "trainer": ("epoch", "epoch_step", "step", "elapsed", "epoch_sums", "epoch_count"),
    "model": (),
    "optimizer": ("state", "param_groups"),
    "scheduler": (),
    "guard": (),
    "callbacks": (),
    "history": ("records", "events"),
    "rng": ("torch", "numpy", "python"),
}
"""Entries a :class:`~flows.train.Trainer` state must have (and the entries each must have) to resume."""


def training_state_problem(state: object) -> str | None:
    """What a training state lacks or has mistyped (a sentence), ``None`` when resuming can read it."""
    if not isinstance(state, dict):
        return f"expected a training state that is a dict, got {type(state).__name__}"
    missing = [key for key in TRAINING_ENTRIES if key not in state]
    if missing:
        return f"expected a training state with {list(TRAINING_ENTRIES)}, it lacks {missing}"
    for key, entries in TRAINING_ENTRIES.items():
        value = state[key]
        kind = list if key == "callbacks" else dict
        if value is None and key in ("scheduler", "guard"):  # a run without a scheduler or guard
            continue
        if not isinstance(value, kind):
            return f"expected state[{key!r}] to be a {kind.__name__}, got {type(value).__name__}"
        lacking = [entry for entry in entries if entry not in value]
        if lacking:
            return f"expected state[{key!r}] to have {list(entries)}, it lacks {lacking}"
    return None


def check_training_state(state: dict[str, Any], path: str | os.PathLike = "<state>") -> None:
    """Refuse a training state that lacks what resuming reads, naming the file and the missing entries.

    A checkpoint that passed its checksum can still have been written by other code or crafted:
    this turns what would be a ``KeyError`` deep inside a resume into one clear error.

    Raises:
        CheckpointError: naming the missing or mistyped entries.
    """
    problem = training_state_problem(state)
    if problem is None:
        return
    if "it lacks" in problem and problem.startswith("expected a training state with"):
        problem += " (the file was edited or not written by flows.train.Trainer)"
    raise CheckpointError(f"checkpoint {str(path)!r}: {problem}")


def check_finite_state(state: Any, path: str | os.PathLike = "<state>", where: str = "state") -> None:
    """Refuse weights with NaN or infinite values, naming the file and the first tensors affected.

    Training never saves non-finite weights (the guard rolls such steps back), so a checkpoint
    that holds them was damaged, edited or written by other code; loading it would make every
    later number NaN without a word.

    Raises:
        CheckpointError: naming up to three offending entries.
    """
    bad: list[str] = []

    def visit(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() or value.is_complex():
                if value.numel() and not bool(torch.isfinite(value).all()):
                    bad.append(name)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(item, f"{name}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{name}[{i}]")

    visit(state, where)
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckpointError(
            f"checkpoint {str(path)!r}: expected finite weights, got NaN/Inf values in {', '.join(bad[:3])}{more} "
            "(flows never saves non-finite weights: the file was damaged, edited or written by other code)"
        )


def _read(path: str | os.PathLike, *, payload: bool) -> tuple[dict[str, Any], bytes]:
    """Check the layout, the size fields and the SHA-256 of a checkpoint, then parse its header.

    Every length in the file is bounded by the file's size before anything is read, the file is
    read in chunks, and the checksum is verified before the header is parsed (so no field of a
    damaged or tampered file is trusted). Returns the header and, with ``payload``, the payload bytes.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    if not path.is_file():
        raise CheckpointError(f"expected a checkpoint file, got {str(path)!r}, which is not a regular file")
    start = len(MAGIC) + 8
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(start)
        if not prefix.startswith(MAGIC):
            raise CheckpointError(
                f"{str(path)!r} is not a flows checkpoint (it does not start with the flows header); "
                "plain pickle or torch.save files are refused on purpose, since loading them can run code"
            )
        if size < start + _DIGEST or len(prefix) < start:
            raise CheckpointError(f"checkpoint {str(path)!r} is truncated ({size} bytes)")
        header_length = int.from_bytes(prefix[len(MAGIC) :], "little")
        room = size - start - _DIGEST
        if header_length > room:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is truncated or corrupt: expected a header of at most {room} bytes "
                f"(the file has {size}), got a header length of {header_length}"
            )
        digest = hashlib.sha256(prefix)
        remaining = size - start - _DIGEST
        header_bytes, chunks = b"", []
        while remaining > 0:
            block = handle.read(min(remaining, 1 << 20))
            if not block:
                break
            digest.update(block)
            chunks.append(block)
            remaining -= len(block)
        stored = handle.read(_DIGEST)
    if remaining or len(stored) != _DIGEST or digest.digest() != stored:
        raise CheckpointError(
            f"checkpoint {str(path)!r} failed its SHA-256 check: the file is truncated, corrupted or was modified"
        )
    rest = b"".join(chunks)
    del chunks
    header_bytes = rest[:header_length]
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise CheckpointError(f"checkpoint {str(path)!r} has a corrupt header: {error}") from error
    if not isinstance(header, dict) or header.get("format") != "flows-checkpoint":
        raise CheckpointError(f"checkpoint {str(path)!r} has an unrecognised header")
    if header.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format version {header.get('version')!r}; this flows reads version "
            f"{FORMAT_VERSION}"
        )
    if header.get("info") is not None and not isinstance(header.get("info"), dict):
        raise CheckpointError(f"checkpoint {str(path)!r}: expected a dict 'info' in its header, got {header['info']!r}")
    return header, (rest[header_length:] if payload else b"")


class _Inert:
    """What every object of a scanned pickle becomes: accepts any call and any state, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}


@dataclass
class _Storage:
    key: str
    numel: int


class _ArchiveScanner(pickle.Unpickler):
    """Walk the pickle of a ``torch.save`` archive without building anything: check every tensor's sizes.

    ``find_class`` hands out only inert stand-ins (no callable of the file's choosing ever runs),
    storages become their recorded element count (checked against the archive's record sizes),
    and every tensor rebuilt from a storage must fit inside it: a tensor of 10^11 elements over a
    storage of one (stride 0), or a storage that claims more bytes than its record holds, is
    refused here, before ``torch.load`` allocates anything.
    """

    def __init__(self, data: bytes, records: dict[str, int], where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.records, self.where = records, where

    def fail(self, what: str) -> None:
        raise CheckpointError(f"checkpoint {self.where} holds {what}; refused before allocating it")

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self.tensor
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return lambda data, *rest: data
        if module == "torch._utils" and name.startswith("_rebuild"):
            self.fail(f"a tensor of a kind flows never writes ({name})")
        if module == "torch" and name.endswith("Storage"):
            return _STORAGE_DTYPES.get(name, _Inert)
        return _Inert

    def persistent_load(self, pid: Any) -> _Storage:
        ok = isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[2], str)
        if not ok or not isinstance(pid[4], int) or pid[4] < 0 or not isinstance(pid[1], torch.dtype):
            self.fail(f"a storage reference that torch.save does not write ({str(pid)[:80]})")
        nbytes = pid[4] * pid[1].itemsize
        have = self.records.get(f"data/{pid[2]}")
        if have is None or nbytes > have:
            self.fail(f"a storage of {nbytes} bytes whose record holds {have or 0} bytes")
        return _Storage(pid[2], pid[4])

    def tensor(self, storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Inert:
        shape = (offset, *size, *stride) if isinstance(size, tuple) and isinstance(stride, tuple) else None
        if not isinstance(storage, _Storage) or shape is None or not all(isinstance(n, int) for n in shape):
            self.fail("a tensor record that torch.save does not write")
        if len(size) != len(stride) or min(shape, default=0) < 0:
            self.fail(f"a tensor with size {size} and stride {stride}")
        numel = math.prod(size)
        extent = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1 if numel else 0
        if numel > storage.numel or extent > storage.numel:
            self.fail(
                f"a tensor of {numel} elements (size {size}, stride {stride}) over a storage of {storage.numel}: "
                "expected every tensor to fit in the bytes the file holds"
            )
        return _Inert()


def _check_archive(payload: bytes, path: str | os.PathLike) -> None:
    """Refuse a payload whose tensors claim more elements than its storages hold (before ``torch.load``)."""
    where = repr(str(path))
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
        entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        raise CheckpointError(
            f"checkpoint {where} holds data that is not a torch.save archive of plain tensors and containers ({error})"
        ) from error
    if any(item.compress_type != zipfile.ZIP_STORED for item in entries):
        raise CheckpointError(
            f"checkpoint {where}: expected an uncompressed torch.save archive, got compressed records"
        )
    records = {item.filename.split("/", 1)[-1]: item.file_size for item in entries}
    pickles = [item for item in entries if item.filename.split("/", 1)[-1] == "data.pkl"]
    if len(pickles) != 1:
        raise CheckpointError(f"checkpoint {where}: expected one data.pkl in its archive, got {len(pickles)}")
    try:
        _ArchiveScanner(archive.read(pickles[0]), records, where).load()
    except CheckpointError:
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        RecursionError,
        MemoryError,
        zipfile.BadZipFile,
    ) as error:
        raise CheckpointError(
            f"checkpoint {where} holds data that is not plain tensors and containers ({type(error).__name__}: "
            f"{str(error)[:100]})"
        ) from error


def read_checkpoint_header(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON header of a checkpoint (kind, config, versions, info), without unpickling the payload.

    The whole file is read once to verify its SHA-256 before the header is trusted.

    Raises:
        FileNotFoundError: if the file does not exist.
        CheckpointError: if it is not a flows checkpoint or its header is damaged.
    """
    return _read(path, payload=False)[0]


def load_checkpoint(path: str | os.PathLike, *, map_location: str | torch.device | None = "cpu") -> Checkpoint:
    """Verify and load a checkpoint written by :func:`save_checkpoint`.

    Nothing in the file is unpickled before its SHA-256 matches, and the payload is then read
    with ``torch.load(weights_only=True)``: no code in a checkpoint file ever runs.

    Raises:
        FileNotFoundError: if the file does not exist.
        CheckpointError: if it is not a flows checkpoint, is truncated, fails its checksum or holds
            objects other than tensors and plain containers.
    """
    header, payload = _read(path, payload=True)
    if len(payload) != header.get("payload_bytes"):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: expected a payload of {header.get('payload_bytes')!r} bytes (its header), "
            f"got {len(payload)}"
        )
    _check_archive(payload, path)
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, ValueError, EOFError) as error:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds data that is not plain tensors and containers; refused to load it "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from error
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r}: expected a dict payload, got {type(state).__name__}")
    return Checkpoint(header, state)


def capture_rng_state() -> dict[str, Any]:
    """The states of torch's (CPU and CUDA), NumPy's and Python's global random generators."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    numpy_state = (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    np.random.set_state(numpy_state)  # noqa: NPY002
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
