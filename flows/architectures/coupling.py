"""Coupling-flow builders: RealNVP and NICE.

Options are keyword-only (``transforms``, ``hidden``, ...). Every builder returns a
:class:`~flows.flow.Flow` (it *is* one), with a standard normal base unless stated otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from flows.bijections.base import Chain
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling, alternating_mask
from flows.bijections.elementwise import Affine
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["NICE", "RealNVP"]


def _check_builder_args(name: str, features: int, transforms: int) -> None:
    if not isinstance(features, int) or features < 2:
        raise ValueError(f"{name}: expected features to be an int >= 2 (couplings need two parts), got {features!r}")
    if transforms < 1:
        raise ValueError(f"{name}: expected transforms >= 1, got {transforms}")


class RealNVP(Flow):
    r"""RealNVP for vectors: affine couplings with alternating even/odd masks.

    Coupling ``i`` keeps the even-indexed features when ``i`` is even and the odd-indexed ones
    otherwise, and maps the rest by :math:`x \mapsto x e^{s} + t` with
    :math:`(t, s)` from an MLP of the kept part (and the context). Identity at initialisation.

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803.

    Args:
        features: data dimension ``D`` (at least 2).
        context: context width (0 for an unconditional flow).
        transforms: number of coupling layers.
        hidden: hidden widths of each conditioner MLP.
        clamp: bound on each layer's absolute log-scale.
        activation: nonlinearity of the conditioners.

    Example:
        >>> import torch
        >>> flow = RealNVP(3, transforms=2, hidden=(16,))
        >>> flow.log_prob(torch.randn(4, 3)).shape
        torch.Size([4])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        clamp: float | None = 3.0,
        activation: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        _check_builder_args("RealNVP", features, transforms)
        layers = [
            AffineCoupling(
                features,
                context,
                mask=alternating_mask(features, keep_even=i % 2 == 0),
                clamp=clamp,
                hidden=hidden,
                activation=activation,
            )
            for i in range(transforms)
        ]
        super().__init__(Chain(*layers), StandardNormal(features), context=context)


class NICE(Flow):
    r"""NICE: additive (volume-preserving) couplings with alternating masks, then a diagonal scaling.

    :math:`\log|\det J| = \sum_i s_i` comes from the final elementwise scaling only.
    The original paper uses a logistic prior; this builder uses a standard normal base.

    References:
        Dinh, Krueger, Bengio (2015), "NICE: Non-linear Independent Components Estimation",
        arXiv:1410.8516.

    Args:
        features: data dimension ``D`` (at least 2).
        context: context width (0 for an unconditional flow).
        transforms: number of additive coupling layers.
        hidden: hidden widths of each conditioner MLP.
        activation: nonlinearity of the conditioners.

    Example:
        >>> import torch
        >>> NICE(4, transforms=2, hidden=(8,)).sample((3,)).shape
        torch.Size([3, 4])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        _check_builder_args("NICE", features, transforms)
        layers = [
            AdditiveCoupling(
                features,
                context,
                mask=alternating_mask(features, keep_even=i % 2 == 0),
                hidden=hidden,
                activation=activation,
            )
            for i in range(transforms)
        ]
        super().__init__(Chain(*layers, Affine(features)), StandardNormal(features), context=context)
