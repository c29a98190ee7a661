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
    # train_iter=5000, max_iter=5000: after the suite perturbs the weights, the power iteration of the convolution
    # operator needs ~30 steps from its warm start; converged in one call, every call the checks
    # compare sees the same normalised weights (in training the weights move a little per step).
    Case(
        "conv-residual-block",
        _seeded(lambda: flows.ConvResidualBlock((1, 4, 4), hidden=(4,), train_iter=5000, max_iter=5000)),
        (1, 4, 4),
    ),
    Case(
        "conv-residual-block-exact",
        _seeded(
            lambda: flows.ConvResidualBlock(
                (2, 2, 4), hidden=(3, 3), kernel_sizes=(3, 1, 3), log_det="exact", train_iter=5000, max_iter=5000
            )
        ),
        (2, 2, 4),
    ),
]
