r"""Neural and polynomial autoregressive flows: NAF, UNAF, SOSPF, BPF, and the block neural autoregressive BNAF.

Each builder is a stack of :class:`~flows.bijections.autoregressive.MaskedAutoregressive`
layers (alternating feature orders, as in :class:`~flows.architectures.MAF`) whose elementwise
transformer is a monotone map with no closed-form inverse; ``log_prob`` is one MADE pass per layer,
``sample`` solves each feature's scalar equation by the numerical inverse
(:func:`~flows.bijections.numerical_inverse.monotone_inverse`, ``D`` sequential solves per layer).
They are MAF with another transformer, not a new class tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_builder, check_count, check_hidden, check_number
from flows.architectures.autoregressive import _autoregressive_layers
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.block_autoregressive import BlockAutoregressive
from flows.bijections.elementwise import SoftClip
from flows.bijections.monotone import (
    BernsteinTransformer,
    DeepSigmoidTransformer,
    SOSPolynomialTransformer,
    UMNNTransformer,
)
from flows.bijections.permutation import Reverse
from flows.bijections.standardize import Standardize
from flows.bijections.transformers import Transformer
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["BNAF", "BPF", "NAF", "SOSPF", "UNAF"]


class _MonotoneAutoregressiveFlow(Flow):
    """The shared body: ``transforms`` MADE layers driving ``transformer()``, standard normal base."""

    def _build(
        self,
        features: int,
        context: int,
        transformer: Callable[[], Transformer],
        *,
        transforms: int,
        hidden: Sequence[int],
        randperm: bool,
        activation: Callable[[], nn.Module],
        generator: torch.Generator | None,
        standardize: Tensor | Standardize | None,
        after: Callable[[], Bijection] | None = None,
    ) -> None:
        check_builder(
            type(self).__name__,
            features,
            context,
            transforms=transforms,
            hidden=hidden,
            activation=activation,
            minimum_layers=1,
        )
        transformer()  # validates the transformer's options with its own clear message
        layers = _autoregressive_layers(
            features,
            context,
            transformer,
            transforms=transforms,
            randperm=randperm,
            generator=generator,
            hidden=hidden,
            activation=activation,
        )
        if after is not None:  # a fixed bijection after every layer (SOSPF's soft clips)
            layers = [m for layer in layers for m in (layer, after())]
        super().__init__(Chain(*layers), StandardNormal(features), context=context, standardize=standardize)


@register
class NAF(_MonotoneAutoregressiveFlow):
    r"""Neural autoregressive flow: deep sigmoidal transformers driven by MADEs.

    Each layer maps :math:`z_i = \sigma^{-1}\big(\sum_j w_j \sigma(a_j x_i + b_j)\big)` with
    :math:`(a, b, w)` from a MADE of :math:`x_{<i}` and the context
    (:class:`~flows.bijections.monotone.DeepSigmoidTransformer`); NAF is a universal density
    approximator (Huang et al. 2018, Theorem 1).

    References:
        Huang, Krueger, Lacoste, Courville (2018), "Neural Autoregressive Flows", ICML,
        arXiv:1804.00779.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of autoregressive layers.
        hidden: hidden widths of each MADE (at least one layer).
        sigmoids: sigmoids per deep-sigmoidal layer ``H``.
        sigmoid_layers: stacked sigmoidal maps per transformer.
        randperm: random feature orders instead of alternating ones.
        activation: nonlinearity of the MADEs.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = NAF(3, transforms=2, hidden=(16,), sigmoids=4)
        >>> x = flow.sample((4,))
        >>> flow.log_prob(x).shape
        torch.Size([4])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        sigmoids: int = 8,
        sigmoid_layers: int = 1,
        randperm: bool = False,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_count("NAF", "sigmoids", sigmoids)
        check_count("NAF", "sigmoid_layers", sigmoid_layers)
        self._build(
            features,
            context,
            lambda: DeepSigmoidTransformer(sigmoids, layers=sigmoid_layers),
            transforms=transforms,
            hidden=hidden,
            randperm=randperm,
            activation=activation,
            generator=generator,
            standardize=standardize,
        )


