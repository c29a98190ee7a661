r"""Monotone rational-quadratic splines (Durkan et al. 2019) as an elementwise :class:`Transformer`.

On ``[-B, B]`` the map is a piecewise rational-quadratic function through ``K + 1`` knots
:math:`(x_k, y_k)` with positive derivatives :math:`d_k` at the knots; outside it is the identity,
and the boundary derivatives are fixed to 1 so that the map and its derivative are continuous at
:math:`\pm B`. Raw parameters are ``3K - 1`` unconstrained numbers per element, so any conditioner
(coupling, MADE, free parameters) can drive it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from flows._validation import check_count, check_number, under_differentiation_transform
from flows.bijections._spline_autograd import BinEnds, SplineForward, forward_map, locate_autograd, log_derivative
from flows.bijections.transformers import Transformer

__all__ = ["MAX_BOUND", "RationalQuadraticSpline"]

MAX_BOUND = 1e30
"""The largest spline ``bound`` accepted: ``2B`` and the knot arithmetic stay finite in float32."""


class RationalQuadraticSpline(Transformer):
    r"""Monotone rational-quadratic spline on ``[-B, B]`` with identity tails.

    Raw parameters ``θ = (u^w, u^h, u^d)`` of shape ``(*, 3K - 1)`` (last axis, in this order: ``K``
    widths, ``K`` heights, ``K - 1`` interior derivatives) give

    * bin widths :math:`w = m_w + (1 - K m_w)\operatorname{softmax}(u^w) \cdot 2B`, heights
      likewise with :math:`m_h`, so the knots :math:`x_k, y_k` run from :math:`-B` to :math:`B`;
    * interior derivatives :math:`d_k = m_d + \operatorname{softplus}(u^d_k + c)` with
      :math:`c = \log(e^{1 - m_d} - 1)`, so that :math:`d_k = 1` at :math:`u^d_k = 0`;
      the boundary derivatives are :math:`d_0 = d_K = 1`.

    All-zero raw parameters give the identity map. In bin :math:`k` with
    :math:`s_k = h_k / w_k` and :math:`\xi = (x - x_k)/w_k \in [0, 1]`:

    .. math::

        y = y_k + \frac{h_k\,[s_k \xi^2 + d_k \xi(1-\xi)]}{s_k + (d_{k+1} + d_k - 2 s_k)\,\xi(1-\xi)},
        \qquad
        \frac{dy}{dx} = \frac{s_k^2\,[d_{k+1}\xi^2 + 2 s_k \xi(1-\xi) + d_k (1-\xi)^2]}
                             {[s_k + (d_{k+1} + d_k - 2 s_k)\,\xi(1-\xi)]^2}.

    The inverse solves the quadratic :math:`a\xi^2 + b\xi + c = 0` with
    :math:`a = h_k(s_k - d_k) + (y - y_k)\delta`, :math:`b = h_k d_k - (y - y_k)\delta`,
    :math:`c = -s_k (y - y_k)`, :math:`\delta = d_{k+1} + d_k - 2 s_k`, by the numerically stable
    root :math:`\xi = 2c / (-b - \sqrt{b^2 - 4ac})` (no cancellation, finite at :math:`y = y_k`).
    Outside ``[-B, B]`` both directions are the identity with log-derivative 0. Inputs exactly on a
    knot, at the bounds and far outside (``±1e4``) give finite values and gradients.

    Shapes: ``x`` is any ``S``; ``params`` is ``(*S, 3K - 1)`` or broadcastable to it (e.g.
    ``(*event, 3K - 1)`` free parameters); the outputs have shape ``S``.

    References:
        Durkan, Bekasov, Murray, Papamakarios (2019), "Neural Spline Flows", NeurIPS,
        arXiv:1906.04032. Gregory, Delbourgo (1982), "Piecewise rational quadratic interpolation
        to monotonic data", IMA Journal of Numerical Analysis.

    Args:
        bins: number of bins ``K``.
        bound: half-width ``B`` of the spline's domain and range ``[-B, B]``, finite, in
            ``(0, MAX_BOUND]`` (``MAX_BOUND = 1e30``: ``2B`` stays finite in float32).
        min_bin_width: smallest bin width as a fraction of ``2B`` (``K · min_bin_width < 1``).
        min_bin_height: smallest bin height as a fraction of ``2B``.
        min_derivative: smallest derivative at a knot, in ``(0, 1)`` (0 would allow a zero
            derivative, an infinite log-determinant at a finite input).

    Raises:
        ValueError: for ``bins < 1``, a ``bound`` that is not in ``(0, 1e30]``, ``min_derivative``
            outside ``(0, 1)``, NaN values or minima that leave no room.
        TypeError: for options that are not numbers.

    Example:
        >>> import torch
        >>> tau = RationalQuadraticSpline(bins=4, bound=3.0)
        >>> _ = torch.manual_seed(0)
        >>> x, params = torch.linspace(-4, 4, 9), torch.randn(9, tau.params_per_dim)
        >>> z, ladj = tau.forward_and_log_det(x, params)
        >>> torch.allclose(tau.inverse_and_log_det(z, params)[0], x, atol=1e-5)
        True
        >>> z[0].item(), z[-1].item()  # identity tails outside [-3, 3]
        (-4.0, 4.0)
    """

    def __init__(
        self,
        bins: int = 8,
        *,
        bound: float = 5.0,
        min_bin_width: float = 1e-3,
        min_bin_height: float = 1e-3,
        min_derivative: float = 1e-3,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_count(name, "bins", bins)
        # a finite bound whose 2B and knot arithmetic stay finite in float32 (bound=inf gave NaN out)
        bound = check_number(name, "bound", bound, minimum=0, strict=True, maximum=MAX_BOUND)
        for label, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
            value = check_number(name, label, value, minimum=0)
            if not value * bins < 1:
                raise ValueError(f"{name}: expected 0 <= {label} < 1/bins = {1 / bins:g}, got {value}")
        # d = 0 at a knot makes the rational-quadratic derivative vanish there: log d = -inf at finite x
        min_derivative = check_number(name, "min_derivative", min_derivative, minimum=0, strict=True)
        if not min_derivative < 1:
            raise ValueError(f"{name}: expected 0 < min_derivative < 1, got {min_derivative}")
        self.bins = bins
        self.bound = float(bound)
        self.min_bin_width = float(min_bin_width)
        self.min_bin_height = float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.params_per_dim = 3 * bins - 1
        self._softplus_shift = math.log(math.expm1(1 - self.min_derivative))
        self._constants: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}

    def _knot_constants(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """Offsets ``(2, K + 1)`` and scales ``(2, 1)`` of the knots (rows x, y), cached per dtype and device.

        Knot ``j`` is ``-B + 2B (m j + (1 - K m) Σ_{i<j} softmax_i)``: the offsets hold the constant
        part, the scales ``2B (1 - K m)``. They are
        computed in float64 and cast once, not stored as buffers (a float32 round trip would cost
        precision in float64).
        """
        key = (like.dtype, like.device)
        if key not in self._constants:
            minima = torch.tensor([[self.min_bin_width], [self.min_bin_height]], dtype=torch.float64)
            offsets = -self.bound + 2 * self.bound * minima * torch.arange(self.bins + 1, dtype=torch.float64)
            scales = 2 * self.bound * (1 - self.bins * minima)
            self._constants[key] = (offsets.to(like), scales.to(like))
        return self._constants[key]

    def _check_params(self, params: Tensor) -> None:
        if params.shape[-1] != self.params_per_dim:
            raise ValueError(
                f"{type(self).__name__}: expected raw parameters of shape (*, {self.params_per_dim}) "
                f"(3 * bins - 1 with bins={self.bins}), got {tuple(params.shape)}"
            )

    def _bin_parameters(self, v: Tensor, params: Tensor, inverse: bool) -> tuple[Tensor, ...]:
        """Locate ``v`` (clamped to the domain) and return its bin's ``x_k, w_k, y_k, h_k, d_k, d_{k+1}``."""
        self._check_params(params)
        params = params.expand(*v.shape, self.params_per_dim)
        offsets, scales = self._knot_constants(params)
        if under_differentiation_transform():  # torch.func.jacrev/jvp/grad: no in-place backward
            lower, size, raw = locate_autograd(params, v.detach(), offsets, scales, int(inverse), self._softplus_shift)
        else:
            lower, size, raw = BinEnds.apply(params, v.detach(), offsets, scales, int(inverse), self._softplus_shift)[
                :3
            ]
        x_k, y_k = lower.unbind(0)
        width, height = size.unbind(0)
        d_k, d_k1 = (F.softplus(raw) + self.min_derivative).unbind(0)
        return x_k, width, y_k, height, d_k, d_k1

    def _forward_autograd(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """The forward map built from differentiable operations (any order in ``x``), for double backward."""
        xc = x.clamp(-self.bound, self.bound)
        inside = xc == x
        y, ladj, _ = forward_map(xc, *self._bin_parameters(xc, params, inverse=False))
        return torch.where(inside, y, x), torch.where(inside, ladj, 0.0)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)
        if under_differentiation_transform():  # torch.func.jacrev/jvp/grad: the composable formulation
            return self._forward_autograd(x, params)
        y, ladj = SplineForward.apply(x, params.expand(*x.shape, self.params_per_dim), self)[:2]
        return y, ladj

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        zc = z.clamp(-self.bound, self.bound)
        inside = zc == z
        x_k, w, y_k, h, d_k, d_k1 = self._bin_parameters(zc, params, inverse=True)
        s = h / w
        dy = zc - y_k
        delta = torch.add(d_k + d_k1, s, alpha=-2)
        a = torch.addcmul(dy * delta, h, s - d_k)
        b = torch.addcmul(-dy * delta, h, d_k)
        c = -s * dy
        discriminant = torch.addcmul(b * b, a, c, value=-4).clamp_min(0)
        xi = (2 * c) / (-b - torch.sqrt(discriminant))
        x = torch.addcmul(x_k, xi, w)
        one_minus = 1 - xi
        t = xi * one_minus
        den = torch.addcmul(s, delta, t)
        ladj = -log_derivative(xi * xi, t, one_minus * one_minus, s, d_k, d_k1, den)[1]
        return torch.where(inside, x, z), torch.where(inside, ladj, 0.0)

    def extra_repr(self) -> str:
        return f"bins={self.bins}, bound={self.bound}"
