"""Registry cases for the Boltzmann family: SharedBlocks (the stochastic blocks are exempt, see test_registry)."""

from __future__ import annotations

import flows
from flows.bijections import AffineCoupling, SharedBlocks
from tests.registry import Case

CASES = [
    Case("SharedBlocks-coupling", lambda: SharedBlocks(AffineCoupling(2, hidden=(8,)), blocks=3), (6,)),
    Case(
        "SharedBlocks-context",
        lambda: SharedBlocks(AffineCoupling(3, context=2, hidden=(8,)), blocks=2),
        (6,),
        context=2,
    ),
    Case("SharedBlocks-chain", lambda: SharedBlocks(flows.Chain(flows.Affine(2), flows.Reverse(2)), blocks=4), (8,)),
]
