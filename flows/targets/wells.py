r"""Potential-well targets: the SNF/FAB double well, the many-well in ``d`` dimensions, and Müller-Brown.

The double well of Wu, Köhler, Noé (2020) is

.. math:: u(x) = a x_1 + b x_1^2 + c x_1^4 + \tfrac12 x_2^2, \qquad (a, b, c) = (-0.5, -6, 1),

and the many-well of Midgley et al. (2023) stacks ``d/2`` independent copies of it on the coordinate
pairs :math:`(x_{2i}, x_{2i+1})`, so that it has :math:`2^{d/2}` modes, an exact sampler and an exact
normalising constant :math:`\log Z = \tfrac d2 (\log Z_1 + \tfrac12 \log 2\pi)` with
:math:`Z_1 = \int e^{-(a t + b t^2 + c t^4)} dt` (11784.50927 for the default parameters, as in
fab-torch's ``double_well.py``; computed here by quadrature for any parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from flows.targets._quadrature import log_trapezoid_1d, log_trapezoid_2d
from flows.targets.base import EnergyTarget

__all__ = ["DoubleWell", "ManyWell", "MullerBrown"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class _QuarticWell:
    r"""The one-dimensional quartic :math:`u(t) = a t + b t^2 + c t^4` (``c > 0``) in float64 numpy.

    Computes its normalising constant by quadrature and a Gaussian-mixture envelope for exact
    rejection sampling (one component per local minimum, the bound found on a dense grid).
    """

    def __init__(self, a: float, b: float, c: float) -> None:
        if not c > 0:
            raise ValueError(f"the quartic coefficient must be positive (normalisable target), got c={c}")
        self.a, self.b, self.c = float(a), float(b), float(c)
        critical = np.roots([4 * self.c, 0.0, 2 * self.b, self.a])
        critical = np.sort(critical[np.abs(critical.imag) < 1e-9].real)
        minima = critical[self.second(critical) > 0]
        self.u_min = float(np.min(self.u(minima)))
        radius = max(1.0, float(np.max(np.abs(critical))) + 1.0)
        while min(self.u(radius), self.u(-radius)) < self.u_min + 80:
            radius *= 1.5
        self.radius = radius
        self.log_Z = log_trapezoid_1d(lambda t: -self.u(t), -radius, radius)
        self.log_p_positive = log_trapezoid_1d(lambda t: -self.u(t), 0.0, radius) - self.log_Z
        # Rejection envelope: Gaussians at the minima, 1.5x wider than the local curvature, and a
        # broad component (10% of the mass) that covers the barriers between them.
        self.locs = np.append(minima, minima.mean())
        self.scales = np.append(1.5 / np.sqrt(self.second(minima)), radius / 3)
        log_mass = -self.u(minima) + np.log(self.scales[:-1])
        log_mass = log_mass - np.logaddexp.reduce(log_mass) + math.log(0.9)
        self.log_weights = np.append(log_mass, math.log(0.1))
        grid = np.linspace(-2 * radius, 2 * radius, 400_001)
        log_ratio = -self.u(grid) - self.log_envelope(grid)
        self.log_bound = float(np.max(log_ratio)) + math.log(1.01)
        if max(log_ratio[0], log_ratio[-1]) > self.log_bound - 20:  # pragma: no cover - internal safeguard
            raise RuntimeError("rejection envelope does not dominate the target's tails")

    def u(self, t: np.ndarray | float) -> np.ndarray:
        return self.a * t + self.b * t**2 + self.c * t**4

    def second(self, t: np.ndarray) -> np.ndarray:
        return 2 * self.b + 12 * self.c * t**2

    def log_envelope(self, t: np.ndarray) -> np.ndarray:
        z = (t[..., None] - self.locs) / self.scales
        return np.logaddexp.reduce(self.log_weights - 0.5 * z**2 - np.log(self.scales) - _LOG_SQRT_2PI, axis=-1)


class ManyWell(EnergyTarget):
    r"""Many-well target: ``dim/2`` independent 2-D double wells on the pairs :math:`(x_{2i}, x_{2i+1})`.

    .. math:: u(x) = \sum_{i=0}^{d/2-1} \big[a x_{2i} + b x_{2i}^2 + c x_{2i}^4 + \tfrac12 x_{2i+1}^2\big].

    With the default :math:`(a, b, c) = (-0.5, -6, 1)` each even coordinate has a deep well near
    :math:`+1.7` and a shallow one near :math:`-1.7` (probability ≈ 0.15, see :attr:`p_positive`),
    so the target has :math:`2^{d/2}` modes (65,536 for ``d = 32``).

    ``log_Z`` is exact (one-dimensional quadrature, 1e-12 relative); :meth:`sample` is exact
    (rejection sampling of the even coordinates with a Gaussian-mixture envelope, standard normal
    odd coordinates).

    References:
        Midgley, Stimper, Simm, Schölkopf, Hernández-Lobato (2023), "Flow Annealed Importance
        Sampling Bootstrap", ICLR, arXiv:2208.01893 (the many-well, ``fab/target_distributions``).
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707 (the
        double well and its parameters).

    Args:
        dim: even number of coordinates ``d``.
        a, b, c: coefficients of the quartic along the even coordinates (``c > 0``).

    Example:
        >>> import torch
        >>> target = ManyWell(4)
        >>> round(target.log_Z, 4) == round(2 * (math.log(11784.50927) + 0.5 * math.log(2 * math.pi)), 4)
        True
        >>> target.sample((3,), generator=torch.Generator().manual_seed(0)).shape
        torch.Size([3, 4])
    """

    def __init__(self, dim: int, *, a: float = -0.5, b: float = -6.0, c: float = 1.0) -> None:
        if not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"{type(self).__name__}: expected an even dim >= 2, got {dim!r}")
        super().__init__(dim)
        self.n_wells = dim // 2
        self._well = _QuarticWell(a, b, c)
        self.a, self.b, self.c = self._well.a, self._well.b, self._well.c
        self.log_Z_1d = self._well.log_Z
        self.log_Z = self.n_wells * (self.log_Z_1d + _LOG_SQRT_2PI)
        for name, value in (
            ("_env_locs", self._well.locs),
            ("_env_scales", self._well.scales),
            ("_env_log_weights", self._well.log_weights),
        ):
            self.register_buffer(name, torch.as_tensor(value, dtype=torch.get_default_dtype()), persistent=False)

    @property
    def p_positive(self) -> float:
        """Exact probability that one even coordinate is positive (the deep well for ``a < 0``)."""
        return math.exp(self._well.log_p_positive)

    def well_energy(self, t: Tensor) -> Tensor:
        r"""The quartic :math:`a t + b t^2 + c t^4`, elementwise."""
        t2 = t.square()
        return self.a * t + self.b * t2 + self.c * t2.square()

    def energy(self, x: Tensor) -> Tensor:
        self._check_input(x)
        pairs = x.unflatten(-1, (self.n_wells, 2))
        return self._overflow_to_inf((self.well_energy(pairs[..., 0]) + 0.5 * pairs[..., 1].square()).sum(-1), x)

    def free_energy(self, t: Tensor) -> Tensor:
        r"""Exact free energy of one even coordinate, :math:`F(t) = -\log p(t) = u_1(t) + \log Z_1` (nats)."""
        return self.well_energy(t) + self.log_Z_1d

    def well_signs(self, x: Tensor) -> Tensor:
        """Which well each pair is in, ``x[..., 0::2] > 0``, shape ``(*batch, dim/2)``; the sign pattern is the mode."""
        self._check_input(x)
        return x[..., 0::2] > 0

    def expected_modes_covered(self, n: int) -> float:
        r"""Expected number of distinct modes (sign patterns) among ``n`` exact samples.

        :math:`\sum_k \binom{m}{k} [1 - (1 - p^k q^{m-k})^n]`, with ``m = dim/2`` wells and
        :math:`p` = :attr:`p_positive`, :math:`q = 1 - p`. Divide a sampler's count of distinct sign
        patterns by this to get its mode coverage relative to exact sampling with the same ``n``.
        """
        m, p = self.n_wells, self.p_positive
        total = 0.0
        for k in range(m + 1):
            log_pm = k * math.log(p) + (m - k) * math.log1p(-p)
            total += math.comb(m, k) * -math.expm1(n * math.log1p(-math.exp(log_pm)))
        return total

    def _sample_wells(self, n: int, generator: torch.Generator | None) -> Tensor:
        """``n`` exact samples of the one-dimensional quartic well by rejection sampling."""
        out: list[Tensor] = []
        got = 0
        acceptance = math.exp(self._well.log_Z - self._well.log_bound)
        locs, scales, log_w = self._env_locs, self._env_scales, self._env_log_weights
        while got < n:
            m = int((n - got) / acceptance * 1.1) + 16
            comp = torch.multinomial(log_w.exp(), m, replacement=True, generator=generator)
            t = locs[comp] + scales[comp] * self._randn((m,), generator).to(locs)
            z = (t[:, None] - locs) / scales
            log_q = torch.logsumexp(log_w - 0.5 * z.square() - scales.log() - _LOG_SQRT_2PI, dim=-1)
            log_u = self._rand((m,), generator).to(locs).log()
            keep = t[log_u < -self.well_energy(t) - log_q - self._well.log_bound]
            out.append(keep)
            got += keep.numel()
        return torch.cat(out)[:n]

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        shape = self._sample_size(sample_shape)
        n = shape.numel() * self.n_wells
        even = self._sample_wells(n, generator).to(self._anchor.dtype).reshape(*shape, self.n_wells)
        odd = self._randn((*shape, self.n_wells), generator)
        return torch.stack((even, odd), dim=-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, a={self.a}, b={self.b}, c={self.c}"


class DoubleWell(ManyWell):
    r"""The 2-D double well of Stochastic Normalizing Flows: :math:`u(x) = x_1^4 - 6x_1^2 - 0.5x_1 + \tfrac12 x_2^2`.

    A :class:`ManyWell` with ``dim = 2``: exact ``log_Z`` (:math:`\log(11784.50927\sqrt{2\pi})` for
    the defaults), exact samples, and the exact free-energy profile along :math:`x_1`
    (:meth:`~ManyWell.free_energy`). Coordinates are 0-based: ``x[..., 0]`` is :math:`x_1`.

    References:
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707
        (``DoubleWellEnergy(2, a=-0.5, b=-6)`` in the paper's code).

    Args:
        a, b, c: coefficients of the quartic along :math:`x_1` (``c > 0``).

    Example:
        >>> import torch
        >>> target = DoubleWell()
        >>> abs(target.log_Z - math.log(11784.50927 * math.sqrt(2 * math.pi))) < 1e-6
        True
        >>> target.energy(torch.tensor([[1.0, 0.0]])).item()
        -5.5
    """

    def __init__(self, *, a: float = -0.5, b: float = -6.0, c: float = 1.0) -> None:
        super().__init__(2, a=a, b=b, c=c)

    def extra_repr(self) -> str:
        return f"a={self.a}, b={self.b}, c={self.c}"


# Müller & Brown (1979), Theor. Chim. Acta 53, 75-93: V(x, y) = sum_k A_k exp(a_k (x - x_k)^2
# + b_k (x - x_k)(y - y_k) + c_k (y - y_k)^2).
_MB_A = (-200.0, -100.0, -170.0, 15.0)
_MB_a = (-1.0, -1.0, -6.5, 0.7)
_MB_b = (0.0, 0.0, 11.0, 0.6)
_MB_c = (-10.0, -10.0, -6.5, 0.7)
_MB_x0 = (1.0, 0.0, -0.5, -1.0)
_MB_y0 = (0.0, 0.5, 1.5, 1.0)


def _muller_brown_numpy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    v = np.zeros(np.broadcast(x, y).shape)
    for A, a, b, c, x0, y0 in zip(_MB_A, _MB_a, _MB_b, _MB_c, _MB_x0, _MB_y0, strict=True):
        dx, dy = x - x0, y - y0
        v = v + A * np.exp(a * dx**2 + b * dx * dy + c * dy**2)
    return v


class MullerBrown(EnergyTarget):
    r"""The Müller-Brown potential at inverse temperature ``beta``: :math:`u(x) = \beta V(x)`.

    .. math:: V(x, y) = \sum_{k=1}^{4} A_k \exp\!\big(a_k (x-x_k)^2 + b_k (x-x_k)(y-y_k) + c_k (y-y_k)^2\big)

    with :math:`A = (-200, -100, -170, 15)`, :math:`a = (-1, -1, -6.5, 0.7)`,
    :math:`b = (0, 0, 11, 0.6)`, :math:`c = (-10, -10, -6.5, 0.7)`, :math:`x_k = (1, 0, -0.5, -1)`,
    :math:`y_k = (0, 0.5, 1.5, 1)`. Three minima (the deepest, :math:`V \approx -146.7`, near
    :math:`(-0.558, 1.442)`); the default :math:`\beta = 0.1` puts the main barrier at about
    10 :math:`k_BT` (a common choice; the original paper has no temperature). ``log_Z`` is
    computed by 2-D quadrature (relative accuracy ~1e-8); there is no exact sampler.

    References:
        Müller, Brown (1979), "Location of saddle points and minimum energy paths by a constrained
        simplex optimization procedure", Theoretica Chimica Acta 53, 75–93.

    Args:
        beta: inverse temperature (positive).

    Example:
        >>> import torch
        >>> target = MullerBrown()
        >>> round(target.energy(torch.tensor([-0.558, 1.442])).item(), 2)
        -14.67
    """

    def __init__(self, *, beta: float = 0.1) -> None:
        if not beta > 0:
            raise ValueError(f"MullerBrown: expected a positive beta, got {beta}")
        super().__init__(2)
        self.beta = float(beta)
        for name, values in (("A", _MB_A), ("a", _MB_a), ("b", _MB_b), ("c", _MB_c), ("x0", _MB_x0), ("y0", _MB_y0)):
            self.register_buffer(f"_{name}", torch.tensor(values), persistent=False)
        self._log_Z: float | None = None

    @property
    def log_Z(self) -> float:
        """Log normalising constant by 2-D quadrature on first use, then cached."""
        if self._log_Z is None:
            self._log_Z = log_trapezoid_2d(
                lambda x, y: -self.beta * _muller_brown_numpy(x, y), (-3.0, 2.5), (-1.5, 3.5), n=2001
            )
        return self._log_Z

    def potential(self, x: Tensor) -> Tensor:
        """The Müller-Brown potential :math:`V(x)` (at ``beta = 1``), shape ``batch``."""
        self._check_input(x)
        dx = x[..., 0:1] - self._x0
        dy = x[..., 1:2] - self._y0
        v = (self._A * torch.exp(self._a * dx.square() + self._b * dx * dy + self._c * dy.square())).sum(-1)
        return self._overflow_to_inf(v, x)

    def energy(self, x: Tensor) -> Tensor:
        return self.beta * self.potential(x)

    def extra_repr(self) -> str:
        return f"beta={self.beta}"
