"""Registry cases for NanoFlow-style shared conditioners (every step is still an exact bijection)."""

from __future__ import annotations

import torch

import flows
from tests.registry import Case


def _seeded(fn):
    def make():
        torch.manual_seed(0)
        return fn()

    return make


CASES = [
    Case(
        "realnvp-shared-conditioner",
        _seeded(lambda: flows.RealNVP(4, transforms=3, hidden=(8,), share_conditioner=True, embedding=3).transform),
        (4,),
    ),
    Case(
        "realnvp-shared-conditioner-odd-context",
        _seeded(lambda: flows.RealNVP(5, 2, transforms=3, hidden=(8,), share_conditioner=True).transform),
        (5,),
        context=2,
    ),
    Case(
        "nice-shared-conditioner",
        _seeded(lambda: flows.NICE(4, transforms=2, hidden=(8,), share_conditioner=True).transform),
        (4,),
    ),
]

CASES.append(
    Case(
        "glow-shared-conditioner",
        _seeded(
            lambda: (
                flows.Glow((1, 8, 8), scales=2, steps=2, hidden=(8, 8), share_conditioner=True, embedding=2).transform
            )
        ),
        (1, 8, 8),
        domain="unit",
        warmup=True,
        atol=1e-6,
        tags=("image",),
    )
)
