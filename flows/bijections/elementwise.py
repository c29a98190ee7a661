"""Elementwise transforms: free-parameter transformers (:class:`Affine`), Sigmoid, Logit and SoftClip."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import constraints

from flows._validation import check_number, under_vmap
from flows.bijections.base import Bijection, over_event, sum_event_dims
from flows.bijections.transformers import AffineTransformer, Transformer

__all__ = ["Affine", "Elementwise", "Logit", "Sigmoid", "SoftClip", "SqrtTails"]


class Elementwise(Bijection):
    r"""An elementwise transformer with its own free (unconditional) parameters, one set per element.

    :math:`z_i = \tau(x_i; \theta_i)`, :math:`\log|\det J| = \sum_i \log \tau'(x_i; \theta_i)`,
    where :math:`\theta` is a learnable tensor of shape ``(*event_shape, params_per_dim)``
    initialised at the transformer's identity.

    Args:
        event_shape: shape of one event.
        transformer: the elementwise map (e.g. :class:`~flows.bijections.transformers.AffineTransformer`).

    Example:
        >>> import torch
        >>> from flows.bijections.transformers import AffineTransformer
        >>> t = Elementwise(3, AffineTransformer(clamp=None))
        >>> torch.equal(t(torch.ones(2, 3)), torch.ones(2, 3))  # identity at initialisation
        True
    """

    def __init__(self, event_shape: int | Sequence[int], transformer: Transformer) -> None:
        super().__init__(event_shape)
        self.transformer = transformer
        identity = transformer.identity_params()
        self.params = nn.Parameter(identity.expand(*self.event_shape, identity.shape[-1]).clone())

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, ladj = self.transformer.forward_and_log_det(x, self.params)
        return z, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, ladj = self.transformer.inverse_and_log_det(z, self.params)
        return x, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))


class Affine(Elementwise):
    r"""Learnable elementwise affine map :math:`z = x \odot e^{s} + t` (identity at initialisation).

    * forward: :math:`z = x e^{s} + t`, :math:`\log|\det J| = \sum_i s_i`;
    * inverse: :math:`x = (z - t) e^{-s}`.

    Args:
        event_shape: shape of one event; ``s`` and ``t`` have this shape.
        shift: initial ``t`` (scalar or broadcastable to ``event_shape``).
        log_scale: initial ``s``.

    Example:
        >>> import torch
        >>> t = Affine(2, shift=1.0, log_scale=0.0)
        >>> t(torch.zeros(1, 2)).tolist()
        [[1.0, 1.0]]
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        *,
        shift: float | Tensor = 0.0,
        log_scale: float | Tensor = 0.0,
    ) -> None:
        super().__init__(event_shape, AffineTransformer(clamp=None))
        with torch.no_grad():
            self.params[..., 0] = torch.as_tensor(shift, dtype=self.params.dtype)
            self.params[..., 1] = torch.as_tensor(log_scale, dtype=self.params.dtype)


def _check_open_interval(x: Tensor, who: str, low_end: float = 0.0, high_end: float = 1.0) -> None:
    """Raise unless every entry of ``x`` lies strictly inside ``(low_end, high_end)`` (skipped under vmap)."""
    if not x.numel() or under_vmap(x):  # torch.func.vmap cannot branch on values
        return
    low, high = torch.aminmax(x.detach())
    if not (low > low_end and high < high_end):  # also catches NaN
        raise ValueError(
            f"{who}: expected inputs in ({low_end + 0.0:.6g}, {high_end:.6g}), "
            f"got values in [{low.item():.6g}, {high.item():.6g}]"
        )


