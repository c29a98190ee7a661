r"""Self-describing, verified model files: one ``safetensors`` file, with a JSON copy of its config beside it.

:func:`save_model` writes two files side by side::

    model.safetensors   every tensor of the model's state dict (open it with ``safetensors`` alone), and in
                        its metadata the config (key ``"flows_config"``) and the config's SHA-256
                        (key ``"flows_config_sha256"``)
    model.json          a human-readable copy of the same config:
                        {"format": "flows.model", "format_version": 2, "flows_version": "0.1.0",
                         "builder": "NSF", "arguments": {"features": 6, "context": 0, "transforms": 5, ...},
                         "preprocessing": [{"layer": "Standardize", "options": {}}], "dtype": "float32",
                         "event_shape": [6],
                         "tensors": {"transform.transforms.0.loc": {"dtype": "F32", "shape": [6],
                                                                    "sha256": "9f2c..."}, ...},
                         "weights": "model.safetensors", "aliases": {}, "info": {}}

The config holds the builder's **actual** constructor arguments, recorded when the model was built
(:class:`~flows.flow.Flow` records them), defaults included, the floating dtype of the model, and
the dtype, shape and SHA-256 of every tensor. The weights file is the file of record: it alone
rebuilds the model, and :func:`load_model` (like ``flows eval`` and ``flows check`` on a run
directory) verifies, before anything is built,

* the file layout: a header length that fits the file, tensor byte ranges that tile the data
  exactly (a truncated or padded file is refused), dtypes that safetensors defines;
* the config's SHA-256, and that ``model.json``, when present, says the same (an edited copy is
  refused, naming the keys that differ: a changed spline ``bound`` would give another density);
* every tensor's dtype, shape and SHA-256 against the config (one flipped bit is refused);
* every argument's JSON kind against the builder's annotation (``clamp=true``, ``hidden=[8.0]``);
* every size in the config against what the file can describe: an integer argument larger than
  the number of stored weights (or 4096) is refused, and the builder runs under an allocation budget
  (a few times the file's size) so that a config such as ``transforms=10**9`` stops with a
  :class:`ModelFileError` instead of building until memory runs out;
* the rebuilt model's tensors: the same names, shapes and dtypes (a float64 model comes back
  float64; a float16, int64 or bool tensor where the model has float32 weights is refused, never
  converted), and finite values.

The digests detect damage and edits; they do not authenticate (whoever can write the file can
recompute them), so a model file is trusted as much as its source. Loading reads JSON and raw
tensors only: no pickle, no code from the file. Builder names are looked up in the public
registry (:mod:`flows.architectures.registry`: the library's builders and those registered with
``register``); activation arguments are stored as names of ``torch.nn`` classes and resolved only
there. A model argument (the flow inside a ``DependentFlow``) is stored as its own description, and a
tensor argument whose content the weights hold (its ``relationship``) as its shape.

The config without its tensor table (:func:`describe_model`) is also what a training checkpoint
carries in its header: :func:`load_model` rebuilds a model from a ``.ckpt`` file through the same
checks, so there is one model config and one rebuild path.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["FORMAT_VERSION", "ModelFileError", "describe_model", "load_model", "read_model_config", "save_model"]

FORMAT = "flows.model"
FORMAT_VERSION = 2
_METADATA_KEY = "flows_config"
_DIGEST_KEY = "flows_config_sha256"
_MAX_HEADER = 100 * 2**20  # safetensors' own bound on a header
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_NOT_SIZES = frozenset(
    {"seed", "eiw_update_steps", "max_evaluations"}
)  # integer arguments that are not sizes of the model


class ModelFileError(ValueError):
    """A model file that cannot be rebuilt: damaged, edited, unknown builder, other version or unfitting tensors."""


def _flows_version() -> str:
    from flows import __version__

    return __version__


def _encode(value: Any, where: str, owner: type | None = None) -> Any:
    """A JSON value for a constructor argument; raise for anything else.

    ``torch.nn`` classes are stored by name, a model made by a registered builder (the flow inside
    a :class:`~flows.architectures.dependent.DependentFlow`) as its own description, and a tensor
    argument that ``owner.rebuilt_from_weights`` names (its content is in the weights) as its shape.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _encode(v, where) for k, v in value.items()}
    if inspect.isclass(value) and issubclass(value, nn.Module) and getattr(nn, value.__name__, None) is value:
        return {"torch.nn": value.__name__}
    if isinstance(value, torch.Generator):
        return None  # only draws random orders, which the weights (mask buffers) carry
    if isinstance(value, Tensor) and where in getattr(owner, "rebuilt_from_weights", ()):
        return {"torch.Tensor": {"shape": list(value.shape)}}
    if isinstance(value, nn.Module) and hasattr(value, "_arguments"):
        return {"flows.model": _description(value)}
    raise ModelFileError(
        f"save_model: expected constructor arguments that are JSON values or torch.nn classes, got {where}="
        f"{type(value).__name__}; build the model from plain arguments (or register a builder that takes them)"
    )


