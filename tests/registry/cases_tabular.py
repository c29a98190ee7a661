"""Registry cases for the tabular family: splines, masked autoregressive transforms, BatchNorm."""

from __future__ import annotations

import torch

import flows
from flows.bijections.transformers import AffineTransformer
from tests.registry import Case


def _spline(bins: int = 4, bound: float = 2.5) -> flows.RationalQuadraticSpline:
    return flows.RationalQuadraticSpline(bins, bound=bound)


def _batch_norm() -> flows.BatchNorm:
    """Eval mode (a per-sample bijection) with non-trivial running statistics."""
    t = flows.BatchNorm(3)
    with torch.no_grad():
        t.running_mean.copy_(torch.tensor([0.5, -1.0, 0.2]))
        t.running_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
    return t.eval()


def _ar(features: int, context: int = 0, transformer=None, **kwargs) -> flows.MaskedAutoregressive:
    return flows.MaskedAutoregressive(
        features, context, transformer=transformer or AffineTransformer(), hidden=kwargs.pop("hidden", (8,)), **kwargs
    )


CASES = [
    # Inputs are standard normal, so part of them falls outside [-2.5, 2.5]: the identity tails are checked too.
    Case("spline-elementwise", lambda: flows.Elementwise(3, _spline(bins=2)), (3,), perturb=0.5),
    Case("spline-elementwise-image", lambda: flows.Elementwise((2, 2, 2), _spline(bins=2)), (2, 2, 2), perturb=0.5),
    Case("spline-coupling", lambda: flows.Coupling(4, transformer=_spline(), hidden=(8,)), (4,), perturb=0.5),
    Case(
        "spline-coupling-context",
        lambda: flows.Coupling(5, 2, transformer=_spline(), hidden=(8,)),
        (5,),
        context=2,
        perturb=0.5,
    ),
    Case("autoregressive-affine", lambda: _ar(4), (4,), perturb=0.3),
    Case("autoregressive-affine-context", lambda: _ar(4, 3), (4,), context=3, perturb=0.3),
    Case(
        "autoregressive-affine-order-residual",
        lambda: _ar(5, order=[3, 0, 4, 1, 2], residual=True, hidden=(8, 8)),
        (5,),
        perturb=0.3,
    ),
    Case("autoregressive-one-feature-context", lambda: _ar(1, 2), (1,), context=2, perturb=0.3),
    Case("autoregressive-spline", lambda: _ar(4, transformer=_spline()), (4,), perturb=0.5),
    Case(
        "autoregressive-spline-context-random-degrees",
        lambda: _ar(5, 2, transformer=_spline(bins=3), hidden=(10, 10), hidden_degrees="random"),
        (5,),
        context=2,
        perturb=0.5,
    ),
    Case("inverse-autoregressive-affine", lambda: flows.Inverse(_ar(4, 2)), (4,), context=2, perturb=0.3),
    Case("batch-norm-eval", _batch_norm, (3,), train_eval_parity=False),
    Case(
        "maf-chain-batch-norm",
        lambda: flows.MAF(3, transforms=2, hidden=(8,), batch_norm=True).transform.eval(),
        (3,),
        train_eval_parity=False,
    ),
    Case(
        "nsf-coupling-lu-chain", lambda: flows.NSF(4, transforms=2, hidden=(8,), coupling=True, lu=True).transform, (4,)
    ),
]
