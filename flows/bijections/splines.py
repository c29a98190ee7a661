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

from flows.bijections.transformers import Transformer

__all__ = ["RationalQuadraticSpline"]

_LOG2E = math.log2(math.e)


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
        bound: half-width ``B`` of the spline's domain and range ``[-B, B]``.
        min_bin_width: smallest bin width as a fraction of ``2B`` (``K · min_bin_width < 1``).
        min_bin_height: smallest bin height as a fraction of ``2B``.
        min_derivative: smallest derivative at a knot (``< 1``).

    Raises:
        ValueError: for ``bins < 1``, ``bound <= 0`` or minima that leave no room.

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
        if not isinstance(bins, int) or bins < 1:
            raise ValueError(f"{name}: expected bins to be an int >= 1, got {bins!r}")
        if not bound > 0:
            raise ValueError(f"{name}: expected bound > 0, got {bound}")
        for label, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
            if not 0 <= value * bins < 1:
                raise ValueError(f"{name}: expected 0 <= {label} < 1/bins = {1 / bins:g}, got {value}")
        if not 0 <= min_derivative < 1:
            raise ValueError(f"{name}: expected 0 <= min_derivative < 1, got {min_derivative}")
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

    def _bin_parameters(self, v: Tensor, params: Tensor, inverse: bool) -> tuple[Tensor, ...]:
        """Locate ``v`` (clamped to the domain) and return its bin's ``x_k, w_k, y_k, h_k, d_k, d_{k+1}``."""
        if params.shape[-1] != self.params_per_dim:
            raise ValueError(
                f"{type(self).__name__}: expected raw parameters of shape (*, {self.params_per_dim}) "
                f"(3 * bins - 1 with bins={self.bins}), got {tuple(params.shape)}"
            )
        params = params.expand(*v.shape, self.params_per_dim)
        offsets, scales = self._knot_constants(params)
        lower, size, raw = _BinEnds.apply(params, v.detach(), offsets, scales, int(inverse), self._softplus_shift)
        x_k, y_k = lower.unbind(0)
        width, height = size.unbind(0)
        d_k, d_k1 = (F.softplus(raw) + self.min_derivative).unbind(0)
        return x_k, width, y_k, height, d_k, d_k1

    @staticmethod
    def _log_derivative(xi: Tensor, one_minus: Tensor, s: Tensor, d_k: Tensor, d_k1: Tensor, den: Tensor) -> Tensor:
        """``log dy/dx = log(d_{k+1} ξ² + 2 s ξ(1-ξ) + d_k (1-ξ)²) + 2 log(s / den)``."""
        numerator = torch.addcmul(d_k1 * (xi * xi), s, xi * one_minus, value=2)
        numerator = torch.addcmul(numerator, d_k, one_minus * one_minus)
        return torch.add(torch.log(numerator), torch.log(s / den), alpha=2)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        xc = x.clamp(-self.bound, self.bound)
        inside = xc == x
        x_k, w, y_k, h, d_k, d_k1 = self._bin_parameters(xc, params, inverse=False)
        s = h / w
        xi = (xc - x_k) / w
        one_minus = 1 - xi
        t = xi * one_minus
        den = torch.addcmul(s, torch.add(d_k + d_k1, s, alpha=-2), t)  # s + (d_k + d_{k+1} - 2s) t
        y = torch.addcmul(y_k, h, torch.addcmul(d_k * t, s, xi * xi) / den)  # y_k + h (s ξ² + d_k t) / den
        ladj = self._log_derivative(xi, one_minus, s, d_k, d_k1, den)
        return torch.where(inside, y, x), torch.where(inside, ladj, 0.0)

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
        den = torch.addcmul(s, delta, xi * one_minus)
        ladj = -self._log_derivative(xi, one_minus, s, d_k, d_k1, den)
        return torch.where(inside, x, z), torch.where(inside, ladj, 0.0)

    def extra_repr(self) -> str:
        return f"bins={self.bins}, bound={self.bound}"


def _dense_stride(t: Tensor) -> tuple[int, ...] | None:
    """The strides of ``t`` if it fills its memory densely (a permuted contiguous tensor), else ``None``."""
    order = sorted(range(t.dim()), key=lambda i: t.stride(i))
    expected = 1
    for i in order:
        if t.shape[i] != 1 and t.stride(i) != expected:
            return None
        expected *= t.shape[i]
    return t.stride()


