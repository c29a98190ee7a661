"""Time-conditioned MLP vector field with hand-written Jacobian-vector products (:class:`TimeMLP`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_context, check_count
from flows.nn.mlp import MLP

__all__ = ["TIME_MLP_ACTIVATIONS", "TimeMLP"]


def _activation_and_derivative(layer: nn.Module, h: Tensor) -> tuple[Tensor, Tensor]:
    """``(σ(h), σ'(h))`` for the elementwise activations :class:`TimeMLP` can differentiate by hand."""
    if isinstance(layer, nn.Tanh):
        a = torch.tanh(h)
        return a, 1 - a.square()
    if isinstance(layer, nn.Softplus):
        # σ(βh) is also the slope past the linear threshold, to within e^{-threshold}
        return layer(h), torch.sigmoid(h * layer.beta) if layer.beta != 1 else torch.sigmoid(h)
    if isinstance(layer, nn.ELU):
        a = layer(h)
        return a, torch.where(h > 0, torch.ones_like(h), a + layer.alpha)
    if isinstance(layer, nn.SiLU):
        s = torch.sigmoid(h)
        return h * s, s * (1 + h * (1 - s))
    if isinstance(layer, nn.Sigmoid):
        a = torch.sigmoid(h)
        return a, a * (1 - a)
    raise TypeError(f"TimeMLP: no derivative known for {type(layer).__name__}")


TIME_MLP_ACTIVATIONS = (nn.Tanh, nn.Softplus, nn.ELU, nn.SiLU, nn.Sigmoid)


class TimeMLP(nn.Module):
    r"""Time-dependent vector field :math:`f(t, z; c)` for continuous flows, with fused Jacobian-vector products.

    The network is an :class:`MLP` applied to
    :math:`[z, \cos(\pi k t), \sin(\pi k t)]_{k=1..\text{freqs}}` (zuko's time embedding; with
    ``freqs=0``, to :math:`[z, t]`), and the context ``c`` when there is one. The default ``freqs=1``
    is periodic in :math:`t` with period 2, ample for the usual interval ``[0, 1]``. Time features
    of high frequency make the field vary fast in :math:`t` and the solver take more steps
    (``docs/continuous.md`` compares ``freqs`` 0, 1 and 3 on two moons).

    The time ``t`` is a scalar (one time for every state, as in an ODE solve) or a tensor of shape
    ``(N,)`` with one time per state ``z`` of shape ``(N, D)`` (flow-matching regression, see
    :class:`~flows.train.FlowMatching`).

    Besides ``forward(t, z, context)``, :meth:`jvp` returns the field together with
    :math:`J v = (\partial f/\partial z) v` for a stack of tangents :math:`v`, propagated through
    the layers in forward mode by hand (``v ← W v`` through a linear layer, ``v ← σ'(h) ⊙ v``
    through an activation). This is what makes :class:`~flows.CNF` cheap: the exact trace
    :math:`\operatorname{tr} J = \sum_i (J e_i)_i` costs one pass with ``D`` tangents and the
    Hutchinson estimate :math:`\varepsilon^\top J \varepsilon` one pass with one tangent, both
    differentiable with ordinary first-order backpropagation (no double backward) and available
    without building a graph at evaluation time.

    The activation must be smooth (the solver adapts its steps to the field's smoothness; ``ReLU``
    is refused) and one of ``nn.Tanh``, ``nn.Softplus``, ``nn.ELU``, ``nn.SiLU``, ``nn.Sigmoid``.
    ``ELU`` has a discontinuous second derivative, which costs adaptive solvers extra steps at
    tight tolerances. Unlike the coupling conditioners, the last layer keeps PyTorch's default
    initialisation (as in FFJORD and zuko): a zero last layer trained slower (measurements:
    ``docs/continuous.md``).

    Args:
        features: dimension ``D`` of the state ``z``.
        context: width of the context input (0 for none).
        hidden: widths of the hidden layers.
        activation: constructor of the nonlinearity (one of the classes above).
        freqs: number of time frequencies (``2 · freqs`` time features; 0 feeds ``t`` itself).
        zero_init: zero the weights and bias of the last layer (the flow starts at the identity).

    Example:
        >>> import torch
        >>> field = TimeMLP(3, hidden=(16,))
        >>> t, z = torch.tensor(0.5), torch.randn(4, 3)
        >>> f, jv = field.jvp(t, z, torch.eye(3)[:, None, :])  # the three Jacobian columns
        >>> f.shape, jv.shape
        (torch.Size([4, 3]), torch.Size([3, 4, 3]))
        >>> jacobian = torch.func.jacrev(lambda v: field(t, v))(z[0])
        >>> torch.allclose(jv[:, 0, :].T, jacobian, atol=1e-6)
        True
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.Tanh,
        freqs: int = 1,
        zero_init: bool = False,
    ) -> None:
        super().__init__()
        check_count("TimeMLP", "features", features)
        check_count("TimeMLP", "freqs", freqs, minimum=0)
        if not hidden:
            raise ValueError("TimeMLP: expected at least one hidden layer, got hidden=()")
        self.features, self.context_features = features, context
        time_features = 2 * freqs if freqs else 1
        self.mlp = MLP(
            features + time_features, features, hidden, context=context, activation=activation, zero_init=zero_init
        )
        for layer in self.mlp.net:
            if not isinstance(layer, (nn.Linear, *TIME_MLP_ACTIVATIONS)):
                names = ", ".join(f"nn.{c.__name__}" for c in TIME_MLP_ACTIVATIONS)
                raise ValueError(f"TimeMLP: expected a smooth activation among {names}, got {type(layer).__name__}")
        self.register_buffer("freqs", torch.arange(1, freqs + 1, dtype=torch.get_default_dtype()) * math.pi)

    def _inputs(self, t: Tensor, z: Tensor, context: Tensor | None) -> Tensor:
        t = torch.as_tensor(t, dtype=z.dtype, device=z.device)
        per_sample = t.dim() == 1 and z.dim() == 2 and t.shape[0] == z.shape[0]
        if not (t.dim() == 0 or t.shape == (1,) or per_sample):
            raise ValueError(
                f"TimeMLP: expected a scalar time or one time per state, shape ({z.shape[0]},) for states of shape "
                f"{tuple(z.shape)}, got t of shape {tuple(t.shape)}"
            )
        t = t[..., None]  # (1,) for a scalar time, (N, 1) for per-sample times
        if self.freqs.numel():
            angles = t * self.freqs
            time = torch.cat((angles.cos(), angles.sin()), -1)
        else:
            time = t
        parts = [z, time.expand(*z.shape[:-1], time.shape[-1])]
        if self.context_features:
            check_context(context, self.context_features, "TimeMLP")
            parts.append(context.expand(*z.shape[:-1], self.context_features))
        return torch.cat(parts, dim=-1)

    def forward(self, t: Tensor, z: Tensor, context: Tensor | None = None) -> Tensor:
        """The field ``f(t, z; c)`` of shape ``(*batch, D)`` for ``z`` of shape ``(*batch, D)``.

        ``t`` is a scalar, or of shape ``(N,)`` (one time per state) when ``z`` has shape ``(N, D)``.
        """
        return self.mlp.net(self._inputs(t, z, context))

    def jvp(self, t: Tensor, z: Tensor, tangents: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The field and its Jacobian-vector products in one pass.

        Args:
            t: time, a scalar tensor or one time per state (shape ``(N,)``).
            z: states, shape ``(N, D)``.
            tangents: ``K`` stacked tangents, shape ``(K, N, D)`` or ``(K, 1, D)`` (shared by all states).
            context: context of shape ``(N, context)`` when the field is conditional.

        Returns:
            ``(f, Jv)`` of shapes ``(N, D)`` and ``(K, N, D)``.
        """
        layers = list(self.mlp.net)
        first = layers[0]
        h = first(self._inputs(t, z, context))
        v = tangents @ first.weight[:, : self.features].T
        for layer in layers[1:]:
            if isinstance(layer, nn.Linear):
                h = layer(h)
                v = v @ layer.weight.T
            else:
                h, derivative = _activation_and_derivative(layer, h)
                v = v * derivative
        return h, v
