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

    Args:
        shared: the shared network, called as ``shared(inputs, context)`` on inputs of width
            ``in_features + embedding`` (e.g. an :class:`~flows.nn.MLP` built with that width; its
            last layer zero-initialised so that every step starts at the identity).
        embedding: width ``E`` of the flow-indication embedding.
        out_features: output width of the shared network (gated channel-wise).
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
        self, shared: nn.Module, embedding: int, out_features: int, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        if embedding < 1:
            raise ValueError(f"StepConditioner: expected an embedding width >= 1, got {embedding}")
        self.shared = shared
        self.embedding = nn.Parameter(torch.randn(embedding, generator=generator))
        self.log_gate = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        e = self.embedding.expand(*x.shape[:-1], self.embedding.shape[0])
        out = self.shared(torch.cat((x, e), dim=-1), context)
        return out * self.log_gate.exp()