def _decode(value: Any) -> Any:
    """The argument a JSON value stands for (nested models and tensor shapes stay as they are: see :func:`_build`)."""
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"torch.nn"}:
            cls = getattr(nn, str(value["torch.nn"]), None)
            if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
                raise ModelFileError(f"load_model: expected the name of a torch.nn module class, got {value!r}")
            return cls
        if set(value) in ({"torch.Tensor"}, {"flows.model"}):
            return value
        return {k: _decode(v) for k, v in value.items()}
    return value


def _registered_name(model: nn.Module) -> str:
    """The registry name of ``model``'s class; refuse a model no registered builder made."""
    from flows.architectures.registry import builders, name_of

    cls = type(model)
    name = name_of(cls) if hasattr(model, "_arguments") else None
    if name is None:
        raise ModelFileError(
            f"save_model: expected a model made by one of the builders {sorted(builders())}, got {cls.__name__} "
            "(register its class with flows.architectures.registry.register to save it)"
        )
    return name


def _description(model: nn.Module) -> dict[str, Any]:
    """``{"builder", "arguments", "preprocessing"}`` of a model made by a registered builder."""
    return {
        "builder": _registered_name(model),
        "arguments": _arguments(model),
        "preprocessing": list(getattr(model, "preprocessing", [])),
    }


def _arguments(model: nn.Module) -> dict[str, Any]:
    """The recorded constructor arguments of ``model``, bound to its signature with defaults applied."""
    args, kwargs = model._arguments
    signature = inspect.signature(type(model).__init__)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as error:  # a subclass whose __init__ does not take what it was called with
        raise ModelFileError(
            f"save_model: cannot match the recorded arguments of {type(model).__name__}: {error}"
        ) from error
    bound.apply_defaults()
    arguments = dict(list(bound.arguments.items())[1:])
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL and arguments.get(name):
            raise ModelFileError(f"save_model: expected keyword arguments only, {type(model).__name__} got *{name}")
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            arguments.pop(name, None)
    arguments.pop("standardize", None)  # recorded as a preprocessing layer; its statistics are weights
    return {k: _encode(v, k, type(model)) for k, v in arguments.items()}


