r"""Masked autoregressive transforms: a MADE conditioner driving any elementwise :class:`Transformer`.

The forward (density) direction is one network pass,

.. math:: z_i = \tau(x_i;\ \theta_i(x_{<i}, c)), \qquad \log|\det J| = \sum_i \log \tau'(x_i; \theta_i),

because the Jacobian is triangular in the autoregressive order. The inverse solves for
:math:`x` one feature at a time (``D`` sequential steps, see :meth:`flows.nn.MADE.solve`).
Wrapping the transform in :class:`~flows.bijections.base.Inverse` swaps the costs (IAF: one-pass
sampling, sequential density evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows.bijections.base import Bijection
from flows.bijections.transformers import Transformer
from flows.nn import MADE

__all__ = ["MaskedAutoregressive"]


class MaskedAutoregressive(Bijection):
    r"""Masked autoregressive transform: ``transformer`` × MADE conditioner, for vector events.

    * forward (data → latent): :math:`z_i = \tau(x_i; \theta_i(x_{<i}, c))` in one MADE pass,
      :math:`\log|\det J| = \sum_i \log \tau'(x_i; \theta_i)`;
    * inverse: :math:`x_i = \tau^{-1}(z_i; \theta_i(x_{<i}, c))` for the features in the
      autoregressive order, ``D`` steps that together cost one MADE pass (each hidden unit is
      computed once, as soon as its inputs are known), :math:`\log|\det J^{-1}| = -\sum_i \log \tau'`.

    ":math:`< i`" is with respect to ``order``. With any transformer (affine for MAF/IAF,
    rational-quadratic splines for NSF) and identity-initialised (zero last layer) MADE, the
    transform starts at the identity.

    References:
        Papamakarios, Pavlakou, Murray (2017), "Masked Autoregressive Flow for Density Estimation",
        NeurIPS, arXiv:1705.07057. Kingma, Salimans, Jozefowicz, Chen, Sutskever, Welling (2016),
        "Improved Variational Inference with Inverse Autoregressive Flow", NeurIPS,
        arXiv:1606.04934. Durkan, Bekasov, Murray, Papamakarios (2019), "Neural Spline Flows",
        NeurIPS, arXiv:1906.04032.

    Args:
        features: number of features ``D``.
        context: context width (0 for an unconditional transform).
        transformer: the elementwise map (e.g.
            :class:`~flows.bijections.transformers.AffineTransformer`,
            :class:`~flows.bijections.splines.RationalQuadraticSpline`).
        hidden: hidden widths of the default MADE.
        order: autoregressive order of the features (a permutation of ``range(D)``).
        hidden_degrees, residual, dropout, activation: passed to :class:`~flows.nn.MADE`.
        conditioner: a :class:`~flows.nn.MADE` to use instead of the default one (its
            ``out_features`` must be ``D · transformer.params_per_dim``).

    Raises:
        ValueError: for a conditioner of the wrong size.

    Example:
        >>> import torch
        >>> from flows.bijections.transformers import AffineTransformer
        >>> t = MaskedAutoregressive(3, transformer=AffineTransformer(), hidden=(16,))
        >>> x = torch.randn(4, 3)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x), ladj.shape
        (True, torch.Size([4]))
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transformer: Transformer,
        hidden: Sequence[int] = (64, 64),
        order: Sequence[int] | Tensor | None = None,
        hidden_degrees: str | Sequence[Tensor] = "sequential",
        residual: bool = False,
        dropout: float = 0.0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        conditioner: MADE | None = None,
    ) -> None:
        super().__init__(features)
        if len(self.event_shape) != 1 or self.event_shape[0] is None:
            raise ValueError(f"MaskedAutoregressive: expected a vector event (features: int), got {features!r}")
        d, p = self.event_shape[0], transformer.params_per_dim
        if conditioner is None:
            conditioner = MADE(
                d,
                d * p,
                hidden,
                context=context,
                order=order,
                hidden_degrees=hidden_degrees,
                residual=residual,
                dropout=dropout,
                activation=activation,
            )
        elif not isinstance(conditioner, MADE) or conditioner.in_features != d or conditioner.out_features != d * p:
            raise ValueError(
                f"MaskedAutoregressive: expected a MADE conditioner with {d} inputs and {d * p} outputs "
                f"({p} parameters per feature), got {conditioner!r}"
            )
        self.transformer = transformer
        self.conditioner = conditioner
        self.context_features = conditioner.context_features

    def _params(self, params: Tensor) -> Tensor:
        """Parameter-major MADE outputs ``(*, P·D)`` → ``(*, D, P)`` (a view)."""
        return params.unflatten(-1, (self.transformer.params_per_dim, self.event_shape[0])).transpose(-1, -2)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        params = self._params(self.conditioner(x, context))
        z, ladj = self.transformer.forward_and_log_det(x, params)
        return z, ladj.sum(-1)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = self.batch_shape(z)
        terms: list[Tensor] = []

        def step(i: int, params: Tensor) -> Tensor:
            x_i, ladj_i = self.transformer.inverse_and_log_det(z[..., i], params)
            terms.append(ladj_i)
            return x_i

        x = self.conditioner.solve(step, batch, context, dtype=z.dtype, device=z.device)
        return x, torch.stack(terms, -1).sum(-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, context={self.context_features}"
