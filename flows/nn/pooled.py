"""Pooled-statistics conditioner for images (:class:`PooledMLP`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows.nn.mlp import MLP

__all__ = ["PooledMLP"]


class PooledMLP(nn.Module):
    r"""Per-channel statistics pooled over pixels, then an MLP: ``(*, C_in, H, W) -> (*, C_out, H, W)``.

    Each sample's channels are summarised by their mean and standard deviation over the pixels,
    :math:`(\bar x_c, \sqrt{\operatorname{var}_{hw}(x_c) + \epsilon})`, and an :class:`MLP` maps these
    ``2·C_in`` numbers (and the context) to ``C_out`` values that are the same at every pixel (the
    output is an expanded view). Per-sample pooling keeps samples independent. The last layer is
    zero-initialised by default.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        hidden: hidden widths of the MLP.
        context: width of a vector context ``(*batch, context)`` (0 for none).
        activation: nonlinearity of the MLP.
        zero_init: zero the last layer.
        eps: added to the variance before the square root.

    Example:
        >>> import torch
        >>> net = PooledMLP(2, 3, hidden=(8,))
        >>> out = net(torch.randn(4, 2, 5, 5))
        >>> out.shape, bool((out == out[..., :1, :1]).all())
        (torch.Size([4, 3, 5, 5]), True)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden: Sequence[int] = (32,),
        *,
        context: int = 0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        zero_init: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.eps = in_channels, out_channels, eps
        self.context_features = context
        self.mlp = MLP(
            2 * in_channels, out_channels, hidden, context=context, activation=activation, zero_init=zero_init
        )

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if x.dim() < 3 or x.shape[-3] != self.in_channels:
            raise ValueError(
                f"PooledMLP: expected input of shape (*batch, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        var, mean = torch.var_mean(x, dim=(-2, -1), unbiased=False)
        stats = torch.cat((mean, (var + self.eps).sqrt()), dim=-1)
        out = self.mlp(stats, context) if self.context_features else self.mlp(stats)
        return out[..., None, None].expand(*out.shape, *x.shape[-2:])
