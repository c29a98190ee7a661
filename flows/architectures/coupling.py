"""Coupling-flow builders: RealNVP and NICE.

Options are keyword-only (``transforms``, ``hidden``, ...). Every builder returns a
:class:`~flows.flow.Flow` (it *is* one), with a standard normal base unless stated otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_builder
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling
from flows.bijections.elementwise import Affine
from flows.bijections.permutation import Permutation
from flows.bijections.standardize import Standardize
from flows.distributions import StandardNormal
from flows.flow import Flow
from flows.nn import MLP
from flows.nn.sharing import StepConditioner

__all__ = ["NICE", "RealNVP"]


def _alternating(features: int, layers: list[Bijection]) -> Chain:
    """Couplings on alternating even/odd entries, run as couplings on contiguous halves.

    A coupling whose mask keeps the even entries equals, after the fixed permutation that puts
    the even entries first, a coupling that keeps the first half. Sandwiching half-mask couplings
    between that permutation and its inverse gives exactly the alternating-mask model while every
    split is a cheap contiguous view (no strided copies in the conditioners' matmuls).
    """
    order = torch.cat((torch.arange(0, features, 2), torch.arange(1, features, 2)))
    evens_first = Permutation(features, order)
    return Chain(evens_first, *layers, evens_first.inv)


def _evens_first_mask(features: int) -> Tensor:
    """After the even-first permutation, the even entries are the first ``ceil(D / 2)``."""
    return torch.arange(features) < (features + 1) // 2


def _conditioners(
    features: int,
    context: int,
    masks: list[Tensor],
    params_per_dim: int,
    hidden: Sequence[int],
    activation: Callable[[], nn.Module],
    embedding: int,
) -> list[StepConditioner]:
    """NanoFlow sharing: one MLP per mask shape (one in all for even ``D``), a private embedding and gate per step."""
    shared: dict[tuple[int, int], MLP] = {}
    steps = []
    for mask in masks:
        n_kept = int(mask.sum())
        n_trans = features - n_kept
        key = (n_kept, n_trans)
        if key not in shared:
            shared[key] = MLP(
                n_kept + embedding, n_trans * params_per_dim, hidden, context=context, activation=activation
            )
        steps.append(StepConditioner(shared[key], embedding, n_trans * params_per_dim))
    return steps


def _coupling_chain(
    who: str,
    features: int,
    context: int,
    coupling: Callable[..., Bijection],
    params_per_dim: int,
    *,
    transforms: int,
    hidden: Sequence[int],
    activation: Callable[[], nn.Module],
    share_conditioner: bool,
    embedding: int,
    tail: Sequence[Callable[[int], Bijection]] = (),
) -> Chain:
    """RealNVP's and NICE's transform, one implementation: ``transforms`` alternating couplings, then ``tail``.

    ``coupling(features, context, mask=..., conditioner=..., hidden=..., activation=...)`` builds one
    layer (affine or additive), whose conditioner outputs ``params_per_dim`` values per transformed entry;
    each of ``tail`` builds a layer from ``features`` (after the checks, like every layer).
    """
    check_builder(
        who,
        features,
        context,
        transforms=transforms,
        hidden=hidden,
        activation=activation,
        minimum_features=2,
        why="couplings need two parts",
    )
    evens = _evens_first_mask(features)
    masks = [evens if i % 2 == 0 else ~evens for i in range(transforms)]
    conditioners = (
        _conditioners(features, context, masks, params_per_dim, hidden, activation, embedding)
        if share_conditioner
        else [None] * transforms
    )
    layers = [
        coupling(features, context, mask=mask, conditioner=conditioner, hidden=hidden, activation=activation)
        for mask, conditioner in zip(masks, conditioners, strict=True)
    ]
    return _alternating(features, [*layers, *(make(features) for make in tail)])


@register
class RealNVP(Flow):
    r"""RealNVP for vectors: affine couplings with alternating even/odd masks.

    Coupling ``i`` keeps the even-indexed features when ``i`` is even and the odd-indexed ones
    otherwise, and maps the rest by :math:`x \mapsto x e^{s} + t` with
    :math:`(t, s)` from an MLP of the kept part (and the context). Identity at initialisation.
    (Implemented as half-mask couplings between a fixed even-first permutation and its inverse:
    the same model, with contiguous splits.)

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
        share_conditioner: NanoFlow parameter sharing (:mod:`flows.nn.sharing`): one conditioner
            network for all couplings, with a learned per-step embedding and output gate.
        embedding: width of the per-step embedding when sharing.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

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
        share_conditioner: bool = False,
        embedding: int = 8,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        chain = _coupling_chain(
            "RealNVP",
            features,
            context,
            functools.partial(AffineCoupling, clamp=clamp),
            2,
            transforms=transforms,
            hidden=hidden,
            activation=activation,
            share_conditioner=share_conditioner,
            embedding=embedding,
        )
        super().__init__(chain, StandardNormal(features), context=context, standardize=standardize)


@register
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
        share_conditioner: NanoFlow parameter sharing (see :class:`RealNVP`).
        embedding: width of the per-step embedding when sharing.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

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
        share_conditioner: bool = False,
        embedding: int = 8,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        chain = _coupling_chain(
            "NICE",
            features,
            context,
            AdditiveCoupling,
            1,
            transforms=transforms,
            hidden=hidden,
            activation=activation,
            share_conditioner=share_conditioner,
            embedding=embedding,
            tail=[Affine],
        )
        super().__init__(chain, StandardNormal(features), context=context, standardize=standardize)
