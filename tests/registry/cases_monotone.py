"""Registry cases for the neural and polynomial monotone transformers (numerical inverses), in every conditioner."""

from __future__ import annotations

import torch

import flows
from flows.bijections.monotone import (
    BernsteinTransformer,
    DeepSigmoidTransformer,
    SOSPolynomialTransformer,
    UMNNTransformer,
)
from tests.registry import Case


def _seeded(fn):
    def make():
        torch.manual_seed(0)
        return fn()

    return make


CASES = [
    Case("elementwise-deep-sigmoid", lambda: flows.Elementwise(3, DeepSigmoidTransformer(4)), (3,), perturb=0.5),
    Case(
        "elementwise-deep-sigmoid-two-layers",
        lambda: flows.Elementwise(3, DeepSigmoidTransformer(3, layers=2)),
        (3,),
        perturb=0.5,
    ),
    Case(
        "autoregressive-deep-sigmoid",
        _seeded(lambda: flows.MaskedAutoregressive(3, transformer=DeepSigmoidTransformer(3), hidden=(8,))),
        (3,),
        perturb=0.3,
    ),
    Case(
        "coupling-umnn",
        _seeded(lambda: flows.Coupling(4, transformer=UMNNTransformer(2, (8,), nodes=16), hidden=(8,))),
        (4,),
        perturb=0.3,
    ),
    Case(
        "autoregressive-umnn-context",
        _seeded(lambda: flows.MaskedAutoregressive(3, 2, transformer=UMNNTransformer(2, (8,), nodes=16), hidden=(8,))),
        (3,),
        context=2,
        perturb=0.3,
    ),
    Case("elementwise-sos", lambda: flows.Elementwise(3, SOSPolynomialTransformer(2, 2)), (3,), perturb=0.3),
    Case(
        "elementwise-sos-bounded",
        lambda: flows.Elementwise(3, SOSPolynomialTransformer(3, 2, bound=1.5)),
        (3,),
        perturb=0.3,
    ),
    Case(
        "coupling-sos-context",
        _seeded(lambda: flows.Coupling(4, 3, transformer=SOSPolynomialTransformer(1, 2), hidden=(8,))),
        (4,),
        context=3,
        perturb=0.2,
    ),
    Case("elementwise-bernstein", lambda: flows.Elementwise(3, BernsteinTransformer(5, bound=2.0)), (3,), perturb=0.5),
    Case(
        "autoregressive-bernstein",
        _seeded(lambda: flows.MaskedAutoregressive(3, transformer=BernsteinTransformer(4, bound=3.0), hidden=(8,))),
        (3,),
        perturb=0.3,
    ),
]

CASES += [
    Case("block-autoregressive", _seeded(lambda: flows.BlockAutoregressive(3, hidden=(4,))), (3,), perturb=0.3),
    Case(
        "block-autoregressive-deep-context",
        _seeded(lambda: flows.BlockAutoregressive(3, 2, hidden=(3, 3))),
        (3,),
        context=2,
        perturb=0.3,
    ),
]
