r"""Particle systems: E(n)-equivariant continuous flows, the mean-free Gaussian, equivariant OT couplings, evaluation.

See ``docs/particles.md`` for the dimension bookkeeping on the zero-centre-of-mass subspace and the
two NLL conventions of the literature.
"""

from flows.nn.egnn import EGNN
from flows.particles.alignment import (
    EquivariantOTCoupling,
    align,
    aligned_distances,
    best_permutation,
    kabsch,
    path_lengths,
)
from flows.particles.builders import EquivariantCNF
from flows.particles.evaluation import BoltzmannEvaluation, boltzmann_evaluation, nll_conventions, particle_nll
from flows.particles.mean_free import MeanFreeNormal, remove_mean, subspace_basis

__all__ = [
    "EGNN",
    "BoltzmannEvaluation",
    "EquivariantCNF",
    "EquivariantOTCoupling",
    "MeanFreeNormal",
    "align",
    "aligned_distances",
    "best_permutation",
    "boltzmann_evaluation",
    "kabsch",
    "nll_conventions",
    "particle_nll",
    "path_lengths",
    "remove_mean",
    "subspace_basis",
]
