"""Registry cases for the planar, radial and Sylvester flows (inverses through the numerical inverse)."""

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
    Case("planar", _seeded(lambda: flows.Planar(3)), (3,), perturb=0.5),
    Case("radial", _seeded(lambda: flows.Radial(4)), (4,), perturb=0.5),
    Case("sylvester", _seeded(lambda: flows.Sylvester(4)), (4,), perturb=0.3),
    Case("sylvester-rank-two", _seeded(lambda: flows.Sylvester(5, rank=2, reflections=3)), (5,), perturb=0.3),
    Case("inverse-planar", _seeded(lambda: flows.Inverse(flows.Planar(3))), (3,), perturb=0.5),
]
