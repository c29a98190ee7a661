r"""The uniform distribution on the torus :math:`[-\pi, \pi)^n`, the base of circular flows."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_event
from flows.distributions.base import Distribution

__all__ = ["TorusUniform"]


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
