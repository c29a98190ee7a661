r"""Flows on the torus: NCSF, coupling layers of circular rational-quadratic splines.

Every feature is an angle in :math:`[-\pi, \pi)`. Each layer maps half of the angles by a
:class:`~flows.bijections.circular.CircularRationalQuadraticSpline` whose parameters come from a
:class:`~flows.nn.circular.CircularMLP` of :math:`(\cos, \sin)` of the other half, then rotates
every angle by a learned offset (:class:`~flows.bijections.circular.CircularShift`), so the
density is :math:`2\pi`-periodic in every feature; the base is uniform on the torus.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_builder
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.circular import CircularRationalQuadraticSpline, CircularShift, IntervalToLine, MixedSpline
from flows.bijections.coupling import Coupling, alternating_mask
from flows.distributions.circular import TorusNormal, TorusUniform
from flows.flow import Flow
from flows.nn.circular import CircularMLP

__all__ = ["NCSF"]


@register
class NCSF(Flow):
    r"""Neural circular spline flow on the torus :math:`[-\pi, \pi)^D` (coupling conditioners).

    ``transforms`` couplings with alternating even/odd masks, each a circular spline of ``bins``
    bins per transformed angle driven by an MLP of the cosines and sines of the kept angles,
    followed by a learned rotation (initialised to a quarter turn, which moves the splines' fixed
    point :math:`-\pi`). Identity splines at initialisation, so the flow starts uniform. The name
    follows zuko's ``NCSF``; this one uses coupling (not autoregressive) conditioners.

    References:
        Rezende, Papamakarios, Racanière, Albergo, Kanwar, Shanahan, Cranmer (2020), "Normalizing
        Flows on Tori and Spheres", ICML, arXiv:2002.02428. Durkan, Bekasov, Murray, Papamakarios
        (2019), "Neural Spline Flows", NeurIPS, arXiv:1906.04032.

    Args:
        features: number of angles ``D`` (at least 2: couplings need two parts).
        context: context width (0 for an unconditional flow).
        transforms: number of coupling layers.
        hidden: hidden widths of each conditioner MLP.
        bins: number of spline bins ``K``.
        activation: nonlinearity of the conditioners.
        circular: a **mixed-domain** flow: boolean mask ``(D,)`` of the angles. The other entries
            are mapped from their domain ``(lower, upper)`` onto the line by a fixed
            :class:`~flows.bijections.circular.IntervalToLine` (an interval, a half-line, or the
            line), then by interval splines on ``[-bound, bound]`` with identity tails, over a
            standard normal base (uniform on the angles). Internal coordinates of a molecule
            (:class:`~flows.bijections.InternalCoordinates`: ``circular``, ``lower``, ``upper``)
            are the use: torsions on the circle, angles in :math:`(0, \pi)`, bonds positive.
        lower, upper: bounds ``(D,)`` of the non-circular entries (default: none).
        bound: half-width of the interval splines of the non-circular entries.

    Example:
        >>> import math, torch
        >>> flow = NCSF(3, transforms=2, hidden=(8,), bins=4)
        >>> x = flow.sample((5,))
        >>> bool((x.abs() <= math.pi).all()), flow.log_prob(x).shape
        (True, torch.Size([5]))
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        bins: int = 8,
        activation: Callable[[], nn.Module] = nn.ReLU,
        circular: Tensor | Sequence[bool] | None = None,
        lower: Tensor | Sequence[float] | None = None,
        upper: Tensor | Sequence[float] | None = None,
        bound: float = 5.0,
    ) -> None:
        check_builder(
            "NCSF",
            features,
            context,
            transforms=transforms,
            hidden=hidden,
            activation=activation,
            minimum_features=2,
            why="couplings need two parts",
        )
        CircularRationalQuadraticSpline(bins)  # validates bins with a clear message
        mixed = circular is not None
        circ = torch.ones(features, dtype=torch.bool) if circular is None else torch.as_tensor(circular).bool()
        if circ.shape != (features,):
            raise ValueError(f"NCSF: expected circular of shape ({features},), got {tuple(circ.shape)}")
        if not mixed and (lower is not None or upper is not None):
            raise ValueError("NCSF: expected lower/upper only with circular=... (the torus has no bounds), got them")
        layers: list[Bijection] = []
        if mixed:
            lo = torch.full((features,), -math.inf) if lower is None else torch.as_tensor(lower, dtype=torch.float64)
            hi = torch.full((features,), math.inf) if upper is None else torch.as_tensor(upper, dtype=torch.float64)
            layers.append(IntervalToLine(lo, hi, skip=circ))
        for i in range(transforms):
            mask = alternating_mask(features, keep_even=i % 2 == 0)
            kept, transformed = circ[mask], circ[~mask]
            spline = MixedSpline(transformed, bins, bound=bound) if mixed else CircularRationalQuadraticSpline(bins)
            out = len(transformed) * spline.params_per_dim
            conditioner = CircularMLP(kept, out, hidden, context=context, activation=activation)
            layers.append(Coupling(features, context, transformer=spline, mask=mask, conditioner=conditioner))
            if bool(circ.any()):
                layers.append(CircularShift(features, shift=math.pi / 2, circular=circ))
        base = TorusNormal(circ) if mixed else TorusUniform(features)
        super().__init__(Chain(*layers), base, context=context)