def _storage_key(t: Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The state dict as independent contiguous CPU tensors, with tied entries stored once (aliases)."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        key = _storage_key(t)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu", copy=True).contiguous()
    return tensors, aliases


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, config)`` for a directory, a ``.safetensors`` file, a ``.json`` file or a stem."""
    path = Path(path)
    if path.is_dir():
        return path / "model.safetensors", path / "model.json"
    if path.suffix in (".safetensors", ".json"):
        return path.with_suffix(".safetensors"), path.with_suffix(".json")
    return Path(f"{path}.safetensors"), Path(f"{path}.json")


def _digest(t: Tensor) -> str:
    """SHA-256 of a tensor's bytes as safetensors stores them (contiguous, little endian)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def _model_dtype(tensors: dict[str, Tensor]) -> torch.dtype | None:
    """The one floating dtype of a model's tensors (float32 for a model with none; ``None`` when they mix)."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return None if len(kinds) > 1 else next(iter(kinds), torch.float32)


def _check_mixed(model: nn.Module, config: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    """Refuse mixed floating dtypes unless they are the builder's own (a ``DependentFlow``'s float64 base).

    A model of one dtype comes back through ``.to(dtype)``; one of several comes back only as its
    builder makes it, so the builder is run once here and must make the same dtypes.
    """
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    fresh = _build(config, sum(t.numel() for t in tensors.values()), len(tensors), nbytes, "save_model")
    built = fresh.state_dict()
    differ = sorted(k for k, t in tensors.items() if k in built and built[k].dtype != t.dtype)
    if differ:
        kinds = sorted({str(t.dtype) for t in tensors.values() if t.is_floating_point()})
        raise ModelFileError(
            f"save_model: expected one floating dtype across the tensors of {type(model).__name__} (or the dtypes "
            f"its builder makes), got {kinds} with {differ[:3]} of another dtype than built; convert the model "
            "with .to(dtype) first"
        )


def _unwrapped(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def describe_model(model: nn.Module) -> dict[str, Any]:
    """The model config: the JSON dict that rebuilds ``model``, as a model file and a training checkpoint store it.

    ``{"format": "flows.model", "format_version", "flows_version", "builder", "arguments",
    "preprocessing", "dtype"}``: the registered builder's name, its actual constructor arguments
    (recorded when the model was built, defaults included), the preprocessing layers put in front of
    its transform, the model's floating dtype (``None`` for a model whose builder mixes them: a
    ``DependentFlow`` keeps its matrix-normal base in float64) and its event shape (``None`` for a
    model without one), which a rebuild must reproduce: it pins sizes that no weight's shape
    depends on, such as ``EquivariantCNF``'s particle count. :func:`save_model` writes this dict with the tensor
    table added; ``flows fit`` stores it in its training checkpoints and ``run.json``.

    Raises:
        ModelFileError: for a model no registered builder made (see :func:`save_model`).

    Example:
        >>> from flows import RealNVP
        >>> config = describe_model(RealNVP(2, transforms=2, hidden=(8,)))
        >>> config["builder"], config["arguments"]["transforms"], config["dtype"]
        ('RealNVP', 2, 'float32')
    """
    model = _unwrapped(model)
    description = _description(model)
    dtype = _model_dtype(dict(model.state_dict()))
    config = {"format": FORMAT, "format_version": FORMAT_VERSION, "flows_version": _flows_version()}
    shape = getattr(model, "event_shape", None)
    return {
        **config,
        **description,
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "event_shape": None if shape is None else list(shape),
    }


def save_model(model: nn.Module, path: str | os.PathLike, *, info: dict[str, Any] | None = None) -> Path:
    """Write ``model`` as ``<stem>.safetensors`` (weights, config and digests) and ``<stem>.json`` (its config).

    Args:
        model: a model made by a registered builder (:func:`flows.architectures.registry.builders`:
            ``NSF``, ``RealNVP``, ``DependentFlow``, ``EquivariantCNF``, ...; its constructor
            arguments were recorded when it was built), of one floating dtype.
        path: a directory (files ``model.safetensors`` and ``model.json`` in it), or a file name
            whose suffix (if any) is replaced by ``.safetensors`` and ``.json``.
        info: extra JSON facts stored with the config (``flows fit`` records the data set here).

    Returns:
        the path of the weights file.

    Raises:
        ModelFileError: for a model a config cannot describe (a plain ``Flow`` of hand-made
            transforms, an unregistered class, constructor arguments that are objects rather than
            values, mixed floating dtypes).

    Example:
        >>> import tempfile, torch
        >>> from flows import NSF, load_model
        >>> model = NSF(3, transforms=2, hidden=(8,), standardize=torch.randn(50, 3) * 10 + 100)
        >>> path = save_model(model, tempfile.mkdtemp())
        >>> x = torch.randn(4, 3) * 10 + 100
        >>> torch.equal(load_model(path).log_prob(x), model.log_prob(x))
        True
    """
    model = _unwrapped(model)
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"save_model: expected info to be a dict of JSON values, got {type(info).__name__}")
    config = describe_model(model)
    weights, config_path = _paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _tensors(model)
    if config["dtype"] is None:
        _check_mixed(model, config, tensors)
    config = {
        **config,
        "tensors": {
            k: {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "sha256": _digest(t)} for k, t in tensors.items()
        },
        "weights": weights.name,
        "aliases": aliases,
        "info": info or {},
    }
    try:
        text = json.dumps(config, indent=1, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ModelFileError(
            f"save_model: expected JSON values in the config and info, got an error: {error}"
        ) from error
    from safetensors.torch import save

    from flows.train._atomic import atomic_write_bytes, atomic_write_text

    metadata = {_METADATA_KEY: text, _DIGEST_KEY: hashlib.sha256(text.encode("utf-8")).hexdigest()}
    # atomic (a kill mid-save leaves the earlier files whole) and with the user's umask
    atomic_write_bytes(weights, save(tensors, metadata=metadata))
    atomic_write_text(config_path, text + "\n")
    return weights


def _read_header(path: Path, *, data: bool) -> tuple[dict[str, Any], dict[str, str], bytes]:
    """Parse and bound-check a safetensors file: ``(tensor entries, metadata, data bytes)``.

    Every length is checked against the file's size before anything is allocated, and the tensor
    byte ranges must tile the data section exactly (nothing missing, nothing appended).
    """
    where = repr(str(path))
    if not path.is_file():
        raise FileNotFoundError(f"load_model: no weights file at {where}")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ModelFileError(f"load_model: {where} is truncated ({size} bytes): expected a safetensors file")
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, _MAX_HEADER):
            raise ModelFileError(
                f"load_model: {where} is truncated or not a safetensors file: expected a header of at most "
                f"{min(size - 8, _MAX_HEADER)} bytes, got a header length of {length}"
            )
        head = handle.read(length)
        body = handle.read() if data else b""
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ModelFileError(f"load_model: {where} has a corrupt safetensors header: {error}") from error
    if not isinstance(header, dict):
        raise ModelFileError(f"load_model: {where}: expected a JSON object as safetensors header, got {head[:40]!r}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelFileError(f"load_model: {where}: expected string metadata in the header, got {metadata!r:.80}")
    _check_layout(header, size - 8 - length, where)
    return header, metadata, body


def _check_layout(header: dict[str, Any], room: int, where: str) -> None:
    spans = []
    for name, entry in header.items():
        ok = isinstance(entry, dict) and entry.get("dtype") in _DTYPES and isinstance(entry.get("shape"), list)
        ok = ok and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"])
        offsets = entry.get("data_offsets") if ok else None
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)
        if not ok:
            raise ModelFileError(
                f"load_model: {where}: expected tensor {name!r} with a dtype among {sorted(_DTYPES)}, a shape "
                f"and data offsets, got {entry!r:.120}"
            )
        begin, end = offsets
        nbytes = math.prod(entry["shape"]) * _DTYPES[entry["dtype"]].itemsize
        if not 0 <= begin <= end <= room or end - begin != nbytes:
            raise ModelFileError(
                f"load_model: {where} is truncated or corrupt: tensor {name!r} of shape {entry['shape']} "
                f"({nbytes} bytes) is recorded at bytes {begin}..{end} of a data section of {room} bytes"
            )
        spans.append((begin, end))
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            break
        covered = end
    if covered != room:
        raise ModelFileError(
            f"load_model: {where} is truncated, padded or corrupt: expected its tensors to fill the {room} bytes "
            f"of its data section, got tensors that cover {covered} contiguous bytes"
        )


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{prefix}{key}")
            else:
                out += _differences(a[key], b[key], f"{prefix}{key}.")
        return out
    same = type(a) is type(b) and a == b
    return [] if same else [prefix.rstrip(".") or "(the whole config)"]


def _verified_config(weights: Path, config_path: Path, metadata: dict[str, str]) -> dict[str, Any]:
    """The config of record (the weights' metadata), checked against its digest and against ``model.json``."""
    where = repr(str(weights))
    text = metadata.get(_METADATA_KEY)
    if text is None:
        raise ModelFileError(f"load_model: expected a flows config in the metadata of {where}, got none")
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != metadata.get(_DIGEST_KEY):
        raise ModelFileError(
            f"load_model: the config stored in {where} failed its SHA-256 check: expected the digest recorded "
            "beside it (the file was damaged or edited)"
        )
    config = _parse(text, where)
    if config_path.is_file():
        copy = _parse(config_path.read_text(encoding="utf-8", errors="replace"), repr(str(config_path)))
        differing = _differences(config, copy)
        if differing:
            raise ModelFileError(
                f"load_model: {str(config_path)!r} differs from the config stored in {where} at "
                f"{differing[:8]}{' ...' if len(differing) > 8 else ''}: expected the copy written beside the "
                "weights (one of the two was edited; delete model.json to load what the weights file says)"
            )
    return config


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise ModelFileError(f"load_model: expected a JSON config in {where}, got unreadable text ({error})") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ModelFileError(
            f"load_model: expected a config with format {FORMAT!r} in {where}, got {str(config)[:80]!r}"
        )
    return config


def read_model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The verified config of a model file (from the weights' metadata, checked against ``model.json``).

    Raises:
        FileNotFoundError: when the weights file does not exist.
        ModelFileError: for a file that is not a flows model file, is damaged, or whose
            ``model.json`` differs from the config stored in the weights.
    """
    weights, config_path = _paths(path)
    if not weights.is_file():
        raise FileNotFoundError(f"load_model: no model file at {str(path)!r} (looked for {weights})")
    _, metadata, _ = _read_header(weights, data=False)
    return _verified_config(weights, config_path, metadata)


def _check_version(config: dict[str, Any]) -> None:
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelFileError(
            f"load_model: expected model file format version {FORMAT_VERSION}, got {version!r} "
            f"(written by flows {config.get('flows_version')!r}; this is flows {_flows_version()})"
        )
    written, running = str(config.get("flows_version")), _flows_version()
    if written.split(".")[:2] != running.split(".")[:2]:
        raise ModelFileError(
            f"load_model: expected a model file written by flows {'.'.join(running.split('.')[:2])}.x, "
            f"got one written by flows {written}; builders' arguments may differ between versions"
        )


def _check_table(config: dict[str, Any], header: dict[str, Any], body: bytes, where: str) -> None:
    """Every tensor of the file against the config's record of it: dtype, shape and SHA-256."""
    table = config.get("tensors")
    if not isinstance(table, dict) or set(table) != set(header):
        names = sorted(set(table) ^ set(header)) if isinstance(table, dict) else []
        raise ModelFileError(
            f"load_model: expected the tensors recorded in the config of {where}, got a file whose tensors "
            f"differ at {names[:8]}"
        )
    for name, entry in header.items():
        record = table[name]
        if not isinstance(record, dict) or [record.get("dtype"), record.get("shape")] != [
            entry["dtype"],
            entry["shape"],
        ]:
            raise ModelFileError(
                f"load_model: expected tensor {name!r} of {where} as its config records it ({record!r:.100}), "
                f"got dtype {entry['dtype']} and shape {entry['shape']}"
            )
        begin, end = entry["data_offsets"]
        if hashlib.sha256(body[begin:end]).hexdigest() != record.get("sha256"):
            raise ModelFileError(
                f"load_model: tensor {name!r} of {where} failed its SHA-256 check: the file was damaged or edited"
            )


def _check_sizes(arguments: Any, stored: int, where: str) -> None:
    """Refuse integer arguments (nested ones and tensor shapes too) larger than the weights could describe."""
    bound = max(stored, 4096)

    def visit(value: Any, name: str) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int) and abs(value) > bound:
            raise ModelFileError(
                f"load_model: the config of {where} asks for {name}={value}, more than the {stored} weights the "
                f"file holds could describe: expected a size of at most {bound}"
            )
        if isinstance(value, list):
            for i, item in enumerate(value):
                visit(item, f"{name}[{i}]")
        if isinstance(value, dict):
            for key, item in value.items():
                if key not in _NOT_SIZES:
                    visit(item, f"{name}.{key}" if name else key)

    visit(arguments, "")


_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "None": (type(None),),
}
_OBJECTS = ("nn.Module", "Standardize", "torch.Generator")  # stored only as None


