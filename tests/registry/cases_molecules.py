"""Registry cases for molecular transforms: internal coordinates (with the frame kept, a square bijection).

Inputs are perturbed copies of a small bent molecule under random rotations and translations, so
bonds, angles and the Euler angle β stay away from their singular values (0 and π).
"""

from __future__ import annotations

import math

import torch

import flows
from tests.registry import Case

# five atoms: a zig-zag chain with a branch (nm-like units)
_GEOMETRY = torch.tensor(
    [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.4, 0.9, 0.0], [2.4, 1.0, 0.3], [0.7, 1.1, 0.8]], dtype=torch.float64
)
_Z_MATRIX = [(1,), (0, 1), (2, 1, 0), (3, 2, 1, 0), (4, 1, 2, 3)]


def _molecules(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    batch = shape[:-1]
    pos = _GEOMETRY + 0.1 * torch.randn((*batch, 5, 3), generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(torch.randn((*batch, 3, 3), generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]
    shift = torch.randn((*batch, 1, 3), generator=generator, dtype=torch.float64)
    return (pos @ q.transpose(-1, -2) + shift).flatten(-2)


def _standardized() -> flows.InternalCoordinates:
    reference = _molecules((64, 15), torch.Generator().manual_seed(1))
    return flows.InternalCoordinates(_Z_MATRIX, keep_frame=True, reference=reference, chirality={4: 1})


CASES = [
    Case(
        "internal-coordinates", lambda: flows.InternalCoordinates(_Z_MATRIX, keep_frame=True), (15,), sample=_molecules
    ),
    Case("internal-coordinates-standardized", _standardized, (15,), sample=_molecules),
]


def _angles(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Angles uniform on [-π, π) (kept 1e-3 away from the cut so the round trip does not wrap)."""
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * (math.pi - 1e-3)


def _circular_coupling(features: int = 4, bins: int = 4) -> flows.Coupling:
    from flows.nn.circular import CircularMLP

    mask = flows.alternating_mask(features)
    spline = flows.CircularRationalQuadraticSpline(bins)
    n_kept = int(mask.sum())
    conditioner = CircularMLP(torch.ones(n_kept, dtype=torch.bool), (features - n_kept) * spline.params_per_dim, (8,))
    return flows.Coupling(features, transformer=spline, mask=mask, conditioner=conditioner)


CASES += [
    Case("circular-spline-coupling", _circular_coupling, (4,), sample=_angles, perturb=0.5),
    Case(
        "circular-spline-autoregressive",
        lambda: flows.MaskedAutoregressive(3, transformer=flows.CircularRationalQuadraticSpline(5), hidden=(8,)),
        (3,),
        sample=_angles,
        perturb=0.5,
    ),
    Case("circular-shift", lambda: flows.CircularShift(3, shift=0.0), (3,), sample=_angles, perturb=0.5),
    Case(
        "circular-reflection",
        lambda: flows.CircularReflection(3, torch.tensor([0.3, -1.0, 2.0]), circular=torch.tensor([1, 1, 0])),
        (3,),
        sample=_angles,
    ),
]

_LOWER = torch.tensor([0.0, -1.0, -math.inf, -math.inf])
_UPPER = torch.tensor([math.pi, math.inf, 2.0, math.inf])


def _in_box(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return torch.stack([0.1 + 2.9 * u[..., 0], -0.9 + 3 * u[..., 1], 1.9 - 3 * u[..., 2], 4 * u[..., 3] - 2], -1)


def _mixed_coupling() -> flows.Coupling:
    from flows.nn.circular import CircularMLP

    circular = torch.tensor([True, False, True, False, False])
    mask = flows.alternating_mask(5)
    spline = flows.MixedSpline(circular[~mask], 4, bound=3.0)
    conditioner = CircularMLP(circular[mask], int((~mask).sum()) * spline.params_per_dim, (8,))
    return flows.Coupling(5, transformer=spline, mask=mask, conditioner=conditioner)


CASES += [
    Case("interval-to-line", lambda: flows.IntervalToLine(_LOWER, _UPPER), (4,), sample=_in_box),
    Case(
        "interval-to-line-skip",
        lambda: flows.IntervalToLine(_LOWER, _UPPER, skip=torch.tensor([0, 0, 1, 1])),
        (4,),
        sample=_in_box,
    ),
    Case("mixed-spline-coupling", _mixed_coupling, (5,), sample=_angles, perturb=0.5),
    Case(
        "circular-shift-masked",
        lambda: flows.CircularShift(3, 1.0, circular=torch.tensor([1, 0, 1])),
        (3,),
        sample=_angles,
    ),
]
