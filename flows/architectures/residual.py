r"""Residual flow builder: a stack of Lipschitz-constrained invertible residual blocks.

References:
    Behrmann, Grathwohl, Chen, Duvenaud, Jacobsen (2019), "Invertible Residual Networks", ICML,
    arXiv:1811.00995. Chen, Behrmann, Duvenaud, Jacobsen (2019), "Residual Flows for Invertible
    Generative Modeling", NeurIPS, arXiv:1906.02735.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from flows._validation import check_builder
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.normalization import ActNorm
from flows.bijections.residual import ResidualBlock
from flows.bijections.standardize import Standardize
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["ResidualFlow"]


@register
class ResidualFlow(Flow):
    r"""Residual flow for vectors: blocks :math:`x \mapsto x + g_l(x)` with :math:`\operatorname{Lip}(g_l) < 1`.

    Every block is a :class:`~flows.bijections.residual.ResidualBlock` (spectrally normalised
    MLP with LipSwish activations), optionally preceded by an
    :class:`~flows.bijections.normalization.ActNorm` (as in Chen et al.). ``log_prob`` evaluates
    the exact log-determinant in evaluation mode; training uses the unbiased Russian-roulette
    estimator with the Neumann-series gradient for ``D > 16`` (``log_det="auto"``), or as chosen.
    Sampling inverts each block by fixed-point iteration (implicit gradients).

    References:
        Behrmann et al. (2019), arXiv:1811.00995. Chen et al. (2019), arXiv:1906.02735.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of residual blocks.
        hidden: hidden widths of each block's network (at least one layer).
        coefficient: spectral-norm bound of every linear layer, in ``(0, 1)``.
        log_det: ``"auto"``, ``"exact"`` or ``"roulette"`` (see
            :class:`~flows.bijections.residual.ResidualBlock`).
        actnorm: an ActNorm before every block.
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer put in
            front of the flow (see :class:`~flows.flow.Flow`).

    Example:
        >>> import torch
        >>> flow = ResidualFlow(2, transforms=2, hidden=(16,))
        >>> x = torch.randn(5, 2)
        >>> flow.log_prob(x).shape, flow.sample((3,)).shape
        (torch.Size([5]), torch.Size([3, 2]))
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        coefficient: float = 0.97,
        log_det: str = "auto",
        actnorm: bool = True,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_builder("ResidualFlow", features, context, transforms=transforms, hidden=hidden, minimum_layers=1)
        layers: list[Bijection] = []
        for _ in range(transforms):
            if actnorm:
                layers.append(ActNorm(features))
            layers.append(
                ResidualBlock(features, context, hidden=tuple(hidden), coefficient=coefficient, log_det=log_det)
            )
        super().__init__(Chain(*layers), StandardNormal(features), context=context, standardize=standardize)
