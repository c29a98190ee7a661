"""Model-file attacks (family ``model-file``): every builder's ``save_model`` file, damaged and edited.

For every builder of the public registry (:func:`flows.architectures.registry.builders`) a tiny
model is saved with :func:`flows.save_model` and then attacked through :func:`flows.load_model`:

* ``json-edit/<argument>``: one stored argument of ``model.json`` changed to another value (the
  weights file untouched): must be refused, since another ``bound`` or activation is another density;
* ``resigned-wrong-type/<argument>``: a value of another JSON kind (a string for a number, a
  float for a string), digests recomputed: refused against the builder's annotations;
* ``resigned-huge/<argument>``: an integer (or list of integers) argument set to 10^9 in both files,
  the config digest recomputed as an editor would: refused before anything that size is built;
  ``resigned-large/<argument>``: set to max(stored weights, 4096), the most the size bound lets
  through, so that the builder's allocation budget (or the tensor comparison) must refuse it (an
  argument the built model does not use, such as ``embedding`` without a shared conditioner, may
  load: then it must give the saved density);
* ``flipped/<part>``: one bit flipped in the header length, the tensor table, the stored config, the
  ``model.json`` copy, and in every tensor's bytes;
* ``truncated/<where>``, ``padded``, ``header-size-huge``, ``header-size-past-end``;
* ``dtype/<dtype>``: the first floating tensor re-stored as float16/int64/bool/float64 (re-signed):
  refused, never converted;
* ``other-configuration``: the tensors of a wider model under this model's config (re-signed);
* ``round-trip`` and ``float64-round-trip`` (``ok``: the same density, float64 stays float64);
* ``map-location/<value>``: an unknown, absent or data-less device; ``missing-weights``.

Re-signed files have every digest recomputed, so they reach the checks behind the digests.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from tests.robustness.table import Attack, Result, expect_clear, expect_right_or_clear, workspace

__all__ = ["attacks"]

FAMILY = "model-file"


def _names() -> list[str]:
    from tests.robustness.api import _builders

    return list(_builders())


def _model(name: str, **override):
    from tests.robustness.api import _build

    model = _build(name, **override).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _x(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    if hasattr(model, "log_prob_full"):  # a DependentFlow: the density of a whole (related) set
        return 0.05 + 0.9 * torch.rand((model.base.n, *model.flow.event_shape), generator=gen)
    return 0.05 + 0.9 * torch.rand((4, *model.event_shape), generator=gen)


def _density(model, x: torch.Tensor) -> torch.Tensor:
    """``log_prob(x)``, or the joint density of the set for a model over related samples (``DependentFlow``)."""
    return model.log_prob_full(x).reshape(1) if hasattr(model, "log_prob_full") else model.log_prob(x)


@functools.cache
def _original(name: str) -> tuple[bytes, str, torch.Tensor, torch.Tensor]:
    """``(weights bytes, model.json text, x, log_prob(x))`` of a saved tiny ``name`` model."""
    from flows import save_model

    root = workspace() / FAMILY / name / "original"
    model = _model(name)
    path = save_model(model, root)
    x = _x(model)
    with torch.no_grad():
        reference = _density(model, x)
    return path.read_bytes(), path.with_suffix(".json").read_text(), x, reference


def _split(data: bytes) -> tuple[dict, int]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), n


def _resigned(config: dict, tensors: dict[str, torch.Tensor]) -> tuple[bytes, str]:
    """A weights file and model.json that agree on ``config``, with every digest recomputed."""
    from safetensors.torch import save

    from flows.model_file import _NAMES, _digest

    config = {
        **config,
        "tensors": {
            k: {"dtype": _NAMES[v.dtype], "shape": list(v.shape), "sha256": _digest(v)} for k, v in tensors.items()
        },
    }
    text = json.dumps(config, indent=1)
    metadata = {"flows_config": text, "flows_config_sha256": hashlib.sha256(text.encode()).hexdigest()}
    return save(tensors, metadata=metadata), text


def _tensors(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(_original(name)[0])


def _config(name: str) -> dict:
    return json.loads(_original(name)[1])


def _flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0x04
    return bytes(out)


def _other_value(value):
    """Another value of the same kind (valid or not: every edit of model.json must be refused)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, value[-1]] if value else [1]
    if isinstance(value, dict) and "torch.nn" in value:
        return {"torch.nn": "Tanh" if value["torch.nn"] != "Tanh" else "ReLU"}
    return 1  # None


