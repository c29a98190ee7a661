"""Registry cases for the foundation transforms: elementwise, permutations, couplings, LU, ActNorm, Chain."""

from __future__ import annotations

import torch

import flows
from flows.bijections.transformers import AdditiveTransformer, AffineTransformer
from tests.registry import Case


def _seeded(fn):
    """Build with a fixed seed so that random constructions (permutations) are reproducible."""

    def make():
        torch.manual_seed(0)
        return fn()

    return make


CASES = [
    Case("affine", lambda: flows.Affine(3), (3,)),
    Case("affine-image", lambda: flows.Affine((2, 3, 3)), (2, 3, 3), tags=("image",)),
    Case("elementwise-additive", lambda: flows.Elementwise(4, AdditiveTransformer()), (4,)),
    Case("logit", lambda: flows.Logit(3), (3,), domain="unit"),
    Case("logit-alpha", lambda: flows.Logit((2, 2, 2), alpha=0.05), (2, 2, 2), domain="unit", tags=("image",)),
    Case("sigmoid", lambda: flows.Sigmoid(3), (3,)),
    Case("softclip", lambda: flows.SoftClip(3, bound=2.0), (3,)),
    Case("softclip-onto", lambda: flows.SoftClip(3, bound=0.5, slope=0.05), (3,)),
    Case("softclip-knee", lambda: flows.SoftClip(3, bound=1.0, slope=0.05, knee=0.3), (3,)),
    Case("reverse", lambda: flows.Reverse(5), (5,)),
    Case("reverse-channels", lambda: flows.Reverse((3, 2, 2)), (3, 2, 2), tags=("image",)),
    Case("permutation", _seeded(lambda: flows.Permutation(6)), (6,)),
    Case("permutation-image-dim1", _seeded(lambda: flows.Permutation((2, 3, 2), dim=1)), (2, 3, 2), tags=("image",)),
    Case("affine-coupling", lambda: flows.AffineCoupling(4, hidden=(8,)), (4,)),
    Case("affine-coupling-odd", lambda: flows.AffineCoupling(5, hidden=(8, 8)), (5,)),
    Case(
        "affine-coupling-last",
        lambda: flows.AffineCoupling(5, mask=flows.bijections.half_mask(5, keep_first=False), hidden=(8,)),
        (5,),
    ),
    Case(
        "affine-coupling-even",
        lambda: flows.AffineCoupling(6, mask=flows.bijections.alternating_mask(6), hidden=(8,)),
        (6,),
    ),
    Case(
        "affine-coupling-odd-mask",
        lambda: flows.AffineCoupling(6, mask=flows.bijections.alternating_mask(6, keep_even=False), hidden=(8,)),
        (6,),
    ),
    Case(
        "affine-coupling-gather",
        lambda: flows.AffineCoupling(5, mask=[True, False, False, True, False], hidden=(8,)),
        (5,),
    ),
    Case("affine-coupling-context", lambda: flows.AffineCoupling(4, 3, hidden=(8,)), (4,), context=3),
    Case("affine-coupling-noclamp", lambda: flows.AffineCoupling(4, clamp=None, hidden=(8,)), (4,)),
    Case("additive-coupling", lambda: flows.AdditiveCoupling(4, hidden=(8,)), (4,)),
    Case("additive-coupling-context", lambda: flows.AdditiveCoupling(5, 2, hidden=(8,)), (5,), context=2),
    Case("coupling-generic", lambda: flows.Coupling(4, transformer=AffineTransformer(clamp=1.0), hidden=(8,)), (4,)),
    Case("lu-linear", lambda: flows.LULinear(4), (4,)),
    Case("lu-linear-orthogonal", _seeded(lambda: flows.LULinear(5, init="orthogonal", bias=False)), (5,)),
    Case("actnorm", lambda: flows.ActNorm(3), (3,), warmup=True),
    Case("actnorm2d", lambda: flows.ActNorm2d(2), (2, 3, 3), warmup=True, tags=("image",)),
    Case("inverse-affine-coupling", lambda: flows.Inverse(flows.AffineCoupling(4, hidden=(8,))), (4,)),
    Case(
        "chain",
        _seeded(lambda: flows.Chain(flows.AffineCoupling(4, hidden=(8,)), flows.Permutation(4), flows.LULinear(4))),
        (4,),
    ),
]