class _BinEnds(torch.autograd.Function):
    r"""Knots from raw sizes, bin search and gather, with a hand-written backward.

    Forward: raw parameters ``(*S, 3K - 1)`` and points ``v`` of shape ``S`` → the lower knot and the
    size of the bin holding each ``v``, both ``(2, *S)`` (rows x and y), and the raw derivatives
    at its two knots plus ``shift``, ``(2, *S)`` (the raw derivative is 0 at the boundary knots).

    With :math:`p = \operatorname{softmax}(u)` and :math:`C_j = \sum_{i<j} p_i`, knot :math:`j` is
    :math:`o_j + s C_j` and :math:`\partial C_j / \partial u_l = p_l([l < j] - C_j)`. The backward
    applies this to the two knots of the bin directly, writing into the gradient buffer in place,
    instead of differentiating softmax, cumsum and gather one by one. It is once-differentiable (a
    second derivative with respect to the raw parameters raises).

    CPU performance notes (each measured, PyTorch 2.13): the work runs parameter-first on
    ``params.movedim(-1, 0)`` so that kernels run along ``S`` (contiguously with a parameter-major
    conditioner output), not along rows of ``K`` entries; ``exp2`` is several times faster than
    ``exp``; the running sum over the bins is ``K`` adds (``cumsum`` over a leading dimension is
    slow); comparisons write float masks directly (bool outputs, ``where`` and bool arithmetic are
    slow); ``amax`` keeps the exponentials finite for any raw values.
    """

    @staticmethod
    def forward(
        ctx, params: Tensor, v: Tensor, offsets: Tensor, scales: Tensor, row: int, shift: float
    ) -> tuple[Tensor, ...]:
        k = offsets.shape[-1] - 1
        shape = v.shape
        trailing = (1,) * len(shape)
        dtype, device = params.dtype, params.device
        theta = params.movedim(-1, 0)  # (3K - 1, *S), a view
        sizes = theta[: 2 * k].unflatten(0, (2, k))
        e = torch.sub(sizes, sizes.amax(1, keepdim=True)).mul_(_LOG2E).exp2_()  # softmax numerators
        total = e.sum(1)  # (2, *S)
        inverse_total = torch.reciprocal(total)
        scaled = inverse_total * scales.view(2, *trailing)  # s / total
        # Interior knots of the searched row, o_j + (s / total) Σ_{i<j} e_i for j = 1..K-1.
        interior = torch.empty((k - 1, *shape), dtype=dtype, device=device)
        if k > 1:
            interior[0] = e[row, 0]
            for j in range(1, k - 1):
                torch.add(interior[j - 1], e[row, j], out=interior[j])
        interior.mul_(scaled[row]).add_(offsets[row, 1:k].view(k - 1, *trailing))
        below = torch.empty((k - 1, *shape), dtype=dtype, device=device)
        torch.ge(v, interior, out=below)  # [knot l + 1 <= v] = [l < bin], as 0./1. (knots go to the right bin)
        index = below.sum(0)  # the bin, as a float
        # C_k and C_{k+1} (times the total) as masked sums: [l < k] = below[l], [l <= k] = below[l - 1].
        c_low = (e[:, : k - 1] * below).sum(1)
        c_high = (e[:, 1:] * below).sum(1).add_(e[:, 0])
        step = (offsets[:, 1] - offsets[:, 0]).view(2, *trailing)  # o_j = o_0 + step j
        lower = torch.addcmul(offsets[:, 0].view(2, *trailing), index, step).addcmul_(c_low, scaled)  # knot k
        size = torch.addcmul(step, c_high - c_low, scaled)  # knot k + 1 - knot k
        # Raw derivatives r_j (rows 2K + j - 1, j = 1..K-1; r_0 = r_K = 0 at the boundary knots):
        # r_k = Σ_l below[l] (r_{l+1} - r_l) and r_{k+1} = r_1 + Σ_l below[l] (r_{l+2} - r_{l+1}).
        r = theta[2 * k :]
        steps = torch.empty((k, *shape), dtype=dtype, device=device)  # r_{l+1} - r_l for l = 0..K-1
        if k > 1:
            steps[0] = r[0]
            torch.sub(r[1:], r[:-1], out=steps[1 : k - 1])
            torch.neg(r[-1], out=steps[k - 1])
            raw = torch.stack(((below * steps[:-1]).sum(0), (below * steps[1:]).sum(0).add_(r[0]))).add_(shift)
        else:
            raw = torch.full((2, *shape), shift, dtype=dtype, device=device)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(e, scaled, below, c_low.mul_(inverse_total), c_high.mul_(inverse_total))
            ctx.layout = (params.shape, _dense_stride(params))
            ctx.k = k
        return lower, size, raw

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lower: Tensor, grad_size: Tensor, grad_raw: Tensor) -> tuple[Tensor | None, ...]:
        e, scaled, below, c_low, c_high = ctx.saved_tensors  # C_k, C_{k+1}
        k = ctx.k
        # With p_l = e_l / total: d knot_j / d u_l = (s / total) e_l ([l < j] - C_j) for j = k, k + 1.
        # The factor s / total multiplies the small (2, *S) upstream gradients, not the (2, K, *S) terms.
        g_low, g_high = grad_lower - grad_size, grad_size  # knot k, knot k + 1
        shape, stride = ctx.layout  # the gradient gets the parameters' memory layout
        if stride is None:
            grad = torch.empty(shape, dtype=e.dtype, device=e.device)
        else:
            grad = torch.empty_strided(shape, stride, dtype=e.dtype, device=e.device)
        theta = grad.movedim(-1, 0)
        g = theta[: 2 * k].unflatten(0, (2, k))
        g0, g1 = g_low * scaled, g_high * scaled
        torch.mul(below, g0.unsqueeze(1), out=g[:, : k - 1])
        g[:, k - 1].zero_()
        g[:, 1:].addcmul_(below, g1.unsqueeze(1))
        g[:, 0].add_(g1)
        g.sub_((g0 * c_low + g1 * c_high).unsqueeze(1)).mul_(e)
        if k > 1:
            # d r_k / d r_j = below[j-1] - below[j], d r_{k+1} / d r_j = below[j-2] - below[j-1] (j = 1..K-1,
            # below[-1] = 1, below[K-1] = 0).
            d0, d1 = grad_raw[0], grad_raw[1]
            out = theta[2 * k :]
            torch.mul(below, (d0 - d1), out=out)
            out[:-1].addcmul_(below[1:], d0, value=-1)
            out[1:].addcmul_(below[:-1], d1)
            out[0].add_(d1)
        return grad, None, None, None, None, None
