r"""Particle systems: DW4 (4 particles in 2-D, pairwise double well) and LJ13 (13 Lennard-Jones particles in 3-D).

Configurations are flat vectors ``(*batch, n_particles · spatial_dim)`` (particle-major: ``x[..., 0:2]``
is particle 0 of DW4). Both energies are invariant under translations (and rotations and
permutations), so :math:`e^{-u}` is not normalisable on the whole space: these targets live on the
zero-centre-of-mass subspace, ``log_Z`` is unknown and there is no exact sampler. Reference samples
(Klein, Krämer, Noé 2023) are read from the data directory with :meth:`ParticleSystem.reference_samples`,
centred.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from flows.data.files import data_file
from flows.targets.base import EnergyTarget

__all__ = ["DW4", "LJ13", "ParticleSystem"]


class ParticleSystem(EnergyTarget):
    """Base class of pairwise particle targets: shapes, pair distances, centring and reference samples.

    Args:
        n_particles: number of particles.
        spatial_dim: dimension of the space each particle lives in.
    """

    reference_file: str | None = None

    def __init__(self, n_particles: int, spatial_dim: int) -> None:
        super().__init__(n_particles * spatial_dim)
        self.n_particles, self.spatial_dim = n_particles, spatial_dim
        i, j = torch.triu_indices(n_particles, n_particles, offset=1)
        self.register_buffer("_pair_i", i, persistent=False)
        self.register_buffer("_pair_j", j, persistent=False)

    def positions(self, x: Tensor) -> Tensor:
        """``x`` as positions ``(*batch, n_particles, spatial_dim)``."""
        self._check_input(x)
        return x.unflatten(-1, (self.n_particles, self.spatial_dim))

    def distances(self, x: Tensor) -> Tensor:
        r"""Distances :math:`d_{ij} = \|x_i - x_j\|` of the pairs :math:`i < j`, shape ``(*batch, n(n-1)/2)``."""
        pos = self.positions(x)
        diff = pos[..., self._pair_i, :] - pos[..., self._pair_j, :]
        return diff.square().sum(-1).sqrt()

    def centre(self, x: Tensor) -> Tensor:
        """Subtract each configuration's mean particle position (project onto the zero-centre-of-mass subspace)."""
        pos = self.positions(x)
        return (pos - pos.mean(-2, keepdim=True)).flatten(-2)

    def reference_samples(
        self, split: str = "test", data_dir: str | os.PathLike | None = None, *, dtype: torch.dtype | None = None
    ) -> Tensor:
        """Centred reference configurations ``(N, dim)`` from the data directory (checksum-verified).

        Args:
            split: array name in the ``.npz`` file (``"train"``, ``"val"`` or ``"test"`` where present).
            data_dir: data directory (default ``$FLOWS_DATA_DIR``).
            dtype: dtype of the result (default: the target's).

        Raises:
            FileNotFoundError: when the data directory or file is missing.
            ValueError: for an unknown split or a file with the wrong checksum.
        """
        path = data_file(self.reference_file, data_dir)
        with np.load(path) as arrays:
            if split not in arrays.files:
                raise ValueError(f"{type(self).__name__}: expected split in {sorted(arrays.files)}, got {split!r}")
            x = torch.from_numpy(np.asarray(arrays[split], dtype=np.float64))
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"{type(self).__name__}: expected reference samples (N, {self.dim}), got {tuple(x.shape)}")
        return self.centre(x).to(dtype or self._anchor.dtype)

    def extra_repr(self) -> str:
        return f"n_particles={self.n_particles}, spatial_dim={self.spatial_dim}"


