"""Fully connected conditioner: :class:`MLP`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_context

__all__ = ["MLP"]


class MLP(nn.Module):
    """Fully connected network ``in_features (+ context) -> hidden... -> out_features``.

    The context, when there is one, is concatenated to the input (after broadcasting its batch
    dimensions to the input's). The last layer is zero-initialised by default, so that a flow
    built on this conditioner starts at the identity map.

    Args:
        in_features: input width.
        out_features: output width.
        hidden: widths of the hidden layers.
        context: width of the context input (0 for none).
        activation: constructor of the nonlinearity placed after every hidden layer.
        zero_init: zero the weights and bias of the last layer.

    Example:
        >>> import torch
        >>> net = MLP(3, 4, hidden=(8,), context=2)
        >>> net(torch.randn(5, 3), context=torch.randn(5, 2)).shape
        torch.Size([5, 4])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        *,
        context: int = 0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        zero_init: bool = True,
    ) -> None:
        super().__init__()
        if in_features + context <= 0 or out_features <= 0 or context < 0 or any(h <= 0 for h in hidden):
            raise ValueError(
                f"MLP: expected positive widths and context >= 0, got in_features={in_features}, context={context}, "
                f"hidden={tuple(hidden)}, out_features={out_features}"
            )
        self.in_features, self.out_features, self.context_features = in_features, out_features, context
        widths = [in_features + context, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                act = activation()
                if type(act) is nn.ReLU:  # a Linear's backward does not need its output: rectify it in place
                    act.inplace = True
                layers.append(act)
        if zero_init:
            nn.init.zeros_(layers[-1].weight)
            nn.init.zeros_(layers[-1].bias)
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.context_features:
            check_context(context, self.context_features, "MLP")
            context = context.expand(*x.shape[:-1], self.context_features)
            x = torch.cat((x, context), dim=-1) if self.in_features else context
        return self.net(x)
