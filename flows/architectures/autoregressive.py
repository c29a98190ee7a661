"""Autoregressive and spline flow builders: MAF, IAF and NSF (autoregressive or coupling).

Options are keyword-only. Every builder is a :class:`~flows.flow.Flow` with a standard normal
base. Consecutive autoregressive layers use opposite feature orders (``0..D-1``, then
``D-1..0``; random orders with ``randperm=True``), which costs nothing: the order lives in the
MADE masks, not in permutation layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from flows._validation import check_builder
from flows.architectures.registry import register
from flows.bijections.autoregressive import MaskedAutoregressive
from flows.bijections.base import Bijection, Chain, Inverse
from flows.bijections.coupling import Coupling, alternating_mask
from flows.bijections.linear import LULinear
from flows.bijections.normalization import BatchNorm
from flows.bijections.splines import RationalQuadraticSpline
from flows.bijections.standardize import Standardize
from flows.bijections.transformers import AffineTransformer, Transformer
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["IAF", "MAF", "NSF"]


def _orders(features: int, transforms: int, randperm: bool, generator: torch.Generator | None) -> list[torch.Tensor]:
    if randperm:
        return [torch.randperm(features, generator=generator) for _ in range(transforms)]
    forward, backward = torch.arange(features), torch.arange(features - 1, -1, -1)
    return [forward if i % 2 == 0 else backward for i in range(transforms)]


def _autoregressive_layers(
    features: int,
    context: int,
    transformer: Callable[[], Transformer],
    *,
    transforms: int,
    randperm: bool,
    generator: torch.Generator | None,
    **made: Any,
) -> list[MaskedAutoregressive]:
    """``transforms`` MADE layers in alternating (or random) orders; ``made``: ``hidden``, ``residual``, ..."""
    return [
        MaskedAutoregressive(features, context, transformer=transformer(), order=order, **made)
        for order in _orders(features, transforms, randperm, generator)
    ]


class _AffineAutoregressiveFlow(Flow):
    """MAF and IAF, one implementation: affine MADE layers (with batch norms between them), inverted for IAF."""

    #: IAF: every member of MAF's chain is inverted (in place, the order kept).
    inverted = False

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 5,
        hidden: Sequence[int] = (64, 64),
        residual: bool = False,
        randperm: bool = False,
        batch_norm: bool = False,
        clamp: float | None = 3.0,
        dropout: float = 0.0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        name = type(self).__name__
        check_builder(
            name, features, context, transforms=transforms, hidden=hidden, activation=activation, minimum_layers=1
        )
        layers = _autoregressive_layers(
            features,
            context,
            lambda: AffineTransformer(clamp),
            transforms=transforms,
            randperm=randperm,
            generator=generator,
            hidden=hidden,
            residual=residual,
            dropout=dropout,
            activation=activation,
        )
        chain: list[Bijection] = []
        for i, layer in enumerate(layers):
            chain.append(layer)
            if batch_norm and i < len(layers) - 1:
                chain.append(BatchNorm(features))
        if self.inverted:
            chain = [Inverse(member) for member in chain]
        super().__init__(Chain(*chain), StandardNormal(features), context=context, standardize=standardize)


@register
class MAF(_AffineAutoregressiveFlow):
    r"""Masked autoregressive flow: affine autoregressive layers, fast density, sequential sampling.

    Layer :math:`l` maps :math:`z_i = x_i e^{s_i} + t_i` with :math:`(t_i, s_i)` from a MADE of
    :math:`x_{<i}` (in that layer's order) and the context, the log-scale soft-clamped to
    :math:`|s| < \text{clamp}`. ``log_prob`` costs one MADE pass per layer; ``sample`` runs each
    layer's inverse, ``D`` sequential steps that together cost one MADE pass (see
    :meth:`flows.nn.MADE.solve`).

    References:
        Papamakarios, Pavlakou, Murray (2017), "Masked Autoregressive Flow for Density Estimation",
        NeurIPS, arXiv:1705.07057.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of autoregressive layers.
        hidden: hidden widths of each MADE (at least one layer).
        residual: residual MADEs (equal hidden widths).
        randperm: random feature orders instead of alternating ones.
        batch_norm: a :class:`~flows.bijections.normalization.BatchNorm` after every layer but the
            last (as in the MAF paper; evaluate with :func:`flows.evaluating`).
        clamp: bound on the absolute log-scale (``None`` for none).
        dropout: dropout on the MADEs' hidden units in train mode (see :class:`~flows.nn.MADE`).
        activation: nonlinearity of the MADEs.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = MAF(3, transforms=2, hidden=(16,))
        >>> x = flow.sample((4,))
        >>> flow.log_prob(x).shape
        torch.Size([4])
    """


@register
class IAF(_AffineAutoregressiveFlow):
    r"""Inverse autoregressive flow: MAF's layers inverted, one-pass sampling, sequential density.

    Each layer is :class:`~flows.bijections.base.Inverse` of an affine
    :class:`~flows.bijections.autoregressive.MaskedAutoregressive`: sampling maps
    :math:`x_i = z_i e^{s_i(z_{<i})} + t_i(z_{<i})` in one MADE pass per layer, and
    :meth:`~flows.flow.Flow.sample_and_log_prob` gives the density of its own samples at no extra
    cost (the variational-inference use). ``log_prob`` of arbitrary data runs ``D`` sequential
    steps per layer. The same builder as :class:`MAF` (same options), with every layer inverted.

    References:
        Kingma, Salimans, Jozefowicz, Chen, Sutskever, Welling (2016), "Improved Variational
        Inference with Inverse Autoregressive Flow", NeurIPS, arXiv:1606.04934.

    Args:
        features, context, transforms, hidden, residual, randperm, clamp, dropout, activation,
            generator, standardize: as for :class:`MAF`.
        batch_norm: an inverted :class:`~flows.bijections.normalization.BatchNorm` after every layer
            but the last: it normalises the samples on their way out (batch statistics in train
            mode), so ``log_prob`` of data needs eval mode (:func:`flows.evaluating`).

    Example:
        >>> import torch
        >>> flow = IAF(3, transforms=2, hidden=(16,))
        >>> x, log_p = flow.sample_and_log_prob((4,))
        >>> torch.allclose(log_p, flow.log_prob(x), atol=1e-5)
        True
    """

    inverted = True


@register
class NSF(Flow):
    r"""Neural spline flow: monotone rational-quadratic splines with autoregressive or coupling conditioners.

    Every layer maps each feature by a
    :class:`~flows.bijections.splines.RationalQuadraticSpline` with ``bins`` bins on
    ``[-bound, bound]`` (identity outside: standardise the data first). The raw spline parameters
    come from

    * ``coupling=False`` (default, RQ-NSF (AR)): a MADE of the preceding features in the layer's
      order (:class:`~flows.bijections.autoregressive.MaskedAutoregressive`); one-pass density,
      ``D``-step sampling;
    * ``coupling=True`` (RQ-NSF (C)): an MLP of the other half of the features
      (:class:`~flows.bijections.coupling.Coupling`, alternating even/odd masks); one pass both ways.

    With ``lu=True`` an :class:`~flows.bijections.linear.LULinear` (identity at initialisation)
    precedes every spline layer, as in the paper's tabular models. One class with a flag, not two:
    the two variants differ only in the conditioner.

    References:
        Durkan, Bekasov, Murray, Papamakarios (2019), "Neural Spline Flows", NeurIPS,
        arXiv:1906.04032.

    Args:
        features: data dimension ``D`` (at least 2 for ``coupling=True``).
        context: context width (0 for an unconditional flow).
        transforms: number of spline layers.
        hidden: hidden widths of each conditioner (at least one layer for the MADEs).
        bins: number of spline bins ``K``.
        bound: the splines act on ``[-bound, bound]``.
        coupling: coupling conditioners instead of autoregressive ones.
        lu: an LU-parameterised linear layer before every spline layer.
        residual: residual MADEs (autoregressive variant, equal hidden widths).
        randperm: random feature orders (autoregressive variant).
        dropout: dropout on the MADEs' hidden units in train mode (autoregressive variant; see
            :class:`~flows.nn.MADE`).
        activation: nonlinearity of the conditioners.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

    Example:
        >>> import torch
        >>> flow = NSF(4, transforms=2, hidden=(16,), bins=4)
        >>> x = flow.sample((5,))
        >>> flow.log_prob(x).shape, NSF(4, coupling=True, lu=True, transforms=2, hidden=(8,)).log_prob(x).shape
        (torch.Size([5]), torch.Size([5]))
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 5,
        hidden: Sequence[int] = (64, 64),
        bins: int = 8,
        bound: float = 5.0,
        coupling: bool = False,
        lu: bool = False,
        residual: bool = False,
        randperm: bool = False,
        dropout: float = 0.0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_builder(
            "NSF",
            features,
            context,
            transforms=transforms,
            hidden=hidden,
            activation=activation,
            minimum_features=2 if coupling else 1,
            why="couplings need two parts" if coupling else "",
            minimum_layers=0 if coupling else 1,
        )
        if coupling and (dropout or residual or randperm):
            raise ValueError(
                "NSF: dropout, residual and randperm are options of the autoregressive variant, got "
                f"coupling=True with dropout={dropout}, residual={residual}, randperm={randperm}"
            )
        RationalQuadraticSpline(bins, bound=bound)  # validates bins and bound with a clear message

        def spline() -> RationalQuadraticSpline:
            return RationalQuadraticSpline(bins, bound=bound)

        if coupling:
            layers: list[Bijection] = [
                Coupling(
                    features,
                    context,
                    transformer=spline(),
                    mask=alternating_mask(features, keep_even=i % 2 == 0),
                    hidden=hidden,
                    activation=activation,
                )
                for i in range(transforms)
            ]
        else:
            layers = _autoregressive_layers(
                features,
                context,
                spline,
                transforms=transforms,
                randperm=randperm,
                generator=generator,
                hidden=hidden,
                residual=residual,
                dropout=dropout,
                activation=activation,
            )
        if lu:
            layers = [m for layer in layers for m in (LULinear(features), layer)]
        super().__init__(Chain(*layers), StandardNormal(features), context=context, standardize=standardize)
