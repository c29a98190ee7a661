r"""Lattice field targets: the φ⁴ field of Gabrié, Rotskoff, Vanden-Eijnden on 1-D and 2-D grids."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from flows._validation import check_count
from flows.targets.base import EnergyTarget

__all__ = ["PhiFour"]


class PhiFour(EnergyTarget):
    r"""φ⁴ (Ginzburg–Landau) field on an ``N``-site line or an ``N × N`` square grid, at inverse temperature β.

    .. math:: U(\phi) = \frac{aN}{2} \sum_{\langle i,j \rangle} (\phi_i - \phi_j)^2
        + \frac{1}{aN} \sum_i \Big[\frac{(1 - \phi_i^2)^2}{4} + b\,\phi_i\Big], \qquad u = \beta U,

    where :math:`\langle i,j\rangle` runs over nearest-neighbour bonds (each once). With Dirichlet
    boundaries (``boundary="dirichlet"``, the default) the field is 0 beyond both ends of every
    axis, so a line has :math:`N + 1` bonds; with ``"periodic"`` it wraps around. For :math:`b = 0`
    the density is symmetric under :math:`\phi \to -\phi` and, at the default
    :math:`a = 0.1, \beta = 20`, strongly bimodal (the field sits near :math:`+1` or :math:`-1`);
    :meth:`magnetization` tells the modes apart. ``log_Z`` is unknown and there is no exact sampler.

    Events have shape ``(N,)`` for ``dims=1`` and ``(N, N)`` for ``dims=2`` (flatten them for vector
    flows).

    References:
        Gabrié, Rotskoff, Vanden-Eijnden (2022), "Adaptive Monte Carlo augmented with normalizing
        flows", PNAS 119(10), arXiv:2105.12603 (the energy and :math:`a = 0.1, b = 0, \beta = 20`).
        Grenioux, Durmus, Moulines, Gabrié (2023), "On Sampling with Approximate Transport Maps",
        ICML, arXiv:2302.04763 (1-D grids of 64–256 sites).

    Args:
        n: number of sites along each axis.
        dims: 1 (a line) or 2 (a square grid).
        a: coupling coefficient (positive).
        b: local field.
        beta: inverse temperature (positive).
        boundary: ``"dirichlet"`` (zero field outside) or ``"periodic"``.

    Example:
        >>> import torch
        >>> target = PhiFour(8)
        >>> up, down = torch.ones(8), -torch.ones(8)
        >>> torch.allclose(target.energy(up), target.energy(down))  # b = 0: symmetric modes
        True
        >>> bool(target.energy(up) < target.energy(torch.zeros(8)))
        True
    """

    def __init__(
        self,
        n: int,
        *,
        dims: int = 1,
        a: float = 0.1,
        b: float = 0.0,
        beta: float = 20.0,
        boundary: str = "dirichlet",
    ) -> None:
        name = type(self).__name__
        check_count(name, "n", n, minimum=2)
        if dims not in (1, 2):
            raise ValueError(f"{name}: expected dims 1 or 2, got {dims!r}")
        if not a > 0 or not beta > 0:
            raise ValueError(f"{name}: expected positive a and beta, got a={a}, beta={beta}")
        if boundary not in ("dirichlet", "periodic"):
            raise ValueError(f"{name}: expected boundary 'dirichlet' or 'periodic', got {boundary!r}")
        super().__init__((n,) * dims)
        self.n, self.dims, self.a, self.b, self.beta, self.boundary = n, dims, float(a), float(b), float(beta), boundary

    def _bond_sum(self, x: Tensor) -> Tensor:
        r""":math:`\sum_{\langle i,j\rangle} (\phi_i - \phi_j)^2` over the grid, shape ``batch``."""
        total = None
        for axis in range(-self.dims, 0):
            if self.boundary == "periodic":
                diff = x.roll(-1, dims=axis) - x
            else:
                pad = [0, 0] * self.dims
                pad[2 * (-axis - 1)] = pad[2 * (-axis - 1) + 1] = 1
                diff = F.pad(x, pad).diff(dim=axis)
            term = diff.square().flatten(-self.dims).sum(-1)
            total = term if total is None else total + term
        return total

    def potential(self, x: Tensor) -> Tensor:
        r"""The energy :math:`U(\phi)` at :math:`\beta = 1`, shape ``batch``."""
        self._check_input(x)
        coef = self.a * self.n
        local = (0.25 * (1 - x.square()).square() + self.b * x).flatten(-self.dims).sum(-1)
        return self._overflow_to_inf(0.5 * coef * self._bond_sum(x) + local / coef, x)

    def energy(self, x: Tensor) -> Tensor:
        return self.beta * self.potential(x)

    def magnetization(self, x: Tensor) -> Tensor:
        r"""Mean field :math:`\bar\phi` (average over sites), shape ``batch``; its sign names the mode."""
        self._check_input(x)
        return x.flatten(-self.dims).mean(-1)

    def extra_repr(self) -> str:
        return f"n={self.n}, dims={self.dims}, a={self.a}, b={self.b}, beta={self.beta}, boundary={self.boundary!r}"
