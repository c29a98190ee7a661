r"""The uniform distribution on the torus :math:`[-\pi, \pi)^n`, the base of circular flows."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_event
from flows.distributions.base import Distribution

__all__ = ["TorusNormal", "TorusUniform"]


class TorusUniform(Distribution):
    r"""Uniform density :math:`(2\pi)^{-n}` on the torus :math:`[-\pi, \pi)^n` (``n`` event entries).

    ``log_prob`` is :math:`-n \log 2\pi` at every point: angles are taken modulo :math:`2\pi`
    (the density is periodic), as a circular flow's last layer wraps its output anyway.

    Args:
        event_shape: shape of one event.

    Example:
        >>> import torch
        >>> d = TorusUniform(2)
        >>> d.sample((3,)).abs().max() <= torch.pi, round(d.log_prob(torch.zeros(2)).item(), 4)
        (tensor(True), -3.6758)
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__(event_shape)
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)
        self._log_norm = self.event_shape.numel() * math.log(2 * math.pi)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        return (x * 0).sum(dims) - self._log_norm  # NaN in -> NaN out

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        a = self._anchor
        u = torch.rand(self._sample_shape(sample_shape, context), dtype=a.dtype, device=a.device)
        return 2 * math.pi * u - math.pi


class TorusNormal(Distribution):
    r"""Uniform on the ``circular`` entries (angles in :math:`[-\pi, \pi)`), standard normal on the others.

    :math:`\log p(x) = -n_c \log 2\pi + \sum_{i \notin c} [-\tfrac12 x_i^2 - \tfrac12 \log 2\pi]`
    for vector events; the density is periodic in every angle.

    Args:
        circular: boolean mask ``(features,)``.

    Example:
        >>> import torch
        >>> d = TorusNormal(torch.tensor([True, False]))
        >>> round(d.log_prob(torch.zeros(2)).item(), 4)
        -2.7568
    """

    def __init__(self, circular: Tensor) -> None:
        circular = torch.as_tensor(circular, dtype=torch.bool).flatten()
        super().__init__(len(circular))
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)
        self.register_buffer("circular", circular, persistent=False)
        self._log_norm = int(circular.sum()) * math.log(2 * math.pi) + 0.5 * int((~circular).sum()) * math.log(
            2 * math.pi
        )

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        return torch.where(self.circular, x * 0, -0.5 * x.square()).sum(-1) - self._log_norm

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        a = self._anchor
        shape = self._sample_shape(sample_shape, context)
        u = torch.rand(shape, dtype=a.dtype, device=a.device) * 2 * math.pi - math.pi
        return torch.where(self.circular, u, torch.randn(shape, dtype=a.dtype, device=a.device))
