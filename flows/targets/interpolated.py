r"""Derived energies: interpolations :math:`(1-\lambda)u_0 + \lambda u_1` and tempered energies :math:`u/T`."""

from __future__ import annotations

import math

from torch import Tensor

from flows.targets.base import EnergyTarget, as_target

__all__ = ["InterpolatedEnergy", "TemperedEnergy"]


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
        start, end = as_target(start, "InterpolatedEnergy", "start"), as_target(end, "InterpolatedEnergy", "end")
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
        self._check_input(x)
        if self.lam == 0.0:
            u = self.start.energy(x)
        elif self.lam == 1.0:
            u = self.end.energy(x)
        else:
            u = (1.0 - self.lam) * self.start.energy(x) + self.lam * self.end.energy(x)
        return self._overflow_to_inf(u, x)

    def extra_repr(self) -> str:
        return f"lam={self.lam}"


class TemperedEnergy(EnergyTarget):
    r"""A target at temperature :math:`T`: :math:`u_T(x) = u(x)/T`, with ``temperature`` a mutable attribute.

    Share one instance between a :class:`~flows.train.ReverseKL` objective and the stochastic
    blocks of a flow, and anneal its ``temperature`` (e.g. with
    :class:`~flows.train.AnnealTemperature`): the blocks then stay stationary for the very density
    the loss targets at every step. (Annealing only the objective's temperature while the blocks
    sample the cold target makes them push samples away from the tempered target during training.)
    ``log_Z`` is the target's at :math:`T = 1` and ``None`` otherwise.

    Args:
        target: the energy :math:`u`.
        temperature: the initial :math:`T` (positive).

    Example:
        >>> import torch
        >>> from flows.targets import DoubleWell
        >>> hot = TemperedEnergy(DoubleWell(), temperature=2.0)
        >>> x = torch.randn(3, 2)
        >>> torch.allclose(hot.energy(x), DoubleWell().energy(x) / 2)
        True
        >>> hot.log_Z is None
        True
    """

    def __init__(self, target: EnergyTarget, temperature: float = 1.0) -> None:
        target = as_target(target, "TemperedEnergy")
        super().__init__(target.event_shape)
        self.target = target
        self.temperature = temperature

    @property
    def temperature(self) -> float:
        """The temperature :math:`T` (set it to anneal)."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"TemperedEnergy: expected a positive finite temperature, got {value}")
        self._temperature = value

    @property
    def log_Z(self) -> float | None:
        """The target's ``log_Z`` at :math:`T = 1`, else ``None`` (unknown)."""
        return self.target.log_Z if self._temperature == 1.0 else None

    def energy(self, x: Tensor) -> Tensor:
        self._check_input(x)
        u = self.target.energy(x)
        return self._overflow_to_inf(u if self._temperature == 1.0 else u / self._temperature, x)

    def extra_repr(self) -> str:
        return f"temperature={self._temperature}"
