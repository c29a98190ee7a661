r"""Residual flow builder: a stack of Lipschitz-constrained invertible residual blocks.

References:
    Behrmann, Grathwohl, Chen, Duvenaud, Jacobsen (2019), "Invertible Residual Networks", ICML,
    arXiv:1811.00995. Chen, Behrmann, Duvenaud, Jacobsen (2019), "Residual Flows for Invertible
    Generative Modeling", NeurIPS, arXiv:1906.02735.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from flows._validation import check_builder, check_count, check_hidden
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.multiscale import Flatten, Split, Squeeze
from flows.bijections.normalization import ActNorm, ActNorm2d
from flows.bijections.residual import ResidualBlock
from flows.bijections.residual_conv import ConvResidualBlock
from flows.bijections.standardize import Standardize
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["ResidualFlow"]


@register
class ResidualFlow(Flow):
    r"""Residual flow for vectors or images: blocks :math:`x \mapsto x + g_l(x)`, :math:`\operatorname{Lip}(g_l) < 1`.

    Every block is a :class:`~flows.bijections.residual.ResidualBlock` (spectrally normalised
    MLP with LipSwish activations), optionally preceded by an
    :class:`~flows.bijections.normalization.ActNorm` (as in Chen et al.). ``log_prob`` evaluates
    the exact log-determinant in evaluation mode; training uses the unbiased Russian-roulette
    estimator with the Neumann-series gradient for ``D > 16`` (``log_det="auto"``), or as chosen.
    Sampling inverts each block by fixed-point iteration (implicit gradients).

    With an image shape ``features=(C, H, W)`` the flow is a **convolutional i-ResNet**: a
    :class:`~flows.bijections.multiscale.Squeeze` (``squeeze=True``, the default for images:
    ``(4C, H/2, W/2)``), then ``transforms`` × [:class:`~flows.bijections.normalization.ActNorm2d`,
    :class:`~flows.bijections.residual_conv.ConvResidualBlock`] (``hidden`` are channel counts,
    ``kernel_sizes`` default 3-1-…-3). With ``scales=1`` a
    :class:`~flows.bijections.multiscale.Flatten` maps that onto a standard normal of ``C·H·W``
    entries (Behrmann et al.'s single scale). With ``scales=L > 1`` it is Chen et al.'s multi-scale
    architecture: after the blocks of each scale but the last, a
    :class:`~flows.bijections.multiscale.Split` factors half of the channels out to the latent
    and the other half is squeezed again and transformed by the next scale's ``transforms``
    blocks, so :math:`\log q(x) = \sum_l \log \mathcal N(z_l) + \sum_{\text{blocks}} \log\det(I + J_g)`.
    Image blocks take no context.

    References:
        Behrmann et al. (2019), arXiv:1811.00995. Chen et al. (2019), arXiv:1906.02735.

    Args:
        features: data dimension ``D``, or an image shape ``(C, H, W)``.
        context: context width (0 for an unconditional flow; images: 0 only).
        transforms: number of residual blocks.
        hidden: hidden widths of each block's network (at least one layer); channel counts for images.
        coefficient: spectral-norm bound of every linear layer, in ``(0, 1)``.
        log_det: ``"auto"``, ``"exact"`` or ``"roulette"`` (see
            :class:`~flows.bijections.residual.ResidualBlock`).
        actnorm: an ActNorm (ActNorm2d for images) before every block.
        squeeze: images only: a space-to-depth squeeze first (default ``True`` for images).
        scales: images only: number of scales ``L`` of the multi-scale architecture (default 1;
            every scale after the first squeezes, so ``H`` and ``W`` must be divisible by
            ``2^L`` with ``squeeze=True``, ``2^(L-1)`` without).
        kernel_sizes: images only: odd kernel sizes of each block's convolutions, ``len(hidden) + 1``.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> import torch
        >>> flow = ResidualFlow(2, transforms=2, hidden=(16,))
        >>> x = torch.randn(5, 2)
        >>> flow.log_prob(x).shape, flow.sample((3,)).shape
        (torch.Size([5]), torch.Size([3, 2]))
        >>> images = ResidualFlow((1, 4, 4), transforms=1, hidden=(8,))
        >>> images.log_prob(torch.rand(2, 1, 4, 4)).shape, images.sample((3,)).shape
        (torch.Size([2]), torch.Size([3, 1, 4, 4]))

    Raises:
        ValueError, TypeError: for a bad argument, an image context, an image that cannot be
            squeezed, or an image-only option (``squeeze``, ``kernel_sizes``) for vectors.
    """

    def __init__(
        self,
        features: int | Sequence[int],
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        coefficient: float = 0.97,
        log_det: str = "auto",
        actnorm: bool = True,
        squeeze: bool | None = None,
        kernel_sizes: Sequence[int] | None = None,
        scales: int | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        if isinstance(features, Sequence) and not isinstance(features, str):
            options = {"coefficient": coefficient, "log_det": log_det, "kernel_sizes": kernel_sizes}
            chain, size = _image_chain(features, context, transforms, hidden, actnorm, squeeze, scales, options)
            super().__init__(chain, StandardNormal(size), standardize=standardize)
            return
        for name, value in (("squeeze", squeeze), ("kernel_sizes", kernel_sizes), ("scales", scales)):
            if value is not None:
                raise ValueError(f"ResidualFlow: {name} is an image option (features=(C, H, W)), got {name}={value!r}")
        check_builder("ResidualFlow", features, context, transforms=transforms, hidden=hidden, minimum_layers=1)
        layers: list[Bijection] = []
        for _ in range(transforms):
            if actnorm:
                layers.append(ActNorm(features))
            layers.append(
                ResidualBlock(features, context, hidden=tuple(hidden), coefficient=coefficient, log_det=log_det)
            )
        super().__init__(Chain(*layers), StandardNormal(features), context=context, standardize=standardize)


def _image_chain(
    shape: Sequence[int],
    context: Any,
    transforms: Any,
    hidden: Any,
    actnorm: bool,
    squeeze: bool | None,
    scales: Any,
    options: dict,
) -> tuple[Bijection, int]:
    """The convolutional chain for ``ResidualFlow((C, H, W), ...)`` (single- or multi-scale) and its latent size."""
    shape = tuple(shape)
    if len(shape) != 3 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise ValueError(f"ResidualFlow: expected features to be an int or an image shape (C, H, W), got {shape!r}")
    if context != 0:
        raise ValueError(f"ResidualFlow: image residual blocks take no context, got context={context!r}")
    check_count("ResidualFlow", "transforms", transforms)
    scales = 1 if scales is None else scales
    check_count("ResidualFlow", "scales", scales)
    hidden = check_hidden("ResidualFlow", hidden, minimum_layers=1)
    squeezes = scales - 1 + (squeeze is None or bool(squeeze))
    c, h, w = shape
    if h % 2**squeezes or w % 2**squeezes:
        what = (
            "squeeze=True"
            if scales == 1
            else f"scales={scales}" + ("" if squeeze is None or squeeze else ", squeeze=False")
        )
        raise ValueError(f"ResidualFlow: {what} needs a height and width divisible by {2**squeezes}, got {h}×{w}")
    if scales > 1 and c * (4 if squeezes == scales else 1) < 2:
        raise ValueError(
            f"ResidualFlow: scales={scales} needs at least 2 channels to split, got {c} with squeeze=False"
        )
    level = _image_level((c, h, w), transforms, hidden, actnorm, squeeze is None or bool(squeeze), scales, options)
    return level, c * h * w


def _image_level(
    shape: tuple[int, int, int],
    transforms: int,
    hidden: tuple,
    actnorm: bool,
    squeeze: bool,
    scales: int,
    options: dict,
) -> Bijection:
    """One scale: [squeeze], ``transforms`` × [ActNorm2d, block], then Flatten (last scale) or Split into the next."""
    c, h, w = shape
    layers: list[Bijection] = []
    if squeeze:
        layers.append(Squeeze(c))
        c, h, w = 4 * c, h // 2, w // 2
    for _ in range(transforms):
        if actnorm:
            layers.append(ActNorm2d(c))
        layers.append(ConvResidualBlock((c, h, w), hidden=hidden, **options))
    if scales == 1:
        return Chain(*layers, Flatten((c, h, w)))
    keep = c // 2
    inner = _image_level((keep, h, w), transforms, hidden, actnorm, True, scales - 1, options)
    return Chain(*layers, Split((c, h, w), inner, keep=keep))
