"""Registry cases for the circulant–diagonal layers (CDFlow): vector and channel forms, both parameterisations."""

from __future__ import annotations

import torch

import flows
from tests.registry import Case


def _seeded(fn):
    """Build with a fixed seed so that random (orthogonal) initialisations are reproducible."""

    def make():
        torch.manual_seed(0)
        return fn()

    return make


CASES = [
    Case("circulant-diagonal", lambda: flows.CirculantDiagonal(5), (5,)),
    Case("circulant-diagonal-even-m3", lambda: flows.CirculantDiagonal(6, factors=3), (6,)),
    Case(
        "circulant-diagonal-orthogonal-m4",
        _seeded(lambda: flows.CirculantDiagonal(8, factors=4, init="orthogonal", bias=False)),
        (8,),
    ),
    Case("circulant-diagonal-spectrum-odd", lambda: flows.CirculantDiagonal(7, parameterization="spectrum"), (7,)),
    Case(
        "circulant-diagonal-spectrum-even-m3",
        _seeded(lambda: flows.CirculantDiagonal(8, factors=3, parameterization="spectrum", init="orthogonal")),
        (8,),
    ),
    Case("circulant-diagonal-cached", lambda: flows.CirculantDiagonal(6, factors=3, cache=True), (6,)),
    Case("circulant-diagonal-dense", lambda: flows.CirculantDiagonal(5, factors=3, method="dense"), (5,)),
    Case(
        "circulant-diagonal-dense-spectrum-cached",
        lambda: flows.CirculantDiagonal(6, parameterization="spectrum", method="dense", cache=True),
        (6,),
    ),
    Case("circulant-diagonal2d", lambda: flows.CirculantDiagonal2d(5), (5, 2, 3), tags=("image",)),
    Case(
        "circulant-diagonal2d-even-m3-orthogonal",
        _seeded(lambda: flows.CirculantDiagonal2d(4, factors=3, init="orthogonal", cache=True)),
        (4, 3, 2),
        tags=("image",),
    ),
    Case(
        "circulant-diagonal2d-dense",
        _seeded(lambda: flows.CirculantDiagonal2d(3, factors=3, init="orthogonal", method="dense")),
        (3, 2, 3),
        tags=("image",),
    ),
    Case(
        "circulant-diagonal2d-spectrum",
        lambda: flows.CirculantDiagonal2d(6, parameterization="spectrum", bias=False),
        (6, 2, 2),
        tags=("image",),
    ),
]
