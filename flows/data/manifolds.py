r"""Toy data on known manifolds, with exact distance to the manifold and the true density on it.

:class:`SineManifold` is the graph :math:`x_{k+1} = h(t)`, :math:`t = (x_1,\dots,x_k) \sim \mathcal N(0, I_k)`,
of :math:`h(t) = A \sin(\omega t_1)\prod_{i>1}\cos(\omega t_i)`: for ``k = 1`` the sine curve of the
FIF toy experiments (:math:`x_2 = \sin(\pi x_1/2)`), for ``k = 2`` a wavy sheet in R^3. Injective
flows are judged on it by the distance of their samples to the manifold and by their on-manifold
log-density against the true one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flows._validation import check_count, check_event

__all__ = ["SineManifold"]


class SineManifold:
    r"""The graph of :math:`h(t) = A\sin(\omega t_1)\prod_{i=2}^k\cos(\omega t_i)`, :math:`t \sim \mathcal N(0, I_k)`.

    Points are :math:`x = (t, h(t)) \in \mathbb R^{k+1}`, a k-dimensional manifold. Its volume
    element is :math:`\sqrt{\det(I + \nabla h\nabla h^\top)} = \sqrt{1 + \|\nabla h\|^2}`, so the
    true density with respect to the manifold's volume measure is

    .. math:: \log p(x) = \log\mathcal N(t; 0, I_k) - \tfrac12\log\big(1 + \|\nabla h(t)\|^2\big).

    Args:
        dim: manifold dimension ``k`` (the data have ``k + 1`` features).
        amplitude: :math:`A`.
        frequency: :math:`\omega` (default :math:`\pi/2`, the FIF toy's sine).

    Example:
        >>> import torch
        >>> curve = SineManifold(1)
        >>> x = curve.sample(100, generator=torch.Generator().manual_seed(0))
        >>> x.shape, bool(curve.distance(x).max() < 1e-5)
        (torch.Size([100, 2]), True)
    """

    def __init__(self, dim: int = 1, *, amplitude: float = 1.0, frequency: float = math.pi / 2) -> None:
        check_count("SineManifold", "dim", dim)
        if not (math.isfinite(frequency) and frequency > 0 and math.isfinite(amplitude)):
            raise ValueError(
                f"SineManifold: expected a finite amplitude and a positive frequency, got {amplitude}, {frequency}"
            )
        self.dim, self.amplitude, self.frequency = dim, float(amplitude), float(frequency)

    @property
    def features(self) -> int:
        """Number of features ``k + 1`` of a data point."""
        return self.dim + 1

    def height(self, t: Tensor) -> Tensor:
        """:math:`h(t)` for coordinates ``t`` of shape ``(*batch, k)``; returns ``batch``."""
        w = self.frequency * t
        h = torch.sin(w[..., 0])
        if self.dim > 1:
            h = h * torch.cos(w[..., 1:]).prod(-1)
        return self.amplitude * h

    def gradient(self, t: Tensor) -> Tensor:
        r""":math:`\nabla h(t)`, shape ``(*batch, k)`` (closed form)."""
        w = self.frequency * t
        sin, cos = torch.sin(w), torch.cos(w)
        factors = torch.cat((sin[..., :1], cos[..., 1:]), -1)  # the factor of each coordinate in h
        slopes = torch.cat((cos[..., :1], -sin[..., 1:]), -1)  # its derivative / ω
        grads = []
        for i in range(self.dim):
            others = torch.cat((factors[..., :i], factors[..., i + 1 :]), -1).prod(-1)
            grads.append(self.amplitude * self.frequency * slopes[..., i] * others)
        return torch.stack(grads, -1)

    def embed(self, t: Tensor) -> Tensor:
        """The manifold point ``(t, h(t))`` of coordinates ``t`` (``(*batch, k) -> (*batch, k + 1)``)."""
        return torch.cat((t, self.height(t).unsqueeze(-1)), -1)

    def sample(self, n: int, *, generator: torch.Generator | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """``n`` points on the manifold, shape ``(n, k + 1)``."""
        return self.embed(torch.randn(n, self.dim, generator=generator, dtype=dtype))

    def log_prob(self, x: Tensor) -> Tensor:
        """True log-density on the manifold at the point with coordinates ``x[..., :k]`` (exact on the manifold)."""
        check_event(x, (self.features,), type(self).__name__)
        t = x[..., : self.dim]
        normal = -0.5 * t.square().sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)
        return normal - 0.5 * torch.log1p(self.gradient(t).square().sum(-1))

    @torch.no_grad()
    def distance(self, x: Tensor, *, grid: int | None = None, rounds: int = 5) -> Tensor:
        r"""Euclidean distance from each point of ``x`` (``(n, k + 1)``) to the manifold, shape ``(n,)``.

        The nearest manifold point :math:`(s, h(s))` of :math:`x = (t, y)` satisfies
        :math:`\|s - t\| \le r = |y - h(t)|`, so a grid over the box :math:`[t - r, t + r]^k` is
        searched and then refined ``rounds`` times around its best point (each round shrinks the
        box to two grid spacings): accurate to far below the distances of interest.
        """
        check_event(x, (self.features,), type(self).__name__)
        if x.dim() != 2:
            raise ValueError(
                f"SineManifold.distance: expected points of shape (n, {self.features}), got {tuple(x.shape)}"
            )
        k = self.dim
        grid = grid or (129 if k == 1 else 17)
        t, y = x[:, :k], x[:, k]
        half = (y - self.height(t)).abs().unsqueeze(-1).expand(-1, k) + 1e-12  # (n, k) half-widths
        center = t
        offsets = torch.linspace(-1.0, 1.0, grid, dtype=x.dtype)
        mesh = torch.stack(torch.meshgrid(*([offsets] * k), indexing="ij"), -1).reshape(-1, k)  # (G^k, k)
        best = None
        for _ in range(rounds):
            candidates = center.unsqueeze(1) + mesh * half.unsqueeze(1)  # (n, G^k, k)
            squared = (candidates - t.unsqueeze(1)).square().sum(-1) + (
                self.height(candidates) - y.unsqueeze(1)
            ).square()
            best, index = squared.min(-1)
            center = candidates[torch.arange(len(x)), index]
            half = half * (2.0 / (grid - 1)) * 2
        return best.clamp_min(0).sqrt()
