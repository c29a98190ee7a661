r"""A conditioner for inputs with angles: an :class:`~flows.nn.MLP` of :math:`(\cos\theta, \sin\theta)`.

Feeding angles to a network through their cosine and sine makes its output, and so a coupling
layer's density, :math:`2\pi`-periodic in every angle it conditions on (Rezende et al. 2020,
"Normalizing Flows on Tori and Spheres", ICML, arXiv:2002.02428).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows.nn.mlp import MLP

__all__ = ["CircularMLP"]


class CircularMLP(nn.Module):
    r"""MLP of ``(cos x_c, sin x_c, x_r)``: the angles ``x_c`` (``circular`` entries) embedded on the circle.

    Args:
        circular: boolean mask ``(in_features,)``, ``True`` for the angles.
        out_features: output width.
        hidden: hidden widths.
        context: context width (0 for none).
        activation: nonlinearity.

    Example:
        >>> import math, torch
        >>> net = CircularMLP(torch.tensor([True, False]), 3, hidden=(8,), zero_init=False)
        >>> x = torch.randn(4, 2)
        >>> torch.allclose(net(x), net(x + torch.tensor([2 * math.pi, 0.0])), atol=1e-5)
        True
    """

    def __init__(
        self,
        circular: Tensor | Sequence[bool],
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        *,
        context: int = 0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        zero_init: bool = True,
    ) -> None:
        super().__init__()
        circular = torch.as_tensor(circular, dtype=torch.bool)
        self.register_buffer("circular", circular, persistent=False)
        self.in_features, self.context_features = len(circular), context
        width = len(circular) + int(circular.sum())
        self.mlp = MLP(width, out_features, hidden, context=context, activation=activation, zero_init=zero_init)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        angles, rest = x[..., self.circular], x[..., ~self.circular]
        return self.mlp(torch.cat([angles.cos(), angles.sin(), rest], -1), context)
