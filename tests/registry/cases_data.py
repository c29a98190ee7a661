"""Registry cases for the data-side transforms: the fixed standardisation."""

from __future__ import annotations

import torch

import flows
from tests.registry import Case

CASES = [
    Case(
        "standardize",
        lambda: flows.Standardize(3, loc=torch.tensor([1.0, -2.0, 0.5]), scale=torch.tensor([0.5, 3.0, 1.5])),
        (3,),
    ),
    Case(
        "standardize-image",
        lambda: flows.Standardize((2, 2, 2), loc=0.3, scale=torch.linspace(0.2, 2.0, 8).reshape(2, 2, 2)),
        (2, 2, 2),
        tags=("image",),
    ),
]
