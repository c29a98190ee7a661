"""Model configs: JSON descriptions that rebuild a model, so checkpoints never need to pickle code.

A config names a builder and its arguments, plus optional preprocessing layers placed in front of
the builder's transform (data side first)::

    {"builder": "RealNVP", "features": 64, "context": 0,
     "options": {"transforms": 8, "hidden": [256, 256]},
     "preprocessing": [{"layer": "Logit", "options": {"alpha": 0.05}}]}

Builders are the paper-named :class:`~flows.flow.Flow` subclasses of :mod:`flows.architectures`
(found automatically, so every family's builders work) and anything added with
:func:`register_model`. Preprocessing layers are the exported transforms of :mod:`flows.bijections`
(``Logit``, ``Standardize``, ...), built as ``Layer(event_shape, **options)``; their buffers (e.g.
the standardisation's mean and scale) come back from the saved state dict, not from the config.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

__all__ = ["available_models", "build_model", "fit_can_build", "model_config", "register_model"]

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str, builder: Callable[..., nn.Module] | None = None):
    """Register ``builder(features, context, **options) -> model`` under ``name`` (usable as a decorator).

    Example:
        >>> from flows import RealNVP
        >>> @register_model("tiny-realnvp")
        ... def tiny(features, context=0, **options):
        ...     return RealNVP(features, context, transforms=2, hidden=(8,))
        >>> type(build_model(model_config("tiny-realnvp", 3))).__name__
        'RealNVP'
    """

    def add(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if not callable(fn):
            raise TypeError(f"register_model: expected a callable builder, got {type(fn).__name__}")
        _REGISTRY[name] = fn
        return fn

    return add if builder is None else add(builder)


def _architectures() -> dict[str, Callable[..., nn.Module]]:
    import flows.architectures as architectures
    from flows.flow import Flow

    found = {}
    for name in getattr(architectures, "__all__", ()):
        obj = getattr(architectures, name, None)
        if inspect.isclass(obj) and issubclass(obj, Flow):
            found[name] = obj
    return found


def _builders() -> dict[str, Callable[..., nn.Module]]:
    return {**_architectures(), **_REGISTRY}


#: What ``flows fit`` passes to every builder: ``builder(features, context, transforms=..., hidden=...)``.
_FIT_CALL = ((2, 0), {"transforms": 1, "hidden": [8]})


def fit_can_build(builder: Callable[..., nn.Module]) -> bool:
    """Whether ``flows fit`` can build and train ``builder``.

    ``flows fit`` calls ``builder(features, context, transforms=T, hidden=[...], **options)`` on
    vector data and trains by maximum likelihood, so a builder qualifies when its signature takes
    those arguments (:meth:`inspect.Signature.bind`; a builder with ``**options`` takes anything)
    and it does not declare ``likelihood_trainable = False``. Glow (an image shape, ``levels`` and
    ``steps``) and :class:`~flows.architectures.FreeFormInjectiveFlow` (trained by its own
    objective, ``latent_features`` required) do not.
    """
    if not getattr(builder, "likelihood_trainable", True):
        return False
    args, kwargs = _FIT_CALL
    try:
        inspect.signature(builder).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True


def available_models(*, fit: bool = True) -> list[str]:
    """Builder names, sorted: the paper-named architectures and registered builders.

    Args:
        fit: only the builders ``flows fit`` can build and train (:func:`fit_can_build`), the list
            ``flows models`` prints; ``False``: every name a config may use (Glow too).

    Example:
        >>> "RealNVP" in available_models(), "Glow" in available_models(), "Glow" in available_models(fit=False)
        (True, False, True)
    """
    return sorted(name for name, builder in _builders().items() if not fit or fit_can_build(builder))


def _layers() -> dict[str, type]:
    import flows.bijections as bijections
    from flows.bijections.base import Bijection

    return {
        name: getattr(bijections, name)
        for name in bijections.__all__
        if inspect.isclass(getattr(bijections, name)) and issubclass(getattr(bijections, name), Bijection)
    }


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"model config: expected JSON values (numbers, strings, lists, dicts) in {where}, got {value!r}; "
            "register a builder with register_model() for options that are not plain values"
        ) from error


def model_config(
    builder: str,
    features: int | Sequence[int],
    context: int = 0,
    *,
    preprocessing: Sequence[tuple[str, dict[str, Any]] | str] = (),
    **options: Any,
) -> dict[str, Any]:
    """Make (and validate) a config for :func:`build_model`.

    Args:
        builder: a name from ``available_models(fit=False)``.
        features: data dimension (or event shape) passed as the builder's first argument.
        context: context width.
        preprocessing: layer names or ``(name, options)`` pairs placed before the builder's transform.
        **options: keyword options of the builder (JSON values only).

    Raises:
        ValueError: for an unknown builder or layer name.
        TypeError: for options that are not JSON values.
    """
    names = available_models(fit=False)
    if builder not in names:
        raise ValueError(f"model config: unknown builder {builder!r}; expected one of {names}")
    layers = _layers()
    pre = []
    for item in preprocessing:
        name, opts = (item, {}) if isinstance(item, str) else item
        if name not in layers:
            raise ValueError(f"model config: unknown preprocessing layer {name!r}; expected one of {sorted(layers)}")
        pre.append({"layer": name, "options": dict(opts)})
    config = {
        "builder": builder,
        "features": list(features) if isinstance(features, (list, tuple)) else features,
        "context": context,
        "options": dict(options),
        "preprocessing": pre,
    }
    _check_json(config, "the config")
    return config


def build_model(config: dict[str, Any]) -> nn.Module:
    """Build the model a config describes (freshly initialised; load weights afterwards).

    Raises:
        ValueError: for a malformed config or unknown names.
    """
    if not isinstance(config, dict) or "builder" not in config or "features" not in config:
        raise ValueError(f"model config: expected a dict with 'builder' and 'features', got {config!r}")
    name = config["builder"]
    builders = _builders()
    if name not in builders:
        raise ValueError(
            f"model config: unknown builder {name!r}; expected one of {sorted(builders)} "
            "(a custom builder must be registered with flows.train.register_model before loading)"
        )
    features = config["features"]
    features = tuple(features) if isinstance(features, list) else features
    context = int(config.get("context", 0))
    model = builders[name](features, context, **config.get("options", {}))
    pre = config.get("preprocessing") or []
    if not pre:
        return model
    from flows.flow import Flow

    layers = _layers()
    if not isinstance(model, Flow):
        raise ValueError(f"model config: preprocessing needs a Flow builder, {name!r} built {type(model).__name__}")
    front = []
    for item in pre:
        if item.get("layer") not in layers:
            raise ValueError(f"model config: unknown preprocessing layer {item.get('layer')!r}")
        front.append(layers[item["layer"]](model.event_shape, **item.get("options", {})))
    # In place, so the model keeps its own class and methods (FFJORD.nfe, Glow's temperature).
    return model.prepend(*front, options=[item.get("options", {}) for item in pre])
