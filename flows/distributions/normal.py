"""Gaussian bases: :class:`StandardNormal` and :class:`DiagNormal`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_event
from flows.distributions.base import Distribution

__all__ = ["DiagNormal", "StandardNormal"]


class StandardNormal(Distribution):
    r"""Standard normal :math:`\mathcal N(0, I)` over events of any shape.

    :math:`\log p(x) = -\tfrac12 \|x\|^2 - \tfrac{n}{2}\log 2\pi`, ``n`` = number of event entries.

    Args:
        event_shape: shape of one event.

    Example:
        >>> import torch
        >>> d = StandardNormal((2, 3))
        >>> d.sample((4,)).shape, round(d.log_prob(torch.zeros(2, 3)).item(), 4)
        (torch.Size([4, 2, 3]), -5.5136)
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__(event_shape)
        # Carries dtype and device for sampling; not saved (it holds no information).
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)
        self._log_norm = 0.5 * self.event_shape.numel() * math.log(2 * math.pi)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        return -0.5 * x.square().sum(dims) - self._log_norm

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        a = self._anchor
        return torch.randn(self._sample_shape(sample_shape, context), dtype=a.dtype, device=a.device)


class DiagNormal(Distribution):
    r"""Diagonal Gaussian :math:`\mathcal N(\mu, \operatorname{diag}\sigma^2)` with learnable (or fixed) parameters.

    :math:`\log p(x) = \sum_i [-\tfrac12 ((x_i-\mu_i)/\sigma_i)^2 - \log\sigma_i - \tfrac12\log 2\pi]`.

    Args:
        event_shape: shape of one event.
        loc: initial mean (broadcast to ``event_shape``).
        scale: initial standard deviation (positive).
        trainable: learn ``loc`` and ``log_scale`` (otherwise they are buffers).

    Example:
        >>> import torch
        >>> d = DiagNormal(2, loc=1.0, scale=2.0)
        >>> round(d.log_prob(torch.ones(2)).item(), 4) == round(-2 * math.log(2) - math.log(2 * math.pi), 4)
        True
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        *,
        loc: float | Tensor = 0.0,
        scale: float | Tensor = 1.0,
        trainable: bool = True,
    ) -> None:
        super().__init__(event_shape)
        scale = torch.as_tensor(scale, dtype=torch.get_default_dtype())
        if not bool((scale > 0).all()):
            raise ValueError(f"DiagNormal: expected a positive scale, got {scale}")
        loc = torch.as_tensor(loc, dtype=torch.get_default_dtype()).expand(self.event_shape).clone()
        log_scale = scale.log().expand(self.event_shape).clone()
        if trainable:
            self.loc, self.log_scale = nn.Parameter(loc), nn.Parameter(log_scale)
        else:
            self.register_buffer("loc", loc)
            self.register_buffer("log_scale", log_scale)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        u = (x - self.loc) * torch.exp(-self.log_scale)
        return (-0.5 * u.square() - self.log_scale).sum(dims) - 0.5 * self.event_shape.numel() * math.log(2 * math.pi)

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        eps = torch.randn(self._sample_shape(sample_shape, context), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.log_scale.exp()
