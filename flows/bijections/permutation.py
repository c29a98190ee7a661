"""Volume-preserving reorderings of one event axis: :class:`Permutation` and :class:`Reverse`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flows.bijections.base import Bijection

__all__ = ["Permutation", "Reverse"]


class Permutation(Bijection):
    r"""Permute the entries along one event axis: :math:`z_{i} = x_{\pi(i)}`, :math:`\log|\det J| = 0`.

    The permutation is stored in a buffer (saved in ``state_dict``). The axis is ``dim`` of the
    event: features for vectors (``dim=0``), channels for ``(C, H, W)`` images (``dim=0``).

    Args:
        event_shape: shape of one event.
        permutation: a permutation of ``range(event_shape[dim])``; random when ``None``.
        dim: event axis to permute.
        generator: random generator for the random permutation.

    Raises:
        ValueError: if ``permutation`` is not a permutation of the right length.

    Example:
        >>> import torch
        >>> t = Permutation(3, permutation=[2, 0, 1])
        >>> t(torch.tensor([[10.0, 20.0, 30.0]])).tolist()
        [[30.0, 10.0, 20.0]]
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        permutation: Sequence[int] | Tensor | None = None,
        *,
        dim: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(event_shape)
        if not -len(self.event_shape) <= dim < len(self.event_shape):
            raise ValueError(
                f"{type(self).__name__}: dim {dim} is out of range for event shape {tuple(self.event_shape)}"
            )
        self.dim = dim % len(self.event_shape)
        n = self.event_shape[self.dim]
        if permutation is None:
            permutation = torch.randperm(n, generator=generator)
        permutation = torch.as_tensor(permutation, dtype=torch.long)
        if permutation.shape != (n,) or not torch.equal(permutation.sort().values, torch.arange(n)):
            raise ValueError(f"{type(self).__name__}: expected a permutation of range({n}), got {permutation.tolist()}")
        self.register_buffer("permutation", permutation)
        self.register_buffer("inverse_permutation", torch.argsort(permutation))

    def _axis(self, x: Tensor) -> int:
        return x.dim() - len(self.event_shape) + self.dim

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = x.index_select(self._axis(x), self.permutation)
        return z, x.new_zeros(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = z.index_select(self._axis(z), self.inverse_permutation)
        return x, z.new_zeros(self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dim={self.dim}"


class Reverse(Permutation):
    """Reverse the order of one event axis (features, or channels of an image); log-det 0.

    Args:
        event_shape: shape of one event.
        dim: event axis to reverse.

    Example:
        >>> import torch
        >>> Reverse(3)(torch.tensor([[1.0, 2.0, 3.0]])).tolist()
        [[3.0, 2.0, 1.0]]
    """

    def __init__(self, event_shape: int | Sequence[int], *, dim: int = 0) -> None:
        shape = (event_shape,) if isinstance(event_shape, int) else tuple(event_shape)
        n = shape[dim] if -len(shape) <= dim < len(shape) else 1
        super().__init__(event_shape, torch.arange(n - 1, -1, -1), dim=dim)