class Logit(Bijection):
    r"""Logit preprocessing :math:`z = \operatorname{logit}(\alpha + (1 - 2\alpha) x)` for data in ``(0, 1)``.

    With :math:`u = \alpha + (1-2\alpha)x`:

    * forward: :math:`z = \log u - \log(1-u)`,
      :math:`\log|\det J| = \sum_i [\log(1-2\alpha) - \log u_i - \log(1-u_i)]`;
    * inverse: :math:`x = (\sigma(z) - \alpha)/(1-2\alpha)`,
      :math:`\log|\det J^{-1}| = \sum_i [\log\sigma(z_i) + \log\sigma(-z_i) - \log(1-2\alpha)]`.

    ``alpha > 0`` (RealNVP uses 0.05) keeps the map finite on the closed interval ``[0, 1]``; its
    domain is then :math:`(-a, 1 + a)`, :math:`a = \alpha/(1-2\alpha)`, exactly the image of the inverse,
    so samples drawn through the inverse are accepted back (unless the sigmoid saturates to 0 or 1 in
    floating point, for :math:`|z| \gtrsim 17` in float32, where the log-density is infinite anyway).

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803 (Section 4.1).

    Args:
        event_shape: shape of one event.
        alpha: squeeze towards the interior, ``0 <= alpha < 0.5``.
        check_domain: raise on inputs outside the domain (one reduction per call).

    Raises:
        ValueError: in the forward pass, for inputs outside ``(0, 1)`` (``(-a, 1 + a)`` when ``alpha > 0``).

    Example:
        >>> import torch
        >>> t = Logit(2)
        >>> t(torch.tensor([[0.5, 0.5]])).tolist()
        [[0.0, 0.0]]
    """

    def __init__(self, event_shape: int | Sequence[int], *, alpha: float = 0.0, check_domain: bool = True) -> None:
        super().__init__(event_shape)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha < 0.5:
            raise ValueError(f"Logit: expected 0 <= alpha < 0.5, got {alpha!r}")
        self.alpha = float(alpha)
        self.check_domain = check_domain

    @property
    def domain(self) -> constraints.Constraint:
        """``(-a, 1 + a)`` per element, ``a = alpha / (1 - 2 alpha)`` (declared closed: torch has no open interval)."""
        a = self.alpha / (1 - 2 * self.alpha)
        return over_event(constraints.interval(-a, 1 + a), len(self.event_shape))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.check_domain:
            # u = alpha + (1 - 2 alpha) x must lie in (0, 1): x in (-a, 1 + a), a = alpha / (1 - 2 alpha),
            # which contains [0, 1] for alpha > 0 and is exactly the image of the inverse.
            a = self.alpha / (1 - 2 * self.alpha)
            _check_open_interval(x, type(self).__name__, -a, 1 + a)
        u = self.alpha + (1 - 2 * self.alpha) * x if self.alpha else x
        log_u, log_1mu = torch.log(u), torch.log1p(-u)
        ladj = math.log1p(-2 * self.alpha) - log_u - log_1mu
        return log_u - log_1mu, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        ladj = F.logsigmoid(z) + F.logsigmoid(-z) - math.log1p(-2 * self.alpha)
        x = torch.sigmoid(z)
        if self.alpha:
            x = (x - self.alpha) / (1 - 2 * self.alpha)
        return x, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}"


class Sigmoid(Bijection):
    r"""Elementwise logistic sigmoid :math:`z = \sigma(x)` from the real line to ``(0, 1)``.

    * forward: :math:`\log|\det J| = \sum_i [\log\sigma(x_i) + \log\sigma(-x_i)]`;
    * inverse: :math:`x = \operatorname{logit}(z)`, defined for ``z`` in ``(0, 1)`` only.

    Args:
        event_shape: shape of one event.
        check_domain: raise on inverse inputs outside ``(0, 1)``.

    Raises:
        ValueError: in the inverse pass, for inputs outside ``(0, 1)``.

    Example:
        >>> import torch
        >>> Sigmoid(1)(torch.zeros(1, 1)).item()
        0.5
    """

    def __init__(self, event_shape: int | Sequence[int], *, check_domain: bool = True) -> None:
        super().__init__(event_shape)
        self.check_domain = check_domain

    @property
    def codomain(self) -> constraints.Constraint:
        """``(0, 1)`` per element."""
        return over_event(constraints.unit_interval, len(self.event_shape))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        ladj = F.logsigmoid(x) + F.logsigmoid(-x)
        return torch.sigmoid(x), sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.check_domain:
            _check_open_interval(z, type(self).__name__)
        log_z, log_1mz = torch.log(z), torch.log1p(-z)
        return log_z - log_1mz, sum_event_dims(-log_z - log_1mz, len(self.event_shape), self.batch_shape(z))


