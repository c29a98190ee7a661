r"""Self-describing model files: a ``safetensors`` weights file and a JSON config, rebuilt by :func:`load_model`.

:func:`save_model` writes two files side by side::

    model.safetensors   every tensor of the model's state dict (open it with ``safetensors`` alone)
    model.json          {"format": "flows.model", "format_version": 1, "flows_version": "0.1.0",
                         "builder": "NSF", "arguments": {"features": 6, "context": 0, "transforms": 5, ...},
                         "preprocessing": [{"layer": "Standardize", "options": {}}],
                         "weights": "model.safetensors", "aliases": {}}

The config holds the builder's **actual** constructor arguments, recorded when the model was built
(:class:`~flows.flow.Flow` records them; nothing has to be remembered by the caller), all of them,
defaults included. The same JSON is also stored in the weights file's metadata (key
``"flows_config"``), so the ``.safetensors`` file alone is enough to rebuild the model.

Loading reads JSON and raw tensors only: no pickle, no code from the file. Builder names are looked
up among the library's paper-named builders (and those registered with
:func:`flows.train.register_model`); activation arguments are stored as names of ``torch.nn``
classes and resolved only there. Anything else (a missing, extra or mis-shaped tensor, an unknown
builder, another format version) is refused with a :class:`ModelFileError` saying what was
expected and what was found.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["FORMAT_VERSION", "ModelFileError", "load_model", "read_model_config", "save_model"]

FORMAT = "flows.model"
FORMAT_VERSION = 1
_METADATA_KEY = "flows_config"


class ModelFileError(ValueError):
    """A model file that cannot be rebuilt: unknown builder, other version, or tensors that do not fit."""


def _flows_version() -> str:
    from flows import __version__

    return __version__


def _encode(value: Any, where: str) -> Any:
    """A JSON value for a constructor argument (``torch.nn`` classes by name); raise for anything else."""
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
    raise ModelFileError(
        f"save_model: expected constructor arguments that are JSON values or torch.nn classes, got {where}="
        f"{type(value).__name__}; build the model from plain arguments (or register a builder that takes them)"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"torch.nn"}:
            cls = getattr(nn, str(value["torch.nn"]), None)
            if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
                raise ModelFileError(f"load_model: expected the name of a torch.nn module class, got {value!r}")
            return cls
        return {k: _decode(v) for k, v in value.items()}
    return value


def _builders() -> dict[str, Any]:
    from flows.train.config import _REGISTRY, _architectures

    return {**_architectures(), **_REGISTRY}


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
    return {k: _encode(v, k) for k, v in arguments.items()}


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


def save_model(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``model`` as ``<stem>.safetensors`` (weights, config in the metadata) and ``<stem>.json`` (config).

    Args:
        model: a :class:`~flows.flow.Flow` made by a builder (``NSF``, ``RealNVP``, ...; its
            constructor arguments were recorded when it was built).
        path: a directory (files ``model.safetensors`` and ``model.json`` in it), or a file name
            whose suffix (if any) is replaced by ``.safetensors`` and ``.json``.

    Returns:
        the path of the weights file.

    Raises:
        ModelFileError: for a model a config cannot describe (a plain ``Flow`` of hand-made
            transforms, or constructor arguments that are objects rather than values).

    Example:
        >>> import tempfile, torch
        >>> from flows import NSF, load_model
        >>> model = NSF(3, transforms=2, hidden=(8,), standardize=torch.randn(50, 3) * 10 + 100)
        >>> path = save_model(model, tempfile.mkdtemp())
        >>> x = torch.randn(4, 3) * 10 + 100
        >>> torch.equal(load_model(path).log_prob(x), model.log_prob(x))
        True
    """
    from flows.flow import Flow

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    name = type(model).__name__
    if not isinstance(model, Flow) or not hasattr(model, "_arguments"):
        raise ModelFileError(f"save_model: expected a flow made by a builder (NSF, RealNVP, ...), got {name}")
    if type(model) is Flow or _builders().get(name) is not type(model):
        raise ModelFileError(
            f"save_model: expected a model made by one of the builders {sorted(_builders())}, got {name} "
            "(register a Flow subclass with flows.train.register_model(name, cls) to save it)"
        )
    weights, config_path = _paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _tensors(model)
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "flows_version": _flows_version(),
        "builder": name,
        "arguments": _arguments(model),
        "preprocessing": list(model.preprocessing),
        "weights": weights.name,
        "aliases": aliases,
    }
    text = json.dumps(config, indent=1, allow_nan=False)
    from safetensors.torch import save

    from flows.train._atomic import atomic_write_bytes, atomic_write_text

    # atomic (a kill mid-save leaves the earlier files whole) and with the user's umask
    atomic_write_bytes(weights, save(tensors, metadata={_METADATA_KEY: text}))
    atomic_write_text(config_path, text + "\n")
    return weights


