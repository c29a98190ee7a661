"""Registry cases for transforms wrapped from ``torch.distributions``: :class:`flows.TorchTransform`."""

from __future__ import annotations

import torch
from torch.distributions import transforms as T

import flows
from tests.registry import Case


def _affine_tanh() -> flows.TorchTransform:
    # atanh(a + b x) on inputs where |a + b x| < 1: a bijection R-interval -> R with a non-constant log-det.
    inner = T.ComposeTransform(
        [T.AffineTransform(torch.tensor([0.1, -0.2, 0.0]), torch.tensor([0.2, 0.1, 0.15])), T.TanhTransform().inv]
    )
    return flows.TorchTransform(inner, 3)


CASES = [
    Case("torch-transform-affine-tanh", _affine_tanh, (3,)),
    Case(
        "torch-transform-sigmoid-image",
        lambda: flows.TorchTransform(T.SigmoidTransform(), (2, 2, 2)),
        (2, 2, 2),
        tags=("image",),
    ),
    Case(
        "torch-transform-log",
        lambda: flows.TorchTransform(T.ExpTransform().inv, 4),
        (4,),
        sample=lambda shape, gen: torch.rand(shape, generator=gen, dtype=torch.float64) + 0.1,
    ),
]
