r"""Toy targets with closed-form geometry: Neal's funnel and the banana (twisted Gaussian).

Both are push-forwards of a standard normal by an explicit map, so their normalising constants
are exact and exact samplers exist; :meth:`Funnel.latent` and :meth:`Banana.latent` invert the map
(the test oracle: the latent of exact or well-mixed samples is standard normal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_count
from flows.targets.base import EnergyTarget

__all__ = ["Banana", "Funnel"]

_LOG_2PI = math.log(2 * math.pi)


class Funnel(EnergyTarget):
    r"""Neal's funnel: :math:`v \sim \mathcal N(0, s^2)` and :math:`x_i \mid v \sim \mathcal N(0, e^{bv})`.

    The first coordinate is the neck :math:`v`, the other ``dim − 1`` the :math:`x_i`:

    .. math:: u(v, x) = \frac{v^2}{2s^2} + \sum_{i=1}^{d-1} \Big[\frac{x_i^2}{2} e^{-bv} + \frac{bv}{2}\Big],
        \qquad \log Z = \log s + \tfrac d2 \log 2\pi.

    Neal (2003) uses :math:`s = 3, b = 1` (the default); Grenioux et al. (2023) use
    :math:`s = \sqrt 3, b = 1`. The width of the funnel varies by :math:`e^{\pm 3bs/2}` over
    :math:`\pm 3` standard deviations of :math:`v`, which defeats fixed-step samplers.

    References:
        Neal (2003), "Slice sampling", Annals of Statistics 31(3), 705–767.
        Grenioux, Durmus, Moulines, Gabrié (2023), "On Sampling with Approximate Transport Maps",
        ICML, arXiv:2302.04763.

    Args:
        dim: number of coordinates (at least 2).
        scale: standard deviation :math:`s` of the neck coordinate.
        b: rate :math:`b` of the conditional log-variance.

    Example:
        >>> import torch
        >>> target = Funnel(5)
        >>> x = target.sample((2000,), generator=torch.Generator().manual_seed(0))
        >>> round(target.latent(x).std().item(), 1)
        1.0
    """

    def __init__(self, dim: int, *, scale: float = 3.0, b: float = 1.0) -> None:
        check_count("Funnel", "dim", dim, minimum=2)
        if not scale > 0:
            raise ValueError(f"Funnel: expected a positive scale, got {scale}")
        super().__init__(dim)
        self.scale, self.b = float(scale), float(b)
        self.log_Z = math.log(self.scale) + 0.5 * dim * _LOG_2PI

    def energy(self, x: Tensor) -> Tensor:
        self._check_input(x)
        v, rest = x[..., 0], x[..., 1:]
        u = (
            0.5 * (v / self.scale).square()
            + 0.5 * rest.square().sum(-1) * torch.exp(-self.b * v)
            + 0.5 * (self.dim - 1) * self.b * v
        )
        return self._overflow_to_inf(u, x)

    def latent(self, x: Tensor) -> Tensor:
        r"""The standard normal variables behind ``x``: :math:`(v/s,\; x_i e^{-bv/2})`."""
        self._check_input(x)
        v = x[..., :1]
        return torch.cat((v / self.scale, x[..., 1:] * torch.exp(-0.5 * self.b * v)), dim=-1)

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        shape = self._sample_size(sample_shape)
        eps = self._randn((*shape, self.dim), generator)
        v = self.scale * eps[..., :1]
        return torch.cat((v, eps[..., 1:] * torch.exp(0.5 * self.b * v)), dim=-1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, scale={self.scale}, b={self.b}"


class Banana(EnergyTarget):
    r"""Banana (twisted Gaussian) in even ``dim``: a standard normal pushed through a quadratic twist.

    With :math:`\varepsilon \sim \mathcal N(0, I)`,

    .. math:: x_{2i} = a\,\varepsilon_{2i}, \qquad x_{2i+1} = \varepsilon_{2i+1} + b\,x_{2i}^2 - a^2 b,

    so :math:`u(x) = \sum_i \big[\tfrac12 (x_{2i}/a)^2 + \tfrac12 (x_{2i+1} - b x_{2i}^2 + a^2 b)^2\big]`
    and :math:`\log Z = \tfrac d2 (\log 2\pi + \log a)`. The defaults :math:`a = 10, b = 0.02` are
    those of Grenioux et al. (2023) (after Haario et al. 1999).

    References:
        Haario, Saksman, Tamminen (1999), "Adaptive proposal distribution for random walk
        Metropolis algorithm", Computational Statistics 14, 375–395.
        Grenioux, Durmus, Moulines, Gabrié (2023), "On Sampling with Approximate Transport Maps",
        ICML, arXiv:2302.04763.

    Args:
        dim: even number of coordinates.
        a: stretch of the even coordinates (positive).
        b: curvature of the twist.

    Example:
        >>> import torch
        >>> target = Banana(2)
        >>> x = target.sample((5,))
        >>> torch.allclose(target.energy(x), 0.5 * target.latent(x).square().sum(-1))
        True
    """

    def __init__(self, dim: int, *, a: float = 10.0, b: float = 0.02) -> None:
        if not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"Banana: expected an even dim >= 2, got {dim!r}")
        if not a > 0:
            raise ValueError(f"Banana: expected a positive a, got {a}")
        super().__init__(dim)
        self.a, self.b = float(a), float(b)
        self.log_Z = 0.5 * dim * (_LOG_2PI + math.log(self.a))

    def latent(self, x: Tensor) -> Tensor:
        r"""The standard normal :math:`\varepsilon` behind ``x`` (the inverse of the twist)."""
        self._check_input(x)
        pairs = x.unflatten(-1, (self.dim // 2, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        eps = torch.stack((even / self.a, odd - self.b * even.square() + self.a**2 * self.b), dim=-1)
        return eps.flatten(-2)

    def energy(self, x: Tensor) -> Tensor:
        return self._overflow_to_inf(0.5 * self.latent(x).square().sum(-1), x)

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        shape = self._sample_size(sample_shape)
        eps = self._randn((*shape, self.dim // 2, 2), generator)
        even = self.a * eps[..., 0]
        odd = eps[..., 1] + self.b * even.square() - self.a**2 * self.b
        return torch.stack((even, odd), dim=-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, a={self.a}, b={self.b}"
