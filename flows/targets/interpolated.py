r"""Interpolated energies :math:`u_\lambda = (1-\lambda)\,u_0 + \lambda\,u_1` between a prior and a target."""

from __future__ import annotations

from torch import Tensor

from flows.targets.base import EnergyTarget

__all__ = ["InterpolatedEnergy"]


class InterpolatedEnergy(EnergyTarget):
    r"""Linear interpolation of two energies, :math:`u_\lambda(x) = (1-\lambda)\,u_0(x) + \lambda\,u_1(x)`.

    The intermediate targets of Stochastic Normalizing Flows (``InterpolatedEnergy`` in the paper's
    code) and of annealed importance sampling: stochastic blocks placed between the layers of a
    flow sample :math:`e^{-u_\lambda}` with :math:`\lambda` growing from 0 (the prior side) to 1
    (the target side). ``log_Z`` is unknown unless :math:`\lambda \in \{0, 1\}`.

    References:
        Wu, Köhler, Noé (2020), "Stochastic Normalizing Flows", NeurIPS, arXiv:2002.06707.
        Neal (2001), "Annealed importance sampling", Statistics and Computing 11, 125–139.

    Args:
        start: the energy :math:`u_0` (e.g. :class:`~flows.targets.Gaussian` for a standard normal base).
        end: the energy :math:`u_1` (the target).
        lam: the interpolation weight :math:`\lambda \in [0, 1]`.

    Example:
        >>> import torch
        >>> from flows.targets import DoubleWell, Gaussian
        >>> u = InterpolatedEnergy(Gaussian(2), DoubleWell(), 0.5)
        >>> x = torch.randn(3, 2)
        >>> torch.allclose(u.energy(x), 0.5 * Gaussian(2).energy(x) + 0.5 * DoubleWell().energy(x))
        True
    """

    def __init__(self, start: EnergyTarget, end: EnergyTarget, lam: float) -> None:
        for name, value in (("start", start), ("end", end)):
            if not isinstance(value, EnergyTarget):
                raise TypeError(
                    f"InterpolatedEnergy: expected {name} to be an EnergyTarget, got {type(value).__name__}"
                )
        if start.event_shape != end.event_shape:
            raise ValueError(
                f"InterpolatedEnergy: expected energies of the same event shape, got {tuple(start.event_shape)} "
                f"and {tuple(end.event_shape)}"
            )
        if not 0.0 <= float(lam) <= 1.0:
            raise ValueError(f"InterpolatedEnergy: expected lam in [0, 1], got {lam}")
        super().__init__(start.event_shape)
        self.start, self.end, self.lam = start, end, float(lam)
        if self.lam == 0.0:
            self.log_Z = start.log_Z
        elif self.lam == 1.0:
            self.log_Z = end.log_Z

    def energy(self, x: Tensor) -> Tensor:
        if self.lam == 0.0:
            return self.start.energy(x)
        if self.lam == 1.0:
            return self.end.energy(x)
        return (1.0 - self.lam) * self.start.energy(x) + self.lam * self.end.energy(x)

    def extra_repr(self) -> str:
        return f"lam={self.lam}"