class _Nested:
    """The kind of a ``Flow`` argument: a nested model's description (``{"flows.model": ...}``)."""


class _Shaped:
    """The kind of a ``Tensor`` argument whose content the weights hold (``{"torch.Tensor": {"shape"}}``)."""


def _kinds(annotation: object) -> tuple[type, ...] | None:
    """The JSON kinds a (string) annotation admits, ``None`` when it is not one this check reads."""
    if not isinstance(annotation, str):
        return None
    kinds: list[type] = []
    for part in (p.strip() for p in annotation.split("|")):
        if part in _KINDS:
            kinds += _KINDS[part]
        elif part.startswith(("Sequence[int]", "list[int]", "tuple[int")):
            kinds.append(list)
        elif part.startswith(("Callable[", "type[")):
            kinds.append(type)
        elif part in ("Flow", "Tensor"):
            kinds.append(_Nested if part == "Flow" else _Shaped)
        elif part not in _OBJECTS:
            return None
    return tuple(kinds)


def _check_types(builder: Any, arguments: dict[str, Any], where: str) -> None:
    """Refuse an argument whose JSON kind the builder's annotation does not admit (``clamp=true``)."""
    try:
        # a class's __init__, read directly: Flow defines __new__(*args, **kwargs), which some Python
        # versions (3.11.2) report as the class's signature
        target = builder.__init__ if inspect.isclass(builder) else builder
        parameters = dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return
    parameters.pop("self", None)
    for name, value in arguments.items():
        kinds = _kinds(parameters[name].annotation) if name in parameters else None
        if kinds is None:
            continue
        tag = set(value) if isinstance(value, dict) else set()
        if tag in ({"flows.model"}, {"torch.Tensor"}):
            ok = (_Nested if tag == {"flows.model"} else _Shaped) in kinds
        elif isinstance(value, bool):
            ok = bool in kinds
        elif isinstance(value, list):
            ok = list in kinds and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        elif inspect.isclass(value):
            ok = type in kinds
        else:
            plain = (int, float, str, type(None))
            ok = isinstance(value, tuple(k for k in kinds if k in plain))
        if not ok:
            raise ModelFileError(
                f"load_model: expected argument {name!r} of the config of {where} to be "
                f"{parameters[name].annotation}, got {value!r:.60}"
            )


