"""Energy targets pi(x) ∝ exp(-u(x)) for Boltzmann sampling and MCMC.

Every target is an :class:`EnergyTarget`: ``energy(x)``, ``log_prob(x)``, ``energy_and_grad(x)``,
``log_Z`` (``None`` when unknown) and ``sample(n)`` where an exact sampler exists.
Samplers and stochastic layers ask only for the :class:`Energy` protocol (``event_shape``,
``energy``, ``energy_and_grad``).
"""

from flows._energy import Energy
from flows.targets.alanine import AlanineDipeptide
from flows.targets.base import EnergyTarget, ProtocolTarget, as_target
from flows.targets.interpolated import InterpolatedEnergy, TemperedEnergy
from flows.targets.lattice import PhiFour
from flows.targets.mixtures import Gaussian, GaussianMixture
from flows.targets.openmm import OpenMMTarget
from flows.targets.particles import DW4, LJ13, ParticleSystem
from flows.targets.toy import Banana, Funnel
from flows.targets.transformed import TransformedTarget
from flows.targets.wells import DoubleWell, ManyWell, MullerBrown

__all__ = [
    "DW4",
    "LJ13",
    "AlanineDipeptide",
    "Banana",
    "DoubleWell",
    "Energy",
    "EnergyTarget",
    "Funnel",
    "Gaussian",
    "GaussianMixture",
    "InterpolatedEnergy",
    "ManyWell",
    "MullerBrown",
    "OpenMMTarget",
    "ParticleSystem",
    "PhiFour",
    "ProtocolTarget",
    "TemperedEnergy",
    "TransformedTarget",
    "as_target",
]
