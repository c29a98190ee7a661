r"""Alignment of particle configurations over their symmetry group, and equivariant OT couplings for flow matching.

Two configurations :math:`x, z \in \mathbb R^{n \times d}` (centred) are aligned by the
permutation :math:`\sigma` and orthogonal matrix :math:`R` that make
:math:`\|R\,x_\sigma - z\|^2` small: :math:`\sigma` by an assignment on the inter-particle
squared distances (:func:`scipy.optimize.linear_sum_assignment`), then :math:`R` by Kabsch's
algorithm. :class:`EquivariantOTCoupling` aligns every data–noise pair of a batch this way before
the optimal assignment between the batches (Klein, Krämer, Noé 2023), so flow-matching paths are
short; :func:`path_lengths` reports the mean straight-path length of a coupling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from flows.pairs import ot_assignment
from flows.particles.mean_free import _check_sizes, remove_mean

__all__ = ["EquivariantOTCoupling", "align", "best_permutation", "kabsch", "path_lengths"]


def kabsch(x: Tensor, z: Tensor, *, reflections: bool = True) -> Tensor:
    r"""The orthogonal matrix :math:`R` minimising :math:`\sum_i \|R x_i - z_i\|^2` (Kabsch 1976).

    With :math:`H = x^\top z = U S V^\top` (SVD), :math:`R = V U^\top`; without ``reflections``
    the sign of the last singular direction is flipped when :math:`\det(VU^\top) < 0` so that
    :math:`R \in SO(d)`. Both point sets should be centred (translations are not fitted).

    Args:
        x: points to rotate, ``(*batch, n, d)``.
        z: reference points, the same shape.
        reflections: allow improper rotations (:math:`O(d)`) or not (:math:`SO(d)`).

    Returns:
        ``R``, shape ``(*batch, d, d)``: the aligned points are ``x @ R.mT``.

    References:
        Kabsch (1976), "A solution for the best rotation to relate two sets of vectors", Acta
        Crystallographica A32.

    Example:
        >>> import math, torch
        >>> c, s = math.cos(0.7), math.sin(0.7)
        >>> rot = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> torch.allclose(kabsch(x, x @ rot.T), rot)
        True
    """
    if x.shape != z.shape or x.dim() < 2:
        raise ValueError(
            f"kabsch: expected x and z of the same shape (*batch, n, d), got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    u, _, vh = torch.linalg.svd(x.mT @ z)
    r = vh.mT @ u.mT
    if not reflections:
        sign = torch.sign(torch.linalg.det(r))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        flip = torch.ones(r.shape[:-1], dtype=r.dtype, device=r.device)
        flip[..., -1] = sign
        r = vh.mT @ (flip[..., :, None] * u.mT)
    return r


def best_permutation(x: Tensor, z: Tensor) -> Tensor:
    r"""The permutation :math:`\sigma` minimising :math:`\sum_i \|x_{\sigma(i)} - z_i\|^2` for one pair.

    Args:
        x: ``(n, d)`` points to permute.
        z: ``(n, d)`` reference points.

    Returns:
        ``sigma``, a ``LongTensor`` ``(n,)``: ``x[sigma]`` is matched to ``z``.

    Example:
        >>> import torch
        >>> z = torch.randn(6, 3)
        >>> perm = torch.tensor([3, 0, 5, 1, 4, 2])
        >>> torch.equal(z[perm][best_permutation(z[perm], z)], z)
        True
    """
    if x.shape != z.shape or x.dim() != 2:
        raise ValueError(
            f"best_permutation: expected x and z of the same shape (n, d), got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    cost = torch.cdist(z.detach().double(), x.detach().double()).square().cpu().numpy()
    _, cols = linear_sum_assignment(cost)
    return torch.from_numpy(cols).to(device=x.device, dtype=torch.long)


def align(x: Tensor, z: Tensor, n_particles: int, spatial_dim: int, *, reflections: bool = True) -> Tensor:
    r"""Align flat configurations ``x`` to ``z`` pair by pair: centre, permute (assignment), then rotate (Kabsch).

    Args:
        x: configurations to move, ``(N, n·d)``.
        z: reference configurations, ``(N, n·d)`` (or broadcastable, e.g. ``(1, n·d)``).
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        reflections: allow reflections in the orthogonal alignment.

    Returns:
        the aligned, centred configurations ``(N, n·d)``: the same points up to a permutation, an
        orthogonal map and a translation.
    """
    _check_sizes(n_particles, spatial_dim, "align")
    shape = (n_particles, spatial_dim)
    x = remove_mean(x, *shape).unflatten(-1, shape)
    z = remove_mean(z, *shape).unflatten(-1, shape).expand_as(x)
    if len(x):
        # all cost matrices in one call, then one small assignment per pair
        costs = torch.cdist(z.detach().double(), x.detach().double()).square().cpu().numpy()
        perms = np.stack([linear_sum_assignment(c)[1] for c in costs])
        perms = torch.from_numpy(perms).to(device=x.device, dtype=torch.long)
        x = torch.gather(x, 1, perms[..., None].expand_as(x))
    r = kabsch(x, z, reflections=reflections)
    return (x @ r.mT).flatten(-2)


class EquivariantOTCoupling:
    r"""Equivariant optimal-transport coupling of a data batch with a noise batch (Klein, Krämer, Noé 2023).

    For every pair :math:`(x_i, z_j)` of the two batches, the data configuration is aligned to the
    noise configuration over the symmetry group, :math:`\tilde x_{ij} = R_{ij}\, (x_i)_{\sigma_{ij}}`
    (:func:`align`: permutation by assignment on squared particle distances, then Kabsch), and
    the cost is :math:`C_{ij} = \|\tilde x_{ij} - z_j\|^2`. The optimal assignment :math:`\pi` of the
    batches under :math:`C` (:func:`scipy.optimize.linear_sum_assignment`) then pairs
    :math:`z_j` with :math:`\tilde x_{\pi(j) j}`. Aligned data are still samples of an invariant
    target, so the flow-matching objective is unchanged while paths get shorter. With ``ot=False``
    the pairs are kept and only aligned (:math:`\tilde x_{jj}`, :math:`N` alignments instead of
    :math:`N^2`).

    The call signature is the flow-matching coupling interface:
    ``coupling(x, z) -> (x', z')`` with ``x`` the data and ``z`` the base samples, both
    ``(N, n·d)``. It costs :math:`N^2` small assignments (a Python loop over scipy: about a third of
    a second for ``N = 128`` and LJ13 on one core).

    References:
        Klein, Krämer, Noé (2023), "Equivariant flow matching", NeurIPS, arXiv:2306.15030.
        Tong et al. (2023), "Improving and generalizing flow-based generative models with
        minibatch optimal transport", arXiv:2302.00482.

    Args:
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        reflections: allow reflections in the orthogonal alignment (the EGNN field and the usual
            pair energies are reflection invariant).
        ot: re-pair the batches by the optimal assignment after aligning.

    Example:
        >>> import torch
        >>> coupling = EquivariantOTCoupling(4, 2)
        >>> x, z = torch.randn(6, 8), torch.randn(6, 8)
        >>> x2, z2 = coupling(x, z)
        >>> x2.shape, torch.equal(z2, z)
        (torch.Size([6, 8]), True)
    """

    def __init__(self, n_particles: int, spatial_dim: int, *, reflections: bool = True, ot: bool = True) -> None:
        _check_sizes(n_particles, spatial_dim, "EquivariantOTCoupling")
        self.n_particles, self.spatial_dim, self.reflections, self.ot = n_particles, spatial_dim, reflections, ot

    def __call__(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        features = self.n_particles * self.spatial_dim
        if x.dim() != 2 or x.shape != z.shape or x.shape[-1] != features:
            raise ValueError(
                f"EquivariantOTCoupling: expected x and z of shape (N, {features}), "
                f"got {tuple(x.shape)} and {tuple(z.shape)}"
            )
        shape = (self.n_particles, self.spatial_dim)
        with torch.no_grad():
            if not self.ot:
                return align(x, z, *shape, reflections=self.reflections).to(x.dtype), z
            n = x.shape[0]
            xs = x.repeat_interleave(n, 0)  # row i*n + j: x_i aligned to z_j
            zs = z.repeat(n, 1)
            aligned = align(xs, zs, *shape, reflections=self.reflections)
            cost = (aligned - remove_mean(zs, *shape)).square().sum(-1).reshape(n, n)
            rows, cols = linear_sum_assignment(cost.double().cpu().numpy())
            pi = np.empty_like(rows)
            pi[cols] = rows  # z_j is paired with x_{pi[j]}
            index = torch.from_numpy(pi).to(x.device) * n + torch.arange(n, device=x.device)
            return aligned[index].to(x.dtype), z

    def __repr__(self) -> str:
        return (
            f"EquivariantOTCoupling(n_particles={self.n_particles}, spatial_dim={self.spatial_dim}, "
            f"reflections={self.reflections}, ot={self.ot})"
        )


def _independent(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    return x, z


def _ot(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    return x[ot_assignment(z, x)], z


def path_lengths(
    x: Tensor,
    z: Tensor,
    n_particles: int,
    spatial_dim: int,
    *,
    batch_size: int = 128,
    couplings: dict[str, Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] | None = None,
) -> dict[str, float]:
    r"""Mean transport path length :math:`\frac1N \sum_j \|x'_j - z'_j\|` of couplings, batch by batch.

    The straight path of flow matching from :math:`x'` to :math:`z'` has exactly this length; it
    is the quantity Klein, Krämer, Noé (2023) compare across couplings. Data rows are centred first.

    Args:
        x: data ``(N, n·d)``.
        z: base samples ``(N, n·d)`` (mean free).
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        batch_size: the coupling's batch (minibatch OT).
        couplings: name → coupling callable; default independent, OT (:func:`flows.pairs.ot_assignment`)
            and equivariant OT (:class:`EquivariantOTCoupling`).

    Returns:
        name → mean path length.

    Example:
        >>> import torch
        >>> x, z = torch.randn(32, 8), torch.randn(32, 8)
        >>> lengths = path_lengths(x, z, 4, 2, batch_size=16)
        >>> lengths["equivariant OT"] <= lengths["OT"] <= lengths["independent"]
        True
    """
    if x.shape != z.shape or x.dim() != 2:
        raise ValueError(
            f"path_lengths: expected x and z of the same shape (N, n·d), got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    if couplings is None:
        couplings = {
            "independent": _independent,
            "OT": _ot,
            "equivariant OT": EquivariantOTCoupling(n_particles, spatial_dim),
        }
    x = remove_mean(x, n_particles, spatial_dim)
    out = {}
    for name, coupling in couplings.items():
        total = 0.0
        for start in range(0, x.shape[0], batch_size):
            a, b = coupling(x[start : start + batch_size], z[start : start + batch_size])
            total += float((a - b).square().sum(-1).sqrt().sum())
        out[name] = total / x.shape[0]
    return out