def read_model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config of a model file: from the ``.json`` next to the weights, else from the weights' metadata.

    Raises:
        FileNotFoundError: when neither file exists.
        ModelFileError: for a file that is not a flows model file.
    """
    weights, config_path = _paths(path)
    if config_path.is_file():
        text = config_path.read_text(encoding="utf-8")
    elif weights.is_file():
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            text = (f.metadata() or {}).get(_METADATA_KEY)
        if text is None:
            raise ModelFileError(f"load_model: expected a flows config in the metadata of {str(weights)!r}, got none")
    else:
        raise FileNotFoundError(f"load_model: no model file at {str(path)!r} (looked for {weights} and {config_path})")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelFileError(f"load_model: expected a JSON config, got unreadable text ({error})") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ModelFileError(f"load_model: expected a config with format {FORMAT!r}, got {str(config)[:80]!r}")
    return config


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


def load_model(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> nn.Module:
    """Rebuild a model saved by :func:`save_model` (or a ``flows fit`` run directory) in one call.

    Args:
        path: the ``.safetensors`` file, the ``.json`` file, their common stem, or a directory
            holding ``model.safetensors`` (a ``flows fit`` run directory). A ``.ckpt`` file of the
            training checkpoint format is loaded with :func:`flows.train.load_model`.
        map_location: device of the returned model's tensors.

    Returns:
        the model, in eval mode, of the builder's own class.

    Raises:
        FileNotFoundError: when there is no model file.
        ModelFileError: for an unknown builder, another format or library version, or tensors that
            are missing, extra or of the wrong shape.
    """
    if Path(path).suffix == ".ckpt":
        from flows.train.checkpoint import load_model as load_checkpoint_model

        return load_checkpoint_model(path, map_location=map_location)
    config = read_model_config(path)
    _check_version(config)
    builders = _builders()
    name = config.get("builder")
    if name not in builders:
        raise ModelFileError(
            f"load_model: expected a builder among {sorted(builders)}, got {name!r} "
            "(a custom builder must be registered with flows.train.register_model before loading)"
        )
    arguments = _decode(config.get("arguments", {}))
    if not isinstance(arguments, dict):
        raise ModelFileError(f"load_model: expected 'arguments' to be a JSON object, got {arguments!r}")
    try:
        model = builders[name](**arguments)
    except (TypeError, ValueError) as error:
        raise ModelFileError(f"load_model: {name} refused the arguments of the model file: {error}") from error
    from flows.bijections.base import Bijection
    from flows.train.config import _layers

    layers = _layers()
    front, options = [], []
    for item in config.get("preprocessing") or []:
        layer = item.get("layer") if isinstance(item, dict) else None
        if layer not in layers:
            raise ModelFileError(f"load_model: expected preprocessing layers among {sorted(layers)}, got {item!r}")
        front.append(layers[layer](model.event_shape, **item.get("options", {})))
        options.append(item.get("options", {}))
    if front:
        model.prepend(*[t for t in front if isinstance(t, Bijection)], options=options)
    weights, _ = _paths(path)
    from safetensors.torch import load_file

    found = load_file(str(weights))
    aliases = config.get("aliases") or {}
    for alias, source in aliases.items():
        if source in found:
            found[alias] = found[source]
    expected = model.state_dict()
    _check_tensors(found, expected, repr(str(weights)))
    bad = [key for key, value in found.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())]
    if bad:
        raise ModelFileError(
            f"load_model: expected finite weights in {str(weights)!r}, got NaN/Inf values in {bad[:3]}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        )
    model.load_state_dict(found, strict=True)
    return model.to(map_location).eval()
