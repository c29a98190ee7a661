r"""Block neural autoregressive transform (BNAF): one monotone, triangular network with an exact log-det.

The network :math:`x \mapsto h^{(1)} \mapsto \dots \mapsto y` has ``D`` blocks per layer (block
``i`` of width ``k_l`` "belongs" to feature ``i``); every weight matrix is block lower triangular
with **positive** diagonal blocks (:math:`\exp` of free parameters, then weight-normalised per
row), and the activations are :math:`\tanh`. So :math:`y_i` depends on :math:`x_{\le i}` only and
increases with :math:`x_i`: the Jacobian is lower triangular with positive diagonal

.. math:: \frac{\partial y_i}{\partial x_i} = W^{(L)}_{ii}\, \Phi^{(L-1)}_i W^{(L-1)}_{ii} \cdots
          \Phi^{(1)}_i W^{(1)}_{ii}, \qquad \Phi^{(l)}_i = \operatorname{diag}(\tanh'(a^{(l)}_i)),

a product of positive blocks computed in log-space (``logsumexp`` matrix products), so
:math:`\log|\det J| = \sum_i \log \partial y_i / \partial x_i` costs one pass. The output is gated
with the input, :math:`z = s\,y + (1 - s)\,x` with :math:`s = \sigma(\alpha)` (the gated residual
of De Cao et al.), which keeps the map onto :math:`\mathbb{R}` (:math:`y` alone is bounded).

The inverse has no closed form: feature by feature, :math:`x_i` solves the increasing scalar
equation :math:`z_i = F_i(x_{<i}, x_i)` by :func:`~flows.bijections.numerical_inverse.monotone_inverse`
(``D`` sequential solves, each a few network passes; implicit gradients).

References:
    De Cao, Aziz, Titov (2019), "Block Neural Autoregressive Flow", UAI, arXiv:1904.04676.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection
from flows.bijections.numerical_inverse import monotone_inverse

__all__ = ["BlockAutoregressive"]


def _log_one_minus_tanh_squared(u: Tensor) -> Tensor:
    r""":math:`\log(1 - \tanh^2 u) = 2(\log 2 - |u| - \log(1 + e^{-2|u|}))`, stable for any ``u``."""
    a = u.abs()
    return 2 * (math.log(2) - a - F.softplus(-2 * a))


class _BlockLinear(nn.Module):
    """``D`` blocks of ``a`` inputs to ``D`` blocks of ``b`` outputs, block lower triangular, positive diagonal."""

    def __init__(self, features: int, a: int, b: int) -> None:
        super().__init__()
        self.features, self.a, self.b = features, a, b
        rows = torch.arange(features * b) // b
        cols = torch.arange(features * a) // a
        self.register_buffer("diagonal", rows[:, None] == cols[None, :], persistent=False)
        self.register_buffer("lower", rows[:, None] > cols[None, :], persistent=False)
        weight = torch.empty(features * b, features * a)
        nn.init.uniform_(weight, -1 / math.sqrt(features * a), 1 / math.sqrt(features * a))
        self.weight = nn.Parameter(weight)
        self.log_gain = nn.Parameter(torch.rand(features * b, 1).log())
        self.bias = nn.Parameter(torch.zeros(features * b))

    def weights(self) -> tuple[Tensor, Tensor]:
        """The effective weight ``(D·b, D·a)`` and the log of its diagonal blocks ``(D, b, a)``."""
        w = torch.where(self.diagonal, self.weight.exp(), self.weight * self.lower)
        log_norm = 0.5 * torch.log(w.square().sum(-1, keepdim=True))  # log ‖row‖ (> 0: the diagonal block)
        scale = self.log_gain - log_norm
        log_diag = (self.weight + scale)[self.diagonal].reshape(self.features, self.b, self.a)
        return w * scale.exp(), log_diag


class BlockAutoregressive(Bijection):
    r"""Block neural autoregressive transform :math:`z = \sigma(\alpha)\, y(x) + (1 - \sigma(\alpha))\, x`.

    * forward: one pass of the block-triangular network, :math:`\log|\det J| = \sum_i
      \log(\sigma(\alpha)\, \partial y_i/\partial x_i + 1 - \sigma(\alpha))` (module docstring);
    * inverse: ``D`` sequential scalar monotone solves (numerical, implicit gradients).

    The autoregressive order is the feature order (``0`` first); alternate it with
    :class:`~flows.bijections.permutation.Reverse` when stacking.

    References:
        De Cao, Aziz, Titov (2019), "Block Neural Autoregressive Flow", UAI, arXiv:1904.04676.

    Args:
        features: number of features ``D``.
        context: context width (0 for none); the context enters the first hidden layer through
            an unconstrained linear map.
        hidden: hidden block sizes ``k_l`` per feature (layer ``l`` is ``D · k_l`` wide).

    Raises:
        ValueError: for a non-vector event or bad hidden sizes.

    Example:
        >>> import torch
        >>> t = BlockAutoregressive(3, hidden=(4,)).double()
        >>> x = torch.randn(5, 3, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x), ladj.shape
        (True, torch.Size([5]))
    """

    def __init__(self, features: int, context: int = 0, *, hidden: Sequence[int] = (8, 8)) -> None:
        super().__init__(features)
        if len(self.event_shape) != 1 or self.event_shape[0] is None:
            raise ValueError(f"BlockAutoregressive: expected a vector event (features: int), got {features!r}")
        if (
            isinstance(hidden, (str, bytes))
            or not isinstance(hidden, Sequence)
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)
        ):
            raise ValueError(f"BlockAutoregressive: expected hidden to be a sequence of positive ints, got {hidden!r}")
        d = self.event_shape[0]
        sizes = [1, *hidden, 1]
        self.layers = nn.ModuleList(_BlockLinear(d, sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))
        self.context_net = nn.Linear(context, d * sizes[1], bias=False) if context else None
        self.gate = nn.Parameter(torch.zeros(()))
        self.context_features = context

    def _network(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(z, log ∂z_i/∂x_i)``, both ``(*batch, D)``."""
        d = self.event_shape[0]
        h = x
        log_j = torch.zeros(*x.shape, 1, dtype=x.dtype, device=x.device)  # (*, D, k) blocks of ∂h/∂x_i
        for index, layer in enumerate(self.layers):
            w, log_diag = layer.weights()
            h = F.linear(h, w, layer.bias)
            if index == 0 and self.context_net is not None and context is not None:
                h = h + self.context_net(context)
            log_j = torch.logsumexp(log_diag + log_j.unsqueeze(-2), -1)  # (*, D, b)
            if index < len(self.layers) - 1:
                log_j = log_j + _log_one_minus_tanh_squared(h).unflatten(-1, (d, layer.b))
                h = torch.tanh(h)
        log_s, log_one_minus_s = F.logsigmoid(self.gate), F.logsigmoid(-self.gate)
        z = log_s.exp() * h + log_one_minus_s.exp() * x
        return z, torch.logaddexp(log_s + log_j.squeeze(-1), log_one_minus_s)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, log_d = self._network(x, context)
        return z, log_d.sum(-1)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        d = self.event_shape[0]
        columns: list[Tensor] = []
        for i in range(d):
            known = columns.copy()

            def fn(t: Tensor, i: int = i, known: list[Tensor] = known) -> tuple[Tensor, Tensor]:
                rest = torch.zeros(*t.shape, d - i - 1, dtype=t.dtype, device=t.device)
                x = torch.cat([torch.stack(known, -1) if known else rest[..., :0], t.unsqueeze(-1), rest], -1)
                out, log_d = self._network(x, context)
                return out[..., i], log_d[..., i].exp()

            columns.append(monotone_inverse(fn, z[..., i], who="BlockAutoregressive"))
        x = torch.stack(columns, -1)
        return x, -self._network(x, context)[1].sum(-1)

    def extra_repr(self) -> str:
        blocks = [layer.b for layer in self.layers[:-1]]
        return f"{super().extra_repr()}, context={self.context_features}, hidden={tuple(blocks)}"