def _is_size(value) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _files(name: str) -> dict[str, Callable[[], tuple[bytes, str | None]]]:
    """Every crafted (weights, json) pair for ``name``; ``None`` json means no model.json beside it."""
    weights, text = _original(name)[:2]
    header, n = _split(weights)
    start = 8 + n
    meta_at = weights.index(b"__metadata__")
    table_at = weights.index(b"data_offsets")
    out: dict[str, Callable[[], tuple[bytes, str | None]]] = {}

    for argument, value in _config(name)["arguments"].items():

        def json_edit(argument=argument, value=value):
            config = _config(name)
            config["arguments"][argument] = _other_value(value)
            return weights, json.dumps(config, indent=1)

        out[f"json-edit/{argument}"] = json_edit

        def wrong_type(argument=argument, value=value):  # a value of another JSON kind, digests recomputed
            config = _config(name)
            config["arguments"][argument] = 1.5 if isinstance(value, str) else ("x" if value is not True else 1.5)
            return _resigned(config, _tensors(name))

        out[f"resigned-wrong-type/{argument}"] = wrong_type
        if _is_size(value):

            def huge(argument=argument, value=value):
                config = _config(name)
                config["arguments"][argument] = [10**9] * len(value) if isinstance(value, list) else 10**9
                return _resigned(config, _tensors(name))

            out[f"resigned-huge/{argument}"] = huge

            def large(argument=argument, value=value):  # the most the size bound lets through: the build budget
                config = _config(name)
                stored = max(sum(v.numel() for v in _tensors(name).values()), 4096)  # the size bound of load_model
                config["arguments"][argument] = [stored] * len(value) if isinstance(value, list) else stored
                return _resigned(config, _tensors(name))

            out[f"resigned-large/{argument}"] = large
    out["flipped/header-length"] = lambda: (_flip(weights, 1), text)
    out["flipped/tensor-table"] = lambda: (_flip(weights, table_at + 3), text)
    out["flipped/stored-config"] = lambda: (_flip(weights, meta_at + 200), text)
    out["flipped/model-json"] = lambda: (weights, text[:40] + chr(ord(text[40]) ^ 4) + text[41:])
    for tensor, entry in header.items():
        if tensor != "__metadata__" and entry["data_offsets"][1] > entry["data_offsets"][0]:
            at = start + entry["data_offsets"][0]
            out[f"flipped/tensor/{tensor}"] = lambda at=at: (_flip(weights, at), text)
    out["truncated/empty"] = lambda: (b"", text)
    out["truncated/in-length"] = lambda: (weights[:5], text)
    out["truncated/in-header"] = lambda: (weights[: 8 + n // 2], text)
    out["truncated/in-data"] = lambda: (weights[: start + (len(weights) - start) // 2], text)
    out["truncated/last-byte"] = lambda: (weights[:-1], text)
    out["padded"] = lambda: (weights + b"\0" * 16, text)
    out["header-size-huge"] = lambda: ((2**62).to_bytes(8, "little") + weights[8:], text)
    out["header-size-past-end"] = lambda: (len(weights).to_bytes(8, "little") + weights[8:], text)
    for dtype in (torch.float16, torch.int64, torch.bool, torch.float64):

        def swapped(dtype=dtype):
            tensors = _tensors(name)
            # the first floating tensor of another dtype: re-storing one in its own dtype would change nothing
            # (a DependentFlow's float64 base under a float32 flow)
            first = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() and v.dtype != dtype)
            tensors[first] = tensors[first].to(dtype)
            return _resigned(_config(name), tensors)

        out[f"dtype/{str(dtype).removeprefix('torch.')}"] = swapped
    out["other-configuration"] = lambda: _resigned(_config(name), _wider(name))
    out["missing-weights"] = lambda: (b"", text)
    return out


def _wider(name: str) -> dict[str, torch.Tensor]:
    from flows.model_file import _tensors as state

    arguments = _config(name)["arguments"]
    if "flows.model" in (arguments.get("flow") or {}):  # the hidden widths of the flow inside
        arguments = arguments["flow"]["flows.model"]["arguments"]
    hidden = [2 * h for h in arguments["hidden"]]
    return state(_model(name, hidden=tuple(hidden)))[0]


def _write(name: str, attack: str, weights: bytes, text: str | None) -> Path:
    root = workspace() / FAMILY / name / attack.replace("/", "_")
    root.mkdir(parents=True, exist_ok=True)
    if attack != "missing-weights":
        (root / "model.safetensors").write_bytes(weights)
    if text is not None:
        (root / "model.json").write_text(text)
    return root


def _file_attack(name: str, attack: str) -> Result:
    weights, text = _files(name)[attack]()
    root = _write(name, attack, weights, text)
    from flows import load_model

    x, reference = _original(name)[2:]

    def check(model) -> str | None:  # a load is right only when it is the saved density
        with torch.no_grad():
            lp = _density(model, x.to(next(model.parameters()).dtype))
        same = lp.dtype == reference.dtype and torch.allclose(lp, reference, rtol=1e-6, atol=1e-6)
        return None if same else f"loaded a {attack} file as another density"

    if attack.startswith("resigned-"):  # an edit the digests agree with: refused, or the saved density
        return expect_right_or_clear(lambda: load_model(root), check, names=(str(root),))
    return expect_clear(lambda: load_model(root), names=(str(root),), accepted=f"loaded a {attack} file")


def _round_trip(name: str, dtype: torch.dtype) -> Result:
    from flows import load_model, save_model

    model = _model(name).to(dtype)
    root = workspace() / FAMILY / name / f"round-trip-{dtype}"
    save_model(model, root)
    x = _x(model).to(dtype)

    def check(loaded) -> str | None:
        kinds = {t.dtype for t in loaded.state_dict().values() if t.is_floating_point()}
        if kinds != {dtype}:
            return f"a {dtype} model came back with {sorted(map(str, kinds))} tensors"
        with torch.no_grad():
            same = torch.equal(_density(loaded, x), _density(model, x))
        return None if same else "the reloaded model gives another log_prob"

    return expect_right_or_clear(lambda: load_model(root), check)


def _map_location(name: str, where) -> Result:
    from flows import load_model

    _original(name)
    root = workspace() / FAMILY / name / "original"
    return expect_clear(lambda: load_model(root, map_location=where), accepted=f"loaded to {where!r}")


def attacks() -> list[Attack]:
    """The model-file part of the table: every attack for every builder the library registers."""
    out = []
    for name in _names():
        out.append(Attack(f"{FAMILY}/{name}/round-trip", FAMILY, functools.partial(_round_trip, name, torch.float32)))
        out.append(
            Attack(f"{FAMILY}/{name}/float64-round-trip", FAMILY, functools.partial(_round_trip, name, torch.float64))
        )
        for attack in _files(name):  # saves one tiny model per builder (cached)
            out.append(Attack(f"{FAMILY}/{name}/{attack}", FAMILY, functools.partial(_file_attack, name, attack)))
        for label, where in (
            ("unknown", "no-such-device"),
            ("absent-cuda", "cuda:99"),
            ("meta", "meta"),
            ("float", 3.5),
        ):
            out.append(
                Attack(f"{FAMILY}/{name}/map-location/{label}", FAMILY, functools.partial(_map_location, name, where))
            )
    return out