def _ints(value: Any) -> list[int] | None:
    """``value`` as a list of sizes (an int or a sequence of ints), ``None`` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (tuple, list, torch.Size)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _requested(name: str, args: tuple, kwargs: dict) -> int:
    """The number of elements a torch factory call asks for (0 when it is not one this check reads)."""
    if name in ("empty", "zeros", "ones", "rand", "randn", "full", "randint", "normal"):
        size = kwargs.get("size")
        if size is None and name == "randint":
            size = next((a for a in args if isinstance(a, (tuple, list, torch.Size))), None)
        elif size is None and name in ("full", "normal"):
            size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else None
        elif size is None:
            size = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
        sizes = _ints(size)
        return math.prod(abs(n) for n in sizes) if sizes else 0
    if name in ("randperm", "eye"):
        sizes = _ints(list(args[:2]))
        return (sizes[0] * (sizes[-1] if name == "eye" else 1)) if sizes else 0
    if name in ("arange", "linspace", "logspace"):
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if name != "arange":
            steps = kwargs.get("steps", numbers[2] if len(numbers) > 2 else 0)
            return int(steps) if isinstance(steps, int) else 0
        if len(numbers) == 1:
            numbers = [0, numbers[0]]
        start, end, step = [*numbers, 1][:3] if len(numbers) >= 2 else (0, 0, 1)
        return max(0, math.ceil((end - start) / step)) if step and math.isfinite(end - start) else 0
    return 0


class _BuildBudget(TorchFunctionMode):
    """Refuse tensor allocations beyond a byte and call budget while a model is being built.

    Factory calls (``empty``, ``zeros``, ``randn``, ``arange``, ...) are checked *before* they
    allocate, so a config asking for a billion-wide layer stops here instead of in the allocator,
    and the number of torch calls is bounded, so a config asking for a billion tiny layers stops
    after a few thousand. (A function mode, not a dispatch mode: it does not import ``torch._dynamo``.)
    """

    def __init__(self, max_bytes: int, max_calls: int, where: str) -> None:
        super().__init__()
        self.max_bytes, self.max_calls, self.where = max_bytes, max_calls, where
        self.bytes = self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls += 1
        dtype = kwargs.get("dtype")
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else torch.get_default_dtype().itemsize
        requested = _requested(getattr(func, "__name__", ""), args, kwargs)
        self.bytes += requested * max(itemsize, 1)
        # refuse only at a factory call: raising at another (the grad-mode restore of a no_grad block's
        # exit) would leave torch's global state changed
        if requested and (self.bytes > self.max_bytes or self.calls > self.max_calls):
            raise ModelFileError(
                f"load_model: the config of {self.where} builds a model larger than its weights: expected at most "
                f"{self.max_bytes} bytes in {self.max_calls} torch calls while building, got "
                f"{self.bytes} bytes in {self.calls} (a size in the config was edited)"
            )
        return func(*args, **kwargs)


def _layers() -> dict[str, type]:
    """The preprocessing layers a config may name: the exported transforms of :mod:`flows.bijections`."""
    import flows.bijections as bijections
    from flows.bijections.base import Bijection

    found = {name: getattr(bijections, name) for name in bijections.__all__}
    return {name: obj for name, obj in found.items() if inspect.isclass(obj) and issubclass(obj, Bijection)}


def _construct(description: Any, where: str) -> nn.Module:
    """Build the model a description (``builder``, ``arguments``, ``preprocessing``) names, nested models first."""
    from flows.architectures.registry import builders, get

    name = description.get("builder") if isinstance(description, dict) else None
    builder = get(name, None) if isinstance(name, str) else None
    if builder is None:
        raise ModelFileError(
            f"load_model: expected a builder among {sorted(builders())}, got {name!r} "
            "(a custom builder must be registered with flows.architectures.registry.register before loading)"
        )
    arguments = _decode(description.get("arguments", {}))
    if not isinstance(arguments, dict):
        raise ModelFileError(f"load_model: expected 'arguments' to be a JSON object, got {arguments!r}")
    _check_types(builder, arguments, where)
    for key, value in arguments.items():
        if isinstance(value, dict) and set(value) == {"flows.model"}:
            arguments[key] = _construct(value["flows.model"], where)
        elif isinstance(value, dict) and set(value) == {"torch.Tensor"}:
            shape = value["torch.Tensor"].get("shape") if isinstance(value["torch.Tensor"], dict) else None
            if _ints(shape) is None or any(n < 0 for n in shape):
                raise ModelFileError(f"load_model: expected a tensor shape for {key!r} in {where}, got {value!r:.80}")
            arguments[key] = torch.zeros(shape, dtype=torch.float64)  # the weights hold its content
    model = builder(**arguments)
    layers = _layers()
    front, options = [], []
    for item in description.get("preprocessing") or []:
        layer = item.get("layer") if isinstance(item, dict) else None
        if layer not in layers or not isinstance(item.get("options", {}), dict):
            raise ModelFileError(f"load_model: expected preprocessing layers among {sorted(layers)}, got {item!r}")
        front.append(layers[layer](model.event_shape, **item.get("options", {})))
        options.append(item.get("options", {}))
    if front:
        model.prepend(*front, options=options)
    return model


def _build(config: dict[str, Any], stored: int, tensors: int, nbytes: int, where: str) -> nn.Module:
    """The model of a config, built under budgets set by the weights that will fill it.

    Args:
        config: the config (``builder``, ``arguments``, ``preprocessing``).
        stored: number of stored weight elements (no size argument may exceed it, or 4096).
        tensors: number of stored tensors (bounds the torch calls of the build).
        nbytes: bytes of stored weights (bounds what the build may allocate).
        where: the file, for messages.
    """
    _check_sizes(config.get("arguments", {}), stored, where)
    budget = _BuildBudget(16 * nbytes + 2**26, 64 * tensors + 4096, where)
    grad = torch.is_grad_enabled()
    try:
        with budget, torch.random.fork_rng(devices=[]):
            return _construct(config, where)
    except ModelFileError:
        raise
    except (TypeError, ValueError, RuntimeError, OverflowError, ArithmeticError, LookupError, AssertionError) as error:
        raise ModelFileError(
            f"load_model: expected arguments that {config.get('builder')} accepts in the config of {where}, got an "
            f"error: {type(error).__name__}: {error}"
        ) from error
    finally:
        torch.set_grad_enabled(grad)  # a builder stopped inside a no_grad block must not leave it disabled


def _device(map_location: str | torch.device) -> torch.device:
    try:
        device = torch.device(map_location)
    except (TypeError, RuntimeError) as error:
        raise ModelFileError(
            f"load_model: expected map_location to be a device such as 'cpu', got {map_location!r}"
        ) from error
    if device.type == "meta":
        raise ModelFileError("load_model: expected map_location to be a device that holds data, got 'meta'")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, AttributeError) as error:
        raise ModelFileError(
            f"load_model: expected map_location to be an available device, got {map_location!r} ({error})"
        ) from error
    return device


def _tensor(entry: dict[str, Any], body: bytes) -> Tensor:
    begin, end = entry["data_offsets"]
    dtype = _DTYPES[entry["dtype"]]
    if begin == end:
        return torch.empty(entry["shape"], dtype=dtype)
    return torch.frombuffer(bytearray(body[begin:end]), dtype=dtype).reshape(entry["shape"])


def _model_file_parts(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Tensor], str]:
    """The verified config and tensors of a model file (aliases resolved), and its name for messages."""
    weights, config_path = _paths(path)
    if not weights.is_file():
        raise FileNotFoundError(f"load_model: no model file at {str(path)!r} (looked for {weights})")
    header, metadata, body = _read_header(weights, data=True)
    where = repr(str(weights))
    config = _verified_config(weights, config_path, metadata)
    _check_version(config)
    _check_table(config, header, body, where)
    found = {name: _tensor(entry, body) for name, entry in header.items()}
    aliases = config.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ModelFileError(
            f"load_model: expected 'aliases' to map tensor names to names in {where}, got {aliases!r:.80}"
        )
    for alias, source in aliases.items():
        if source in found:
            found[alias] = found[source]
    return config, found, where


def _checkpoint_parts(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Tensor], str]:
    """The model config and weights of a training checkpoint (its container verified by its own checks)."""
    from flows.train.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path, map_location="cpu")
    where = repr(str(path))
    config = checkpoint.config
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ModelFileError(
            f"load_model: expected a checkpoint whose header holds a model config (format {FORMAT!r}, written by "
            f"flows fit or Trainer(config=flows.model_file.describe_model(model))), got {str(config)[:80]!r} in {where}"
        )
    _check_version(config)
    weights = checkpoint.state.get("model")
    if not isinstance(weights, dict) or not all(isinstance(t, Tensor) for t in weights.values()):
        raise ModelFileError(
            f"load_model: expected the model's weights under 'model' in {where}, it has "
            f"{sorted(map(str, checkpoint.state))}"
        )
    return config, dict(weights), where


def load_model(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> nn.Module:
    """Verify and rebuild a model saved by :func:`save_model` (or a ``flows fit`` run directory) in one call.

    Args:
        path: the ``.safetensors`` file, the ``.json`` file, their common stem, or a directory
            holding ``model.safetensors`` (a ``flows fit`` run directory); or a training checkpoint
            (``.ckpt``), whose header carries the same model config (:func:`describe_model`) and
            whose container has its own checksum (:mod:`flows.train.checkpoint`).
        map_location: device of the returned model's tensors.

    Returns:
        the model, in eval mode, of the builder's own class and of the dtype it was saved in.

    Raises:
        FileNotFoundError: when there is no model file.
        ModelFileError: for a damaged or edited file (layout, SHA-256 of the config or of a tensor,
            a ``model.json`` that differs from the weights' config), an unknown builder, another
            format or library version, sizes the file cannot describe, tensors that are missing,
            extra, of the wrong shape or dtype, or not finite, or an unusable ``map_location``.
        flows.train.CheckpointError: for a damaged training checkpoint.
    """
    device = _device(map_location)
    checkpoint = Path(path).suffix == ".ckpt"
    config, found, where = _checkpoint_parts(path) if checkpoint else _model_file_parts(path)
    stored = sum(t.numel() for t in found.values())
    nbytes = sum(t.numel() * t.element_size() for t in found.values())
    model = _build(config, stored, len(found), nbytes, where)
    dtype = getattr(torch, str(config.get("dtype")), None)
    if config.get("dtype") is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ModelFileError(
            f"load_model: expected a floating 'dtype' (or null: the builder's own dtypes) in the config of {where}, "
            f"got {config.get('dtype')!r}"
        )
    model = model if config.get("dtype") is None else model.to(dtype)
    shape = getattr(model, "event_shape", None)
    if config.get("event_shape") is not None and (shape is None or list(shape) != config["event_shape"]):
        raise ModelFileError(
            f"load_model: expected a model of event shape {config['event_shape']} as the config of {where} records, "
            f"got {None if shape is None else list(shape)} from its arguments (an argument was edited)"
        )
    _check_tensors(found, model.state_dict(), where)
    bad = [key for key, value in found.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())]
    if bad:
        raise ModelFileError(
            f"load_model: expected finite weights in {where}, got NaN/Inf values in {bad[:3]}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        )
    model.load_state_dict(found, strict=True)
    return model.to(device).eval()


def _check_tensors(found: dict[str, Tensor], expected: dict[str, Tensor], where: str) -> None:
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ModelFileError(
            f"load_model: expected the tensors of the model the config describes, got {where} with "
            f"missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''} and "
            f"extra tensors {extra[:8]}{' ...' if len(extra) > 8 else ''}"
        )
    for name, t in expected.items():
        if tuple(found[name].shape) != tuple(t.shape):
            raise ModelFileError(
                f"load_model: expected tensor {name!r} of shape {tuple(t.shape)}, got {tuple(found[name].shape)} "
                f"in {where}"
            )
        if found[name].dtype != t.dtype:
            raise ModelFileError(
                f"load_model: expected tensor {name!r} of dtype {t.dtype}, got {found[name].dtype} in {where} "
                "(refused rather than converted)"
            )