@register
class UNAF(_MonotoneAutoregressiveFlow):
    r"""Unconstrained monotonic neural autoregressive flow: UMNN transformers driven by MADEs.

    Each layer maps :math:`z_i = \beta_i + \int_0^{x_i} f(t, h_i)\,dt` with :math:`(\beta_i, h_i)`
    from a MADE and :math:`f > 0` a network shared by the features of a layer, integrated by
    Clenshaw–Curtis quadrature (:class:`~flows.bijections.monotone.UMNNTransformer`).

    References:
        Wehenkel, Louppe (2019), "Unconstrained Monotonic Neural Networks", NeurIPS,
        arXiv:1908.05164.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of autoregressive layers.
        hidden: hidden widths of each MADE (at least one layer).
        embedding: width ``E`` of the embedding each MADE gives the integrand per feature.
        integrand: hidden widths of the integrand network.
        nodes: quadrature order (even).
        randperm: random feature orders instead of alternating ones.
        activation: nonlinearity of the MADEs.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = UNAF(2, transforms=1, hidden=(8,), embedding=2, integrand=(8,))
        >>> flow.log_prob(flow.sample((3,))).shape
        torch.Size([3])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        embedding: int = 8,
        integrand: Sequence[int] = (32, 32),
        nodes: int = 16,
        randperm: bool = False,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_count("UNAF", "embedding", embedding, minimum=0)
        integrand = check_hidden("UNAF (integrand)", integrand)
        self._build(
            features,
            context,
            lambda: UMNNTransformer(embedding, integrand, nodes=nodes),
            transforms=transforms,
            hidden=hidden,
            randperm=randperm,
            activation=activation,
            generator=generator,
            standardize=standardize,
        )


CLIP_SLOPE = 0.001
"""Far-out slope of the soft clips after SOSPF's layers: a coordinate at 1000 times the bound reaches 2 times it.

