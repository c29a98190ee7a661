r"""NanoFlow-style parameter sharing: one conditioner network for all steps of a flow.

NanoFlow (Lee, Kim, Yoon 2020) replaces the K separate conditioner networks of K flow steps by a
single shared density estimator. Each step keeps only cheap private parts: a learned
**flow-indication embedding** :math:`e_k` fed to the shared network with its input, and a
channel-wise multiplicative **gate** :math:`g_k = e^{\gamma_k}` (initialised at 1) on its output:

.. math:: \theta_k(x_b, c) = g_k \odot \text{net}\big([x_b, e_k, c]\big).

The parameter count is that of one network plus :math:`K\cdot(E + P n)` for the embeddings and
gates, so it grows only marginally with the number of steps. Every step remains an exact
bijection (its conditioner reads only the kept part). The shared module is registered under every
step, so ``state_dict`` lists it once per step (the same tensors), and ``parameters()`` counts it once.

References:
    Lee, Kim, Yoon (2020), "NanoFlow: Scalable Normalizing Flows with Sublinear Parameter
    Complexity", NeurIPS, arXiv:2006.06280.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["StepConditioner"]


class StepConditioner(nn.Module):
    """One step's view of a shared conditioner: its own embedding and output gate, the shared network.

    For vector events the embedding is a learned vector ``(E,)`` concatenated to the input's last
    axis; for images it is a learned map ``(E, H, W)`` concatenated as extra input channels (as in
    NanoFlow's Glow), and the gate is per output channel.

    Args:
        shared: the shared network, called as ``shared(inputs, context)`` on inputs with ``E`` more
            features/channels than the step's own input (e.g. an :class:`~flows.nn.MLP` or
            :class:`~flows.nn.ConvNet` built with that width; its last layer zero-initialised so
            that every step starts at the identity).
        embedding: ``E`` for vectors, or the embedding map's shape ``(E, H, W)`` for images.
        out_features: output width of the shared network (vectors), or its output channels for
            images when ``embedding`` is a map.
        generator: random generator for the embedding's initialisation (N(0, 1)).

    Example:
        >>> import torch
        >>> from flows.nn import MLP
        >>> net = MLP(3 + 4, 6, hidden=(16,), zero_init=False)
        >>> steps = [StepConditioner(net, 4, 6) for _ in range(3)]
        >>> steps[0](torch.randn(5, 3)).shape, steps[0].shared is steps[2].shared
        (torch.Size([5, 6]), True)
    """

    def __init__(
        self,
        shared: nn.Module,
        embedding: int | tuple[int, ...],
        out_features: int,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        shape = (embedding,) if isinstance(embedding, int) else tuple(embedding)
        if not shape or any(not isinstance(n, int) or n < 1 for n in shape):
            raise ValueError(f"StepConditioner: expected an embedding width >= 1, got {embedding}")
        self.shared = shared
        self.embedding = nn.Parameter(torch.randn(shape, generator=generator))
        self.log_gate = nn.Parameter(torch.zeros((out_features,) + (1,) * (len(shape) - 1)))

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        ndim = self.embedding.dim()
        e = self.embedding.expand(*x.shape[: x.dim() - ndim], *self.embedding.shape)
        out = self.shared(torch.cat((x, e), dim=-ndim), context)
        return out * self.log_gate.exp()
