"""Energy targets pi(x) ∝ exp(-u(x)) for Boltzmann sampling and MCMC."""

from flows.targets.base import EnergyTarget

__all__ = ["EnergyTarget"]