class DW4(ParticleSystem):
    r"""Four particles in 2-D with a double-well pair potential (Köhler, Klein, Noé 2020).

    .. math:: u(x) = \sum_{i<j} \big[a (d_{ij} - d_0)^4 + b (d_{ij} - d_0)^2\big], \quad a = 0.9,\ b = -4,\ d_0 = 4,

    at unit temperature (bgflow's ``MultiDoubleWellPotential(8, 4, a=0.9, b=-4, c=0, offset=4)``).
    The reference samples (Klein et al. 2023, file ``dw4_reference_samples.npz``; ``train``/``val``/
    ``test``) are stored uncentred and are centred on loading; their mean energy is about −22.5.

    References:
        Köhler, Klein, Noé (2020), "Equivariant Flows: Exact Likelihood Generative Learning for
        Symmetric Densities", ICML, arXiv:2006.02425. Klein, Krämer, Noé (2023), "Equivariant flow
        matching", NeurIPS, arXiv:2306.15030 (the reference samples).

    Args:
        a, b: quartic and quadratic coefficients.
        d0: the distance the wells are centred on.

    Example:
        >>> import torch
        >>> target = DW4()
        >>> square = torch.tensor([0.0, 0.0, 4.0, 0.0, 4.0, 4.0, 0.0, 4.0])  # sides 4, diagonals 4√2
        >>> round(target.energy(square).item(), 3)
        -8.397
    """

    reference_file = "dw4_reference_samples.npz"

    def __init__(self, *, a: float = 0.9, b: float = -4.0, d0: float = 4.0) -> None:
        super().__init__(4, 2)
        self.a, self.b, self.d0 = float(a), float(b), float(d0)

    def energy(self, x: Tensor) -> Tensor:
        r = self.distances(x) - self.d0
        r2 = r.square()
        return self._overflow_to_inf((self.a * r2.square() + self.b * r2).sum(-1), x)

    def extra_repr(self) -> str:
        return f"a={self.a}, b={self.b}, d0={self.d0}"


class LJ13(ParticleSystem):
    r"""Thirteen Lennard-Jones particles in 3-D in a harmonic trap around their centre (Köhler et al. 2020).

    .. math:: u(x) = 2 \sum_{i<j} \big[d_{ij}^{-12} - 2\,d_{ij}^{-6}\big] + \tfrac12 \sum_i \|x_i - \bar x\|^2,

    i.e. :math:`\varepsilon = 1, r_m = 1`, with the Lennard-Jones sum over **ordered** pairs (every
    pair counted twice), as the reference code computes it: the reference samples (Klein et al.
    2023, ``lj13_reference_samples.npz``, ``val``/``test``) are stationary for this energy and not
    for the unordered sum. On them :math:`\langle u\rangle \approx -43.1` and the virial
    :math:`\langle x \cdot \nabla u\rangle \approx 36.0` (39 − 3 degrees of freedom).

    References:
        Köhler, Klein, Noé (2020), "Equivariant Flows: Exact Likelihood Generative Learning for
        Symmetric Densities", ICML, arXiv:2006.02425. Klein, Krämer, Noé (2023), "Equivariant flow
        matching", NeurIPS, arXiv:2306.15030 (the reference samples).

    Args:
        epsilon: well depth :math:`\varepsilon` per ordered pair.
        r_m: distance of the pair minimum.
        oscillator: spring constant of the harmonic trap.

    Example:
        >>> import torch
        >>> target = LJ13()
        >>> x = torch.zeros(13, 3)
        >>> x[1, 0] = 1.0  # one pair at the minimum distance, the others far apart
        >>> x[2:, 0] = 100.0 * torch.arange(2, 13)
        >>> lj = target.energy(x.flatten()) - 0.5 * target.centre(x.flatten()).square().sum()
        >>> round(lj.item(), 3)
        -2.0
    """

    reference_file = "lj13_reference_samples.npz"

    def __init__(self, *, epsilon: float = 1.0, r_m: float = 1.0, oscillator: float = 1.0) -> None:
        super().__init__(13, 3)
        self.epsilon, self.r_m, self.oscillator = float(epsilon), float(r_m), float(oscillator)

    def energy(self, x: Tensor) -> Tensor:
        inv6 = (self.r_m / self.distances(x)).pow(6)
        lj = 2 * self.epsilon * (inv6.square() - 2 * inv6).sum(-1)
        return self._overflow_to_inf(lj + 0.5 * self.oscillator * self.centre(x).square().sum(-1), x)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, r_m={self.r_m}, oscillator={self.oscillator}"
