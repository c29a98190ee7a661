"""Registry cases for particle flows: a CNF with an EGNN field, checked on mean-free inputs.

The field is translation invariant and mean free, so the solution map is the identity along
translations and its full Jacobian's log-determinant equals the one on the zero-centre-of-mass
subspace: the generic check (full ``slogdet``) therefore checks the subspace log-determinant.
``tests/test_particles.py`` checks it again in an orthonormal basis of the subspace.
"""

from __future__ import annotations

import torch

import flows
from flows.particles import EGNN, remove_mean
from tests.registry import Case

TIGHT = {"rtol": 1e-8, "atol": 1e-8}


def _mean_free(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return remove_mean(torch.randn(shape, generator=generator, dtype=torch.float64), 3, 2)


CASES = [
    Case(
        "cnf-egnn",
        lambda: flows.CNF(6, field=EGNN(3, 2, width=8, layers=2), **TIGHT),
        (6,),
        sample=_mean_free,
        perturb=0.1,  # 0.3 makes the random field stiff (the solve needs thousands of steps)
        atol=1e-5,
    ),
]
