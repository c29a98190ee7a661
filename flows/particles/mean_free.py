r"""The zero-centre-of-mass subspace of particle configurations and the mean-free Gaussian on it.

A configuration of ``n`` particles in ``d`` dimensions is a flat row ``x`` of ``n·d`` numbers
(particle-major: ``x[..., i·d:(i+1)·d]`` is particle ``i``). Energies of isolated particle systems
are translation invariant, so densities live on the subspace
:math:`\mathcal X = \{x : \sum_i x_i = 0\}` of dimension :math:`(n-1)\,d`; see ``docs/particles.md``
for the dimension bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_event
from flows.distributions import Distribution
from flows.nn._particles import _check_sizes
from flows.nn._particles import remove_mean as _project
from flows.particles._inputs import check_configurations

__all__ = ["MeanFreeNormal", "remove_mean", "subspace_basis"]


MAX_BASIS_ENTRIES = 1 << 27
"""The largest basis :func:`subspace_basis` builds (``n·d × (n−1)·d`` entries; 1 GiB in float64)."""


def remove_mean(x: Tensor, n_particles: int, spatial_dim: int) -> Tensor:
    r"""Project flat configurations ``(*batch, n·d)`` onto the zero-centre-of-mass subspace, checking them first.

    :math:`P x = x - \mathbf 1 \otimes \bar x` with :math:`\bar x = \frac1n \sum_i x_i`: the
    orthogonal projection. The input goes through the particle functions' one check (a tensor of
    width ``n·d``, bool/int promoted to float64, zero rows allowed); a NaN or infinite coordinate
    makes its configuration's row NaN (every particle shares the centre of mass), the other rows
    are unchanged. The layers use the unchecked projection of :mod:`flows.nn._particles`.

    Raises:
        TypeError: for a non-tensor or complex input, or non-integer sizes.
        ValueError: for bad sizes or a last dimension other than ``n·d``.

    Example:
        >>> import torch
        >>> remove_mean(torch.tensor([1.0, 2.0, 3.0, 6.0]), 2, 2).tolist()
        [-1.0, -2.0, 1.0, 2.0]
    """
    x = check_configurations(x, "remove_mean", "x", n_particles, spatial_dim, ndim=None)
    return _project(x, n_particles, spatial_dim)


def subspace_basis(n_particles: int, spatial_dim: int, *, dtype: torch.dtype | None = None) -> Tensor:
    r"""An orthonormal basis of the zero-centre-of-mass subspace, as the columns of ``(n·d, (n−1)·d)``.

    Built from the Helmert contrasts of the particle index, tensored with the identity in space:
    ``Q.T @ Q = I`` and ``Q @ Q.T`` is the projection :func:`remove_mean`.

    Example:
        >>> Q = subspace_basis(3, 2, dtype=torch.float64)
        >>> Q.shape, torch.allclose(Q.T @ Q, torch.eye(4, dtype=torch.float64))
        (torch.Size([6, 4]), True)
    """
    _check_sizes(n_particles, spatial_dim, "subspace_basis")
    entries = n_particles * spatial_dim * (n_particles - 1) * spatial_dim
    if entries > MAX_BASIS_ENTRIES:
        raise ValueError(
            f"subspace_basis: expected a basis of at most {MAX_BASIS_ENTRIES} entries, got n_particles={n_particles}, "
            f"spatial_dim={spatial_dim} ({entries} entries)"
        )
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"subspace_basis: expected a floating-point dtype, got {dtype!r}")
    n = n_particles
    helmert = torch.zeros(n, n - 1, dtype=torch.float64)
    for k in range(1, n):  # column k-1: (1, ..., 1, -k, 0, ...) / sqrt(k (k+1)), k ones
        helmert[:k, k - 1] = 1.0
        helmert[k, k - 1] = -float(k)
        helmert[:, k - 1] /= math.sqrt(k * (k + 1))
    basis = torch.kron(helmert, torch.eye(spatial_dim, dtype=torch.float64))
    return basis.to(dtype or torch.get_default_dtype())


class MeanFreeNormal(Distribution):
    r"""Standard normal on the zero-centre-of-mass subspace of ``n`` particles in ``d`` dimensions.

    Samples are :math:`z = P\varepsilon`, :math:`\varepsilon \sim \mathcal N(0, I_{nd})`, with
    :math:`P` the projection :func:`remove_mean`: a standard normal in any orthonormal coordinates
    :math:`s = Q^\top z` of the subspace (:func:`subspace_basis`). The density is normalised on
    that :math:`(n-1)d`-dimensional subspace (Lebesgue measure of the coordinates :math:`s`):

    .. math:: \log p(z) = -\tfrac12 \|P z\|^2 - \tfrac{(n-1)d}{2} \log 2\pi .

    An input off the subspace is evaluated at its projection :math:`Pz` (its centre of mass is
    ignored), so ``log_prob`` is translation invariant. Negative log-likelihoods "without the
    constant" (bgflow's convention, Köhler et al. 2020; Klein et al. 2023) drop the second term;
    see :func:`flows.particles.nll_conventions`.

    References:
        Köhler, Klein, Noé (2020), "Equivariant Flows: Exact Likelihood Generative Learning for
        Symmetric Densities", ICML, arXiv:2006.02425. Satorras, Hoogeboom, Fuchs, Posner, Welling
        (2021), "E(n) Equivariant Normalizing Flows", NeurIPS, arXiv:2105.09016.

    Args:
        n_particles: number of particles ``n`` (at least 2).
        spatial_dim: spatial dimension ``d``.

    Example:
        >>> import torch
        >>> base = MeanFreeNormal(4, 2)
        >>> z = base.sample((3,))
        >>> z.shape, bool(z.unflatten(-1, (4, 2)).sum(-2).abs().max() < 1e-5)
        (torch.Size([3, 8]), True)
        >>> round(base.log_prob(torch.zeros(8)).item(), 4) == round(-3 * math.log(2 * math.pi), 4)
        True
    """

    def __init__(self, n_particles: int, spatial_dim: int) -> None:
        _check_sizes(n_particles, spatial_dim, "MeanFreeNormal")
        super().__init__(n_particles * spatial_dim)
        self.n_particles, self.spatial_dim = n_particles, spatial_dim
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    @property
    def subspace_dim(self) -> int:
        """Dimension :math:`(n-1)d` of the subspace the density lives on."""
        return (self.n_particles - 1) * self.spatial_dim

    @property
    def log_normalizer(self) -> float:
        r""":math:`\tfrac{(n-1)d}{2}\log 2\pi`, the constant that bgflow-style NLLs leave out."""
        return 0.5 * self.subspace_dim * math.log(2 * math.pi)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        return -0.5 * _project(x, self.n_particles, self.spatial_dim).square().sum(-1) - self.log_normalizer

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        a = self._anchor
        eps = torch.randn(self._sample_shape(sample_shape, context), dtype=a.dtype, device=a.device)
        return _project(eps, self.n_particles, self.spatial_dim)

    def extra_repr(self) -> str:
        return f"n_particles={self.n_particles}, spatial_dim={self.spatial_dim}"