class SoftClip(Bijection):
    r"""Elementwise soft clip :math:`z = x / (1 + |x|/B)` from the real line onto ``(-B, B)``.

    * forward: :math:`\log|\det J| = -2 \sum_i \log(1 + |x_i|/B)`;
    * inverse: :math:`x = z / (1 - |z|/B)`, defined for ``|z| < B`` only.

    The identity near 0 (slope 1) and bounded far out: placed between polynomial layers (SOS
    polynomial flows), it keeps a stack of odd-degree polynomials from overflowing on the tails of
    standardised data, as zuko's ``SOSPF`` does with its ``SoftclipTransform``.

    Args:
        event_shape: shape of one event.
        bound: the bound ``B > 0``.

    Raises:
        ValueError: for a bound that is not a finite positive number; in the inverse pass, for
            inputs outside ``(-B, B)``.

    Example:
        >>> import torch
        >>> t = SoftClip(1, bound=2.0)
        >>> t(torch.tensor([[2.0]])).item(), t.inverse(torch.tensor([[1.0]])).item()
        (1.0, 2.0)
    """

    def __init__(self, event_shape: int | Sequence[int], *, bound: float = 10.0) -> None:
        super().__init__(event_shape)
        self.bound = check_number("SoftClip", "bound", bound, minimum=0, strict=True)

    @property
    def codomain(self) -> constraints.Constraint:
        """``(-B, B)`` per element."""
        return over_event(constraints.interval(-self.bound, self.bound), len(self.event_shape))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scale = 1 + x.abs() / self.bound
        ladj = -2 * torch.log(scale)
        return x / scale, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_open_interval(z, type(self).__name__, -self.bound, self.bound)
        shrink = 1 - z.abs() / self.bound
        ladj = -2 * torch.log(shrink)
        return z / shrink, sum_event_dims(ladj, len(self.event_shape), self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"bound={self.bound:g}"


class SqrtTails(Bijection):
    r"""Elementwise identity on ``[-B, B]`` with square-root tails: a bijection of the real line that tames outliers.

    With :math:`o = \max(|x| - B, 0)`,

    .. math:: z = \operatorname{sign}(x)\,\big(B + 2(\sqrt{1 + o} - 1)\big) \ (|x| > B), \qquad
              \log|\det J| = -\tfrac12 \sum_i \log(1 + o_i),

    the identity inside, and the inverse :math:`x = \operatorname{sign}(z)\big(B + (1 + (|z| - B)/2)^2
    - 1\big)` outside. The map is :math:`C^1` (slope 1 on both sides of :math:`\pm B`) and onto
    :math:`\mathbb{R}`, unlike :class:`SoftClip`, whose image is ``(-B, B)``. Placed between
    polynomial layers (:class:`~flows.architectures.monotone.SOSPF`) it does what zuko's soft clips
    do there: a point that one layer sends far out is compressed before the next layer sees it, and
    the flow stays a bijection of the real line. The tails are square roots rather than logarithms
    so that the inverse grows only quadratically: a latent far beyond ``B`` (an untrained flow's
    sample) keeps a finite preimage that the next numerical inverse can bracket.

    Args:
        event_shape: shape of one event.
        bound: the bound ``B > 0``.

    Raises:
        ValueError: for a bound that is not a finite positive number.

    Example:
        >>> import torch
        >>> t = SqrtTails(1, bound=2.0)
        >>> x = torch.tensor([[1.5], [5.0]])
        >>> t(x).squeeze(-1).tolist(), t.inverse(t(x)).allclose(x)
        ([1.5, 4.0], True)
    """

    def __init__(self, event_shape: int | Sequence[int], *, bound: float = 10.0) -> None:
        super().__init__(event_shape)
        self.bound = check_number("SqrtTails", "bound", bound, minimum=0, strict=True)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        over = (x.abs() - self.bound).clamp_min(0)
        root = torch.sqrt(1 + over)
        z = torch.where(over > 0, torch.sign(x) * (self.bound + 2 * (root - 1)), x)
        return z, sum_event_dims(-torch.log(root), len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        root = 1 + (z.abs() - self.bound).clamp_min(0) / 2
        x = torch.where(root > 1, torch.sign(z) * (self.bound + root.square() - 1), z)
        return x, sum_event_dims(torch.log(root), len(self.event_shape), self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"bound={self.bound:g}"