Small enough that an outlier (dequantised digits hold rows at hundreds of standard deviations)
reaches the next layer near the bound, as with zuko's bounded clips, yet positive, so the flow is
onto the real line (0.01 let such rows reach twice the bound and cost the digits table 5-15 nats).
"""


@register
class SOSPF(_MonotoneAutoregressiveFlow):
    r"""Sum-of-squares polynomial flow: SOS polynomial transformers driven by MADEs.

    Each layer maps :math:`z_i = c + \epsilon x_i + \int_0^{x_i} \sum_k p_k(t)^2\,dt` with the
    coefficients from a MADE (:class:`~flows.bijections.monotone.SOSPolynomialTransformer`).
    Standardise the data: the polynomials grow as :math:`|x|^{2r+1}`.

    References:
        Jaini, Selby, Yu (2019), "Sum-of-Squares Polynomial Flow", ICML, arXiv:1905.02325.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of autoregressive layers.
        hidden: hidden widths of each MADE (at least one layer).
        degree: degree ``r`` of each squared polynomial.
        squares: number ``K`` of squares.
        bound: each layer's polynomial acts on ``u = x / bound`` over ``[-bound, bound]`` and is
            continued by straight lines outside (``SOSPolynomialTransformer(bound=bound)``), so every
            layer is a bijection of the real line that grows linearly; ``None``: plain polynomials
            on all of it. A stack of plain odd-degree polynomials grows like :math:`x^{(2r+1)^L}`:
            standardised data with tails (digits pixels reach 22 standard deviations) then overflow
            float32 in the second layer and training gives NaN at its first step. With a bound, a
            :class:`~flows.bijections.elementwise.SoftClip` onto the real line
            (``0.999 x / (1 + |x| / 1.1B) + 0.001 x``) follows every layer, so that a point that one
            layer sends far out reaches the next squeezed into about ``±1.1 B``, where its
            polynomial was trained, instead of riding its steep end slope, and leaves the last one
            squeezed too: a coordinate that the last polynomial extrapolates to 700 costs the base
            density 11²/2 nats instead of 700²/2 (one digits test row cost 237,000 nats without the
            last clip). zuko puts plain soft clips between the layers only (slope 0), which bound
            the image and make the flow non-surjective.
        knee: half-width ``0 <= k < 1.1 B`` of an identity region at the centre of each clip
            (``SoftClip(knee=k)``): the clip squeezes only beyond ``±k``. ``0`` squeezes from the
            origin on, which suits data with outliers or sharp edges (dequantised pixels: lower test
            NLL than zuko's in 3 of 3 digits runs against 2 of 3 with ``k = 1``); on smooth
            standardised data (two moons) ``k = 1`` leaves the bulk to the polynomials and fits
            better (4 of 4 runs; see ``docs/monotone.md``).
        randperm: random feature orders instead of alternating ones.
        activation: nonlinearity of the MADEs.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = SOSPF(2, transforms=2, hidden=(8,))
        >>> flow.log_prob(flow.sample((3,))).shape
        torch.Size([3])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        degree: int = 2,
        squares: int = 2,
        bound: float | None = 10.0,
        knee: float = 0.0,
        randperm: bool = False,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_count("SOSPF", "degree", degree, minimum=0)
        check_count("SOSPF", "squares", squares)
        knee = check_number("SOSPF", "knee", knee, minimum=0)
        if bound is not None:
            check_number("SOSPF", "bound", bound, minimum=0, strict=True, maximum=1e6)
            if knee >= 1.1 * bound:
                raise ValueError(f"SOSPF: expected knee in [0, 1.1 bound) = [0, {1.1 * bound:g}), got {knee!r}")
        elif knee:
            raise ValueError(f"SOSPF: a knee shapes the clips after bounded layers; got knee={knee!r} with bound=None")
        self._build(
            features,
            context,
            lambda: SOSPolynomialTransformer(degree, squares, bound=bound),
            transforms=transforms,
            hidden=hidden,
            randperm=randperm,
            activation=activation,
            generator=generator,
            standardize=standardize,
            after=None if bound is None else lambda: SoftClip(features, bound=1.1 * bound, slope=CLIP_SLOPE, knee=knee),
        )


@register
class BPF(_MonotoneAutoregressiveFlow):
    r"""Bernstein polynomial flow: Bernstein transformers on ``[-bound, bound]`` (linear tails) driven by MADEs.

    Each layer maps :math:`z_i = \sum_k \vartheta_k b_{k,M}((x_i + B)/2B)` with increasing
    coefficients from a MADE (:class:`~flows.bijections.monotone.BernsteinTransformer`).

    References:
        Sick, Hothorn, Dürr (2021), "Deep transformation models", ICPR, arXiv:2004.00464.
        Ramasinghe, Fernando, Khan, Barnes (2021), "Robust normalizing flows using Bernstein-type
        polynomials", arXiv:2102.03509.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of autoregressive layers.
        hidden: hidden widths of each MADE (at least one layer).
        degree: polynomial degree ``M``.
        bound: half-width ``B`` of the polynomial part.
        randperm: random feature orders instead of alternating ones.
        activation: nonlinearity of the MADEs.
        generator: random generator for ``randperm``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = BPF(2, transforms=2, hidden=(8,), degree=6)
        >>> flow.log_prob(flow.sample((3,))).shape
        torch.Size([3])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 3,
        hidden: Sequence[int] = (64, 64),
        degree: int = 8,
        bound: float = 5.0,
        randperm: bool = False,
        activation: Callable[[], nn.Module] = nn.ReLU,
        generator: torch.Generator | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_count("BPF", "degree", degree)
        self._build(
            features,
            context,
            lambda: BernsteinTransformer(degree, bound=bound),
            transforms=transforms,
            hidden=hidden,
            randperm=randperm,
            activation=activation,
            generator=generator,
            standardize=standardize,
        )


@register
class BNAF(Flow):
    r"""Block neural autoregressive flow: ``transforms`` block-triangular monotone networks in alternating orders.

    Each layer is a :class:`~flows.bijections.block_autoregressive.BlockAutoregressive`: one
    network whose weights are block lower triangular with positive diagonal blocks, so its
    Jacobian is triangular and its log-det exact in one pass (no MADE conditioner: the network *is*
    the transform). Sampling solves ``D`` scalar equations per layer numerically.

    References:
        De Cao, Aziz, Titov (2019), "Block Neural Autoregressive Flow", UAI, arXiv:1904.04676.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of BNAF layers.
        hidden: hidden block sizes per feature (layer ``l`` is ``D · hidden[l]`` wide; at least one).
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> flow = BNAF(2, transforms=2, hidden=(4,))
        >>> flow.log_prob(flow.sample((3,))).shape
        torch.Size([3])
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 3,
        hidden: Sequence[int] = (8, 8),
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_builder("BNAF", features, context, transforms=transforms, hidden=hidden, minimum_layers=1)
        layers: list[Bijection] = []
        for i in range(transforms):
            if i:
                layers.append(Reverse(features))
            layers.append(BlockAutoregressive(features, context, hidden=tuple(hidden)))
        super().__init__(Chain(*layers), StandardNormal(features), context=context, standardize=standardize)
