"""``flows models``: the registered builders that ``flows fit --model`` can build and train."""

from __future__ import annotations

import argparse
import inspect
import sys

__all__ = ["fit_builders", "fit_can_build", "models"]

#: What ``flows fit`` passes to every builder: ``builder(features, context, transforms=..., hidden=...)``.
_FIT_CALL = ((2, 0), {"transforms": 1, "hidden": [8]})


def fit_can_build(builder: type) -> bool:
    """Whether ``flows fit`` can build and train ``builder``.

    ``flows fit`` calls ``builder(features, context, transforms=T, hidden=[...], **options)`` on
    vector data and trains by maximum likelihood, so a builder qualifies when its first two
    parameters are ``features`` and ``context``, its signature takes those arguments
    (:meth:`inspect.Signature.bind`; a builder with ``**options`` takes any keyword) and it does
    not declare ``likelihood_trainable = False``. Glow (an image shape, ``levels`` and
    ``steps``), :class:`~flows.architectures.FreeFormInjectiveFlow` (trained by its own
    objective, ``latent_features`` required), ``DependentFlow`` (a flow and a relationship matrix)
    and ``EquivariantCNF`` (particles) do not.
    """
    if not getattr(builder, "likelihood_trainable", True):
        return False
    args, kwargs = _FIT_CALL
    try:
        # a class's __init__, read directly: Flow defines __new__(*args, **kwargs), which some Python
        # versions (3.11.2) report as the class's signature
        signature = inspect.signature(builder.__init__ if inspect.isclass(builder) else builder)
        signature.bind(*((None, *args) if inspect.isclass(builder) else args), **kwargs)
    except (TypeError, ValueError):
        return False
    names = [name for name in signature.parameters if name != "self"]
    return names[:2] == ["features", "context"]


def fit_builders() -> list[str]:
    """The names of the registered builders ``flows fit`` can build and train, sorted (what ``flows models`` prints).

    Example:
        >>> "RealNVP" in fit_builders(), "Glow" in fit_builders()
        (True, False)
    """
    from flows.architectures.registry import builders

    return [name for name, builder in builders().items() if fit_can_build(builder)]


def models(args: argparse.Namespace) -> int:
    """``flows models``: print the builders ``flows fit --model`` accepts, one a line; returns 0."""
    for name in fit_builders():
        print(name)
    print(
        "(use with: flows fit --model NAME, any case; extra keyword options with --option KEY=VALUE; "
        "every registered builder, flows.architectures.registry.builders(), saves with flows.save_model)",
        file=sys.stderr,
    )
    return 0
