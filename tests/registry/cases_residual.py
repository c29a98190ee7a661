"""Registry cases for the invertible residual blocks (exact log-determinant; fixed-point inverse)."""

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
    Case("residual-block", _seeded(lambda: flows.ResidualBlock(3, hidden=(8,))), (3,)),
    Case("residual-block-deep", _seeded(lambda: flows.ResidualBlock(4, hidden=(8, 8), coefficient=0.9)), (4,)),
    Case("residual-block-context", _seeded(lambda: flows.ResidualBlock(3, 2, hidden=(8,))), (3,), context=2),
]
