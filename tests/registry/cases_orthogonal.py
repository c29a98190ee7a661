"""Registry cases for the orthogonal layers: Householder products and QR/SVD-factored linear maps."""

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
    Case("householder", _seeded(lambda: flows.Householder(4)), (4,)),
    Case("householder-two-reflections", _seeded(lambda: flows.Householder(5, 2)), (5,)),
    Case("qr-linear", _seeded(lambda: flows.QRLinear(4)), (4,), perturb=0.3),
    Case("qr-linear-nobias", _seeded(lambda: flows.QRLinear(3, reflections=1, bias=False)), (3,), perturb=0.3),
    Case("svd-linear", _seeded(lambda: flows.SVDLinear(4)), (4,), perturb=0.3),
    Case("svd-linear-one-reflection", _seeded(lambda: flows.SVDLinear(3, reflections=1)), (3,), perturb=0.3),
]
