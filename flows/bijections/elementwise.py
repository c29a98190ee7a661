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

__all__ = ["Affine", "Elementwise", "Logit", "Sigmoid", "SoftClip"]


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
    r"""Elementwise soft clip onto ``(-B, B)``, or onto the real line with a small far-out slope and an identity knee.

    With the knee :math:`k \in [0, B)`, :math:`c = B - k`, the slope :math:`s \in [0, 1)` and the
    overshoot :math:`o = \max(|x| - k, 0)`,

    .. math:: z = \operatorname{sign}(x) \Big(\min(|x|, k) + (1 - s)\,\frac{c\, o}{c + o} + s\, o\Big),
              \qquad \log|\det J| = \sum_i \log\Big(\frac{(1 - s)\, c^2}{(c + o_i)^2} + s\Big),

    so ``k = s = 0`` is zuko's soft clip :math:`x / (1 + |x|/B)` onto ``(-B, B)``. The map is the
    identity on ``[-k, k]``, :math:`C^1` (slope 1 on both sides of the knee) and far out grows like
    :math:`\pm(B - s c) + s x`. The inverse is closed form: for :math:`|z| > k`, with
    :math:`w = |z| - k`, the overshoot is the positive root of :math:`s o^2 + (c - w) o - w c = 0`,
    evaluated without cancellation (:math:`o = w c / (c - w)` when ``s = 0``, defined for
    ``|z| < B`` only).

    Placed between polynomial layers (SOS polynomial flows) it keeps a stack of odd-degree
    polynomials from overflowing, and a point that one layer sends far out from riding the next
    layer's steep end slope, as zuko's ``SOSPF`` does with its ``SoftclipTransform``
    (``k = s = 0``). With ``s = 0`` the image is the bounded box, so a flow built on it is not onto
    the real line and latents outside it have no preimage; a small slope (``1e-2``: a coordinate at
    ``x`` far out reaches about ``B + x/100``) keeps the squeeze and makes the map a bijection of the
    real line, and a knee leaves the bulk of the data untouched.

    Args:
        event_shape: shape of one event.
        bound: the bound ``B > 0`` (the level of the squeeze).
        slope: the far-out slope ``0 <= s < 1`` (``0``: the image is ``(-B, B)``).
        knee: the half-width ``0 <= k < B`` of the identity region.

    Raises:
        ValueError: for a bound that is not a finite positive number, a slope outside ``[0, 1)`` or
            a knee outside ``[0, B)``; in the inverse pass with ``slope=0``, for inputs outside ``(-B, B)``.

    Example:
        >>> import torch
        >>> t = SoftClip(1, bound=2.0)
        >>> t(torch.tensor([[2.0]])).item(), t.inverse(torch.tensor([[1.0]])).item()
        (1.0, 2.0)
        >>> onto = SoftClip(1, bound=2.0, slope=0.5, knee=1.0)
        >>> onto(torch.tensor([[0.5], [2.0]])).squeeze(-1).tolist(), onto.inverse(torch.tensor([[1.75]])).item()
        ([0.5, 1.75], 2.0)
    """

    def __init__(
        self, event_shape: int | Sequence[int], *, bound: float = 10.0, slope: float = 0.0, knee: float = 0.0
    ) -> None:
        super().__init__(event_shape)
        self.bound = check_number("SoftClip", "bound", bound, minimum=0, strict=True)
        self.slope = check_number("SoftClip", "slope", slope, minimum=0)
        if self.slope >= 1:
            raise ValueError(f"SoftClip: expected slope in [0, 1), got {slope!r}")
        self.knee = check_number("SoftClip", "knee", knee, minimum=0)
        if self.knee >= self.bound:
            raise ValueError(f"SoftClip: expected knee in [0, bound) = [0, {self.bound:g}), got {knee!r}")

    @property
    def codomain(self) -> constraints.Constraint:
        """``(-B, B)`` per element, the real line with a slope."""
        if self.slope > 0:
            return over_event(constraints.real, len(self.event_shape))
        return over_event(constraints.interval(-self.bound, self.bound), len(self.event_shape))

    def _log_slope(self, over: Tensor) -> Tensor:
        c, s = self.bound - self.knee, self.slope
        return torch.log((1 - s) * (c / (c + over)) ** 2 + s)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        c, s = self.bound - self.knee, self.slope
        # the same map in few operations: with v = x - clamp(x, -k, k) (the signed overshoot, |v| = o)
        # and t = c / (c + o), z = x - (1 - s) v o / (c + o) = x - (1 - s) v (1 - t)
        v = x - x.clamp(-self.knee, self.knee) if self.knee else x
        t = c / (v.abs() + c)
        z = x - v * ((1 - t) * (1 - s))
        return z, sum_event_dims(torch.log(t * t * (1 - s) + s), len(self.event_shape), self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        c, s = self.bound - self.knee, self.slope
        tiny = torch.finfo(z.dtype).tiny
        w = (z.abs() - self.knee).clamp_min(0)
        if s == 0:
            _check_open_interval(z, type(self).__name__, -self.bound, self.bound)
            over = w * c / (c - w).clamp_min(tiny)
        else:
            b = c - w
            root = torch.sqrt(b * b + 4 * s * w * c)
            positive = b > 0
            big = torch.where(positive, b + root, root - b)  # no cancellation on either side
            over = torch.where(positive, 2 * w * c / big.clamp_min(tiny), big / (2 * s))
        x = torch.sign(z) * (z.abs() - w + over)
        return x, sum_event_dims(-self._log_slope(over), len(self.event_shape), self.batch_shape(z))

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v:g}" for k, v in (("slope", self.slope), ("knee", self.knee)) if v > 0)
        return f"bound={self.bound:g}{extra}"
