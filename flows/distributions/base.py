"""The base-distribution contract: :class:`Distribution`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flows._validation import as_sample_shape, as_shape

__all__ = ["Distribution"]


class Distribution(nn.Module):
    """Base class of the library's distributions (base distributions of flows).

    Subclasses implement :meth:`log_prob` and :meth:`rsample`; :meth:`sample` and
    :meth:`rsample_and_log_prob` are derived (override the latter when it can be fused).

    Args:
        event_shape: shape of one event.
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        self.event_shape = torch.Size(as_shape(event_shape, "event_shape", allow_none=False))

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log-density of ``x`` (``(*batch, *event_shape)``), of shape ``batch``."""
        raise NotImplementedError

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Reparameterised sample of shape ``(*sample_shape, *context_batch, *event_shape)``."""
        raise NotImplementedError

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Sample without gradient tracking."""
        return self.rsample(sample_shape, context)

    def rsample_and_log_prob(
        self, sample_shape: Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """A reparameterised sample and its log-density."""
        x = self.rsample(sample_shape, context)
        return x, self.log_prob(x, context)

    def _sample_shape(self, sample_shape: Sequence[int] | int, context: Tensor | None) -> torch.Size:
        shape = as_sample_shape(sample_shape)  # negative or non-integer sizes: a clear error
        if context is not None:
            shape = shape + context.shape[:-1]
        return shape + self.event_shape

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"
