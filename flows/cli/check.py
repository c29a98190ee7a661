"""``flows check``: the log-determinant and inverse checks of every layer of a run."""

from __future__ import annotations

import argparse
import math

import torch

from flows.cli._common import _class_index, _cycling_classes, _num_classes
from flows.cli.evaluate import load_run_model

__all__ = ["check"]


def _layers(transform: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    from flows.bijections.base import Chain

    if isinstance(transform, Chain):
        found = []
        for i, member in enumerate(transform):
            found += _layers(member, f"{prefix}{i}.")
        return found
    return [(prefix.rstrip(".") or "0", transform)]


def check(args: argparse.Namespace) -> int:
    """``flows check RUN``: check every layer of a run; 0 when all pass, 1 when one fails."""
    from flows.data.dequantization import uniform_dequantize
    from flows.testing import BijectionCheckError, check_bijection

    model, data = load_run_model(args, "check")
    model = model.double().eval()
    if args.num < 1:
        raise ValueError(f"expected --num >= 1, got {args.num}")
    context = None  # a class-conditional model is checked at the rows' own classes (or the classes in turn)
    if data is not None:
        split = "test" if data.test is not None else "train"
        x = getattr(data, split)[: args.num]
        x = uniform_dequantize(x, data.levels, dtype=torch.float64) if data.levels else x.double()
        labels = data.labels_of(split) if _num_classes(model) else None
        context = _cycling_classes(model, len(x)) if labels is None else _class_index(model, labels[: args.num])
    else:
        context = _cycling_classes(model, args.num)
        with torch.no_grad():
            x = model.sample((args.num,)) if context is None else model.sample(context=context)
    failures = 0
    inputs = x
    print(f"{'layer':>8}  {'transform':<22} {'worst error':>12}  result")
    for name, layer in [*_layers(model.transform), ("all", model.transform)]:
        if name == "all":
            x = inputs
        try:
            report = check_bijection(layer, x, context, atol=args.atol, rtol=args.atol)
            worst, status = max(report.values(), default=0.0), "ok"
        except BijectionCheckError as error:
            worst, status = math.nan, f"FAILED: {error}"
            failures += 1
        print(f"{name:>8}  {type(layer).__name__:<22} {worst:12.2e}  {status}")
        if name != "all":
            with torch.no_grad():
                x = layer(x, context)
    print(
        f"{failures} failure(s)" if failures else "every layer passed (round trips, fused calls, log-det vs autograd)"
    )
    return 1 if failures else 0
