r"""Maps of the circle :math:`[-\pi, \pi)`: the circular rational-quadratic spline and a rotation.

A circle diffeomorphism must send :math:`-\pi` and :math:`\pi` (the same point) to the same point
with the same derivative there. A monotone rational-quadratic spline through
:math:`(-\pi, -\pi)` and :math:`(\pi, \pi)` whose derivatives at the two ends are **equal** (one
shared, learned value :math:`d_0 = d_K`) does both (Rezende et al. 2020; the circular splines of
Durkan et al. 2019). Inputs are first wrapped to :math:`[-\pi, \pi)`, so the map and its
log-derivative are :math:`2\pi`-periodic in the input. Composing with rotations
(:class:`CircularShift`) moves the fixed point :math:`-\pi`.

References:
    Rezende, Papamakarios, Racanière, Albergo, Kanwar, Shanahan, Cranmer (2020), "Normalizing
    Flows on Tori and Spheres", ICML, arXiv:2002.02428. Durkan, Bekasov, Murray, Papamakarios
    (2019), "Neural Spline Flows", NeurIPS, arXiv:1906.04032.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows._validation import check_count
from flows.bijections._spline_autograd import forward_map, log_derivative
from flows.bijections.base import Bijection, sum_event_dims
from flows.bijections.transformers import Transformer

__all__ = ["CircularRationalQuadraticSpline", "CircularShift", "IntervalToLine", "MixedSpline", "wrap"]


def wrap(theta: Tensor) -> Tensor:
    r"""Angles wrapped to :math:`[-\pi, \pi)`."""
    return torch.remainder(theta + math.pi, 2 * math.pi) - math.pi


class CircularRationalQuadraticSpline(Transformer):
    r"""Circle diffeomorphism: a rational-quadratic spline on :math:`[-\pi, \pi)` with matched end derivatives.

    Raw parameters ``θ = (u^w, u^h, u^d)`` of shape ``(*, 3K)`` (``K`` widths, ``K`` heights,
    ``K`` derivatives): bin widths and heights
    :math:`m + (1 - K m)\operatorname{softmax}(u) \cdot 2\pi`, knot derivatives
    :math:`d_k = m_d + \operatorname{softplus}(u^d_k + c)` for :math:`k = 0..K-1` (1 at
    :math:`u^d_k = 0`) and :math:`d_K = d_0`: the derivative at :math:`\pi` equals the one at
    :math:`-\pi`, so the map is :math:`C^1` on the circle. All-zero parameters give the identity.
    The bin formulas are those of :class:`~flows.bijections.splines.RationalQuadraticSpline`.
    The input is wrapped to :math:`[-\pi, \pi)` first, and the output lies in :math:`[-\pi, \pi]`.

    Args:
        bins: number of bins ``K``.
        min_bin_width: smallest bin width as a fraction of :math:`2\pi` (``K · min_bin_width < 1``).
        min_bin_height: smallest bin height as a fraction of :math:`2\pi`.
        min_derivative: smallest knot derivative (``< 1``).

    Raises:
        ValueError: for ``bins < 1`` or minima that leave no room.

    Example:
        >>> import math, torch
        >>> tau = CircularRationalQuadraticSpline(bins=4)
        >>> _ = torch.manual_seed(0)
        >>> x, params = torch.linspace(-3, 3, 7), torch.randn(7, tau.params_per_dim)
        >>> z, ladj = tau.forward_and_log_det(x, params)
        >>> torch.allclose(tau.inverse_and_log_det(z, params)[0], x, atol=1e-5)
        True
        >>> torch.allclose(tau.forward_and_log_det(x + 2 * math.pi, params)[1], ladj)  # periodic
        True
    """

    def __init__(
        self,
        bins: int = 8,
        *,
        min_bin_width: float = 1e-3,
        min_bin_height: float = 1e-3,
        min_derivative: float = 1e-3,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_count(name, "bins", bins)
        for label, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
            if not 0 <= value * bins < 1:
                raise ValueError(f"{name}: expected 0 <= {label} < 1/bins = {1 / bins:g}, got {value}")
        if not 0 <= min_derivative < 1:
            raise ValueError(f"{name}: expected 0 <= min_derivative < 1, got {min_derivative}")
        self.bins = bins
        self.min_bin_width, self.min_bin_height = float(min_bin_width), float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.params_per_dim = 3 * bins
        self._softplus_shift = math.log(math.expm1(1 - self.min_derivative))

    def _knots(self, raw: Tensor, minimum: float) -> Tensor:
        """Knot positions ``(*, K + 1)`` from ``-π`` to ``π``."""
        sizes = minimum + (1 - self.bins * minimum) * torch.softmax(raw, dim=-1)
        knots = F.pad(torch.cumsum(sizes, dim=-1), (1, 0))
        knots = 2 * math.pi * knots - math.pi
        return torch.cat([knots[..., :1] * 0 - math.pi, knots[..., 1:-1], knots[..., -1:] * 0 + math.pi], -1)

    def _bin(self, v: Tensor, params: Tensor, inverse: bool) -> tuple[Tensor, ...]:
        if params.shape[-1] != self.params_per_dim:
            raise ValueError(
                f"{type(self).__name__}: expected raw parameters of shape (*, {self.params_per_dim}) "
                f"(3 * bins with bins={self.bins}), got {tuple(params.shape)}"
            )
        params = params.expand(*v.shape, self.params_per_dim)
        k = self.bins
        xs, ys = (
            self._knots(params[..., :k], self.min_bin_width),
            self._knots(params[..., k : 2 * k], self.min_bin_height),
        )
        d = self.min_derivative + F.softplus(params[..., 2 * k :] + self._softplus_shift)
        d = torch.cat([d, d[..., :1]], -1)  # d_K = d_0: matched derivatives at ±π
        edges = ys if inverse else xs
        index = torch.searchsorted(edges[..., 1:-1].contiguous(), v.detach()[..., None].contiguous(), right=True)
        pick = lambda t: t.gather(-1, index).squeeze(-1)  # noqa: E731
        nxt = lambda t: t.gather(-1, index + 1).squeeze(-1)  # noqa: E731
        x_k, y_k = pick(xs), pick(ys)
        return x_k, nxt(xs) - x_k, y_k, nxt(ys) - y_k, pick(d), nxt(d)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        x = wrap(x)
        y, ladj, _ = forward_map(x, *self._bin(x, params, inverse=False))
        return y, ladj

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        z = wrap(z)
        x_k, w, y_k, h, d_k, d_k1 = self._bin(z, params, inverse=True)
        s = h / w
        dy = z - y_k
        delta = d_k + d_k1 - 2 * s
        a = h * (s - d_k) + dy * delta
        b = h * d_k - dy * delta
        c = -s * dy
        xi = ((2 * c) / (-b - torch.sqrt((b * b - 4 * a * c).clamp_min(0)))).clamp(0, 1)
        one_minus = 1 - xi
        t = xi * one_minus
        ladj = -log_derivative(xi * xi, t, one_minus * one_minus, s, d_k, d_k1, s + delta * t)[1]
        return x_k + xi * w, ladj

    def extra_repr(self) -> str:
        return f"bins={self.bins}"


class CircularShift(Bijection):
    r"""Rotation of angles by a learned offset: :math:`z = \operatorname{wrap}(x + s)`, ``ladj`` = 0.

    Moves the fixed point :math:`-\pi` of the circular splines between layers. The output is in
    :math:`[-\pi, \pi)` for any input (the map is :math:`2\pi`-periodic); the inverse is
    :math:`\operatorname{wrap}(z - s)`. With ``circular`` only those entries rotate; the others
    pass unchanged.

    Args:
        features: number of entries.
        shift: initial offset (a float, or a tensor of shape ``(features,)``).
        circular: boolean mask ``(features,)`` of the angles (``None``: every entry).

    Example:
        >>> import math, torch
        >>> t = CircularShift(2, shift=math.pi / 2)
        >>> [round(v, 4) for v in t(torch.tensor([0.0, 3.0])).tolist()]
        [1.5708, -1.7124]
    """

    def __init__(self, features: int, shift: float | Tensor = 0.0, circular: Tensor | None = None) -> None:
        super().__init__(features)
        self.shift = nn.Parameter(torch.as_tensor(shift, dtype=torch.get_default_dtype()).expand(features).clone())
        circular = torch.ones(features, dtype=torch.bool) if circular is None else torch.as_tensor(circular).bool()
        if circular.shape != (features,):
            raise ValueError(f"CircularShift: expected a mask of shape ({features},), got {tuple(circular.shape)}")
        self.register_buffer("circular", circular, persistent=False)

    def _rotate(self, x: Tensor, sign: float) -> tuple[Tensor, Tensor]:
        z = torch.where(self.circular, wrap(x + sign * self.shift), x)
        return z, sum_event_dims(torch.zeros_like(z), 1, self.batch_shape(x))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._rotate(x, 1.0)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._rotate(z, -1.0)


class CircularReflection(Bijection):
    r"""Reflection of angles about fixed axes: :math:`z = \operatorname{wrap}(2a - x)`, ``ladj`` = 0, its own inverse.

    A fixed, volume-preserving move between symmetric regions of a torus, for example the
    backbone torsions :math:`(\phi, \psi) \to (-\phi, -\psi)` of a peptide, which carry the
    :math:`\alpha_R` and C7eq minima onto :math:`\alpha_L` and C7ax (a mode-jumping move of
    :class:`~flows.train.ImportanceForwardKL`). With ``circular`` only those entries reflect; the
    others pass unchanged. The axes are a buffer, not a parameter.

    Args:
        features: number of entries.
        axis: the axis :math:`a` (a float, or a tensor of shape ``(features,)``).
        circular: boolean mask ``(features,)`` of the reflected angles (``None``: every entry).

    Example:
        >>> import torch
        >>> t = CircularReflection(2, axis=0.0)
        >>> [round(v, 4) for v in t(torch.tensor([0.5, -3.0])).tolist()]
        [-0.5, 3.0]
    """

    def __init__(self, features: int, axis: float | Tensor = 0.0, circular: Tensor | None = None) -> None:
        super().__init__(features)
        axis = torch.as_tensor(axis, dtype=torch.get_default_dtype())
        if axis.dim() > 1 or axis.numel() not in (1, features) or not bool(torch.isfinite(axis).all()):
            raise ValueError(f"CircularReflection: expected a finite axis, a float or ({features},), got {axis}")
        circular = torch.ones(features, dtype=torch.bool) if circular is None else torch.as_tensor(circular).bool()
        if circular.shape != (features,):
            raise ValueError(f"CircularReflection: expected a mask of shape ({features},), got {tuple(circular.shape)}")
        self.register_buffer("axis", axis.expand(features).clone())
        self.register_buffer("circular", circular, persistent=False)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = torch.where(self.circular, wrap(2 * self.axis - x), x)
        return z, sum_event_dims(torch.zeros_like(z), 1, self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.forward_and_log_det(z, context)


class IntervalToLine(Bijection):
    r"""Fixed elementwise map of a box (bounds may be infinite) onto the real line, with slope 1 at the middle.

    Per entry with bounds :math:`(l, u)`:

    * both finite: :math:`y = m + \tfrac{u - l}{4}\operatorname{logit}\tfrac{x - l}{u - l}` with
      :math:`m = (l + u)/2` (so :math:`y \approx x` around the midpoint),
      :math:`\log|dy/dx| = -\log(4 p (1 - p))`, :math:`p = (x - l)/(u - l)`;
    * only :math:`l` finite: :math:`y = l + \operatorname{softplus}^{-1}(x - l)`,
      :math:`\log|dy/dx| = -\log(1 - e^{-(x - l)})` (slope :math:`\to 1` far from :math:`l`);
    * only :math:`u` finite: the mirror image, :math:`y = u - \operatorname{softplus}^{-1}(u - x)`;
    * neither (and entries marked ``skip``, e.g. angles on the circle): the identity.

    Lets a Gaussian-based flow model bonds in :math:`(0, \infty)` and angles in :math:`(0, \pi)`
    exactly on their domains.

    Args:
        lower, upper: bounds ``(features,)`` (``-inf`` / ``inf`` for none).
        skip: entries left unchanged whatever their bounds (``None``: none).
        check_domain: raise on forward inputs outside the box (one reduction per call); without
            the check they give NaN.

    Raises:
        ValueError: for bounds of another shape or ``lower >= upper``; in the forward pass, for
            inputs outside the box.

    Example:
        >>> import math, torch
        >>> t = IntervalToLine(torch.tensor([0.0, 0.0]), torch.tensor([math.pi, math.inf]))
        >>> y = t(torch.tensor([math.pi / 2, 30.0]))
        >>> [round(v, 4) for v in y.tolist()]  # the midpoint and far from the lower bound are fixed points
        [1.5708, 30.0]
    """

    def __init__(self, lower: Tensor, upper: Tensor, skip: Tensor | None = None, *, check_domain: bool = True) -> None:
        lower = torch.as_tensor(lower, dtype=torch.float64).flatten()
        upper = torch.as_tensor(upper, dtype=torch.float64).flatten()
        super().__init__(len(lower))
        skip = torch.zeros(len(lower), dtype=torch.bool) if skip is None else torch.as_tensor(skip, dtype=torch.bool)
        if upper.shape != lower.shape or skip.shape != lower.shape:
            raise ValueError(
                f"IntervalToLine: expected lower, upper and skip of one shape, got {tuple(lower.shape)}, "
                f"{tuple(upper.shape)} and {tuple(skip.shape)}"
            )
        if bool((lower >= upper)[~skip].any()):
            raise ValueError(f"IntervalToLine: expected lower < upper, got {lower.tolist()} and {upper.tolist()}")
        lo, hi = torch.isfinite(lower) & ~skip, torch.isfinite(upper) & ~skip
        self.register_buffer("lower", torch.where(lo, lower, 0.0))
        self.register_buffer("upper", torch.where(hi, upper, 1.0))
        self.register_buffer("kind", (lo & hi) * 3 + (lo & ~hi) * 1 + (~lo & hi) * 2)  # 0 identity
        self.check_domain = bool(check_domain)

    def _map(self, x: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        lo, hi, kind = self.lower.to(x), self.upper.to(x), self.kind
        width = hi - lo
        if not inverse:
            p = (x - lo) / width
            box = (lo + hi) / 2 + width / 4 * (torch.log(p) - torch.log1p(-p))
            box_ladj = -torch.log(4 * p * (1 - p))
            v_lo, v_hi = x - lo, hi - x
            left = lo + v_lo + torch.log(-torch.expm1(-v_lo))
            right = hi - v_hi - torch.log(-torch.expm1(-v_hi))
            ladj_lo, ladj_hi = -torch.log(-torch.expm1(-v_lo)), -torch.log(-torch.expm1(-v_hi))
        else:
            centred = 4 * (x - (lo + hi) / 2) / width
            box = lo + width * torch.sigmoid(centred)
            box_ladj = torch.log(4 * torch.sigmoid(centred) * torch.sigmoid(-centred))
            left = lo + F.softplus(x - lo)
            right = hi - F.softplus(hi - x)
            ladj_lo, ladj_hi = F.logsigmoid(x - lo), F.logsigmoid(hi - x)
        out = torch.where(kind == 3, box, torch.where(kind == 1, left, torch.where(kind == 2, right, x)))
        ladj = torch.where(kind == 3, box_ladj, torch.where(kind == 1, ladj_lo, torch.where(kind == 2, ladj_hi, 0.0)))
        return out, ladj.sum(-1)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.check_domain:
            kind, lo, hi = self.kind, self.lower.to(x), self.upper.to(x)
            outside = ((kind % 2 == 1) & (x <= lo)) | ((kind >= 2) & (x >= hi))
            if bool(outside.any()):
                entry = int(outside.nonzero()[0, -1])
                bounds = (
                    float(self.lower[entry]) if kind[entry] % 2 else -math.inf,
                    float(self.upper[entry]) if kind[entry] >= 2 else math.inf,
                )
                raise ValueError(
                    f"IntervalToLine: expected inputs inside the domain, got {float(x[outside][0]):g} in entry "
                    f"{entry} outside {bounds}"
                )
        return self._map(x, inverse=False)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._map(z, inverse=True)


class MixedSpline(Transformer):
    r"""Circular splines on the ``circular`` entries, interval splines (identity tails) on the others.

    Raw parameters ``(*, n, 3K)``: circular entries use all ``3K``
    (:class:`CircularRationalQuadraticSpline`), the others the first ``3K - 1``
    (:class:`~flows.bijections.splines.RationalQuadraticSpline` on ``[-bound, bound]``).

    Args:
        circular: boolean mask ``(n,)`` over the transformed entries.
        bins: number of bins ``K``.
        bound: half-width of the interval splines.
    """

    def __init__(self, circular: Tensor, bins: int = 8, *, bound: float = 5.0) -> None:
        super().__init__()
        from flows.bijections.splines import RationalQuadraticSpline

        self.register_buffer("circular", torch.as_tensor(circular, dtype=torch.bool), persistent=False)
        self.circle, self.line = CircularRationalQuadraticSpline(bins), RationalQuadraticSpline(bins, bound=bound)
        self.params_per_dim = 3 * bins

    def _spline(self, x: Tensor, params: Tensor, inverse: bool) -> tuple[Tensor, Tensor]:
        if params.shape[-1] != self.params_per_dim:
            raise ValueError(
                f"MixedSpline: expected raw parameters of shape (*, {self.params_per_dim}), got {tuple(params.shape)}"
            )
        params = params.expand(*x.shape, self.params_per_dim)
        c, l = self.circular, ~self.circular  # noqa: E741
        circle = self.circle.inverse_and_log_det if inverse else self.circle.forward_and_log_det
        line = self.line.inverse_and_log_det if inverse else self.line.forward_and_log_det
        yc, lc = circle(x[..., c], params[..., c, :])
        yl, ll = line(x[..., l], params[..., l, : self.line.params_per_dim])
        order = torch.argsort(torch.cat([c.nonzero(), l.nonzero()]).squeeze(-1))
        return torch.cat([yc, yl], -1)[..., order], torch.cat([lc, ll], -1)[..., order]

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._spline(x, params, inverse=False)

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._spline(z, params, inverse=True)
