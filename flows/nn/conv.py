"""Convolutional conditioner for images (:class:`ConvNet`) and image-context broadcasting."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._functorch import functorch_active

__all__ = ["ConvNet"]


def _expand_context(context: Tensor, x: Tensor, features: int, who: str) -> Tensor:
    """A context as ``(*batch, features, H, W)`` channels for an image ``x`` of shape ``(*batch, C, H, W)``.

    A vector context ``(*batch, features)`` is broadcast over the pixels; a map ``(*batch, features, H, W)``
    (``context.dim() == x.dim()``) is used as it is.
    """
    if not isinstance(context, Tensor):
        raise TypeError(f"{who}: expected context to be a torch.Tensor, got {type(context).__name__}")
    batch, pixels = x.shape[:-3], x.shape[-2:]
    if context.dim() == x.dim() and context.shape[-3] == features and context.shape[-2:] == pixels:
        return context.expand(*batch, features, *pixels)
    if context.dim() >= 1 and context.shape[-1] == features and context.dim() == x.dim() - 2:
        return context[..., None, None].expand(*batch, features, *pixels)
    raise ValueError(
        f"{who}: expected a context of shape (*batch, {features}) or (*batch, {features}, "
        f"{pixels[0]}, {pixels[1]}), got {tuple(context.shape)}"
    )


class ConvNet(nn.Module):
    """Convolutional conditioner for images: ``(*, in_channels, H, W) (+ context) -> (*, out_channels, H, W)``.

    Glow's coupling network: a ``kernel_size`` convolution, ``1×1`` convolutions between hidden
    layers, and a ``kernel_size`` convolution out, all with "same" zero padding, so the output has
    the input's height and width. The last layer is zero-initialised by default (the flow starts at
    the identity). Any number of leading batch dimensions is accepted. With ``hidden=()`` the net
    is a single convolution (the conditional prior of Glow's split).

    A context is concatenated to the input as extra channels: a vector ``(*batch, context)`` is
    broadcast over the pixels (class-conditional models), a map ``(*batch, context, H, W)``
    (a tensor with as many dimensions as the input) is used pixel by pixel (e.g. the
    conditioning image of a dequantizer).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        hidden: channels of the hidden layers.
        context: number of context channels (0 for none).
        kernel_size: odd kernel size of the first and last convolutions.
        activation: constructor of the nonlinearity after every hidden layer.
        zero_init: zero the weights and bias of the last layer.
        channels_last: run the convolutions in channels-last memory format (the weights and the
            input; faster on CPU with oneDNN, see ``docs/images.md``, and the layout GPU tensor
            cores prefer). The
            output then has channels-last strides, which no caller needs to know about.

    References:
        Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS,
        arXiv:1807.03039 (the coupling network NN()).

    Example:
        >>> import torch
        >>> net = ConvNet(2, 4, hidden=(8, 8), context=3)
        >>> net(torch.randn(5, 2, 6, 6), context=torch.randn(5, 3)).shape
        torch.Size([5, 4, 6, 6])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden: Sequence[int] = (64, 64),
        *,
        context: int = 0,
        kernel_size: int = 3,
        activation: Callable[[], nn.Module] = nn.ReLU,
        zero_init: bool = True,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if in_channels + context <= 0 or out_channels <= 0 or context < 0 or any(h <= 0 for h in hidden):
            raise ValueError(
                f"ConvNet: expected positive widths, got in_channels={in_channels}, context={context}, "
                f"hidden={tuple(hidden)}, out_channels={out_channels}"
            )
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"ConvNet: expected an odd integer kernel_size >= 1, got {kernel_size!r}")
        self.in_channels, self.out_channels, self.context_features = in_channels, out_channels, context
        widths = [in_channels + context, *hidden, out_channels]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(widths)):
            outer = i == 0 or i == len(widths) - 2
            k = kernel_size if outer else 1
            layers.append(nn.Conv2d(a, b, k, padding=k // 2))
            if i < len(widths) - 2:
                layers.append(activation())
        if zero_init:
            nn.init.zeros_(layers[-1].weight)
            nn.init.zeros_(layers[-1].bias)
        self.net = nn.Sequential(*layers)
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if x.dim() < 3 or x.shape[-3] != self.in_channels:
            raise ValueError(
                f"ConvNet: expected input of shape (*batch, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        if self.context_features:
            if context is None:
                raise ValueError(f"ConvNet: expected a context with {self.context_features} features, got None")
            context = _expand_context(context, x, self.context_features, "ConvNet")
            x = torch.cat((x, context.to(x.dtype)), dim=-3) if self.in_channels else context
        elif context is not None:
            raise ValueError("ConvNet: this network is unconditional (context=0), got a context tensor")
        batch = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        if self.channels_last and not functorch_active():  # vmap: no memory formats
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.net(x)
        return out.reshape(*batch, *out.shape[-3:])
