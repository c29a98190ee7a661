"""Registry cases for continuous-time flows: exact-trace CNFs at tight solver tolerances.

The exact-trace CNF's ``ladj`` is the integrated trace, equal to the log-determinant of the
solution map up to the solver tolerance; with rtol = atol = 1e-8 (float64) the generic suite's
checks hold at 1e-5 (the errors seen are below 3e-7). The Hutchinson variant is an estimator,
not a bijection log-determinant: ``tests/test_continuous.py`` checks it by its own oracles.
"""

from __future__ import annotations

from torch import Tensor, nn

import flows
from tests.registry import Case

TIGHT = {"rtol": 1e-8, "atol": 1e-8}


class AutogradField(nn.Module):
    """A field without a ``jvp`` method: the CNF takes its traces by reverse-mode autograd."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features + 1, 8), nn.Tanh(), nn.Linear(8, features))

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.net(nn.functional.pad(z, (0, 1), value=float(t)))


CASES = [
    Case("cnf", lambda: flows.CNF(3, hidden=(8,), **TIGHT), (3,), perturb=0.3, atol=1e-5),
    Case("cnf-context", lambda: flows.CNF(2, 3, hidden=(8, 8), **TIGHT), (2,), context=3, perturb=0.3, atol=1e-5),
    Case(
        "cnf-autograd-field",
        lambda: flows.CNF(3, field=AutogradField(3), **TIGHT),
        (3,),
        perturb=0.3,
        atol=1e-5,
    ),
    Case(
        "cnf-reversed-interval",
        lambda: flows.CNF(2, hidden=(8,), t0=0.5, t1=-0.5, activation=nn.Tanh, **TIGHT),
        (2,),
        perturb=0.3,
        atol=1e-5,
    ),
]
