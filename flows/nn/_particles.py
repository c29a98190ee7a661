r"""Geometry of flat particle configurations shared by the equivariant networks and ``flows.particles``.

A configuration of ``n`` particles in ``d`` dimensions is a flat row of ``n·d`` numbers (particle-major).
It lives here, below both :mod:`flows.nn.egnn` and :mod:`flows.particles`, so that the network does not
import the particle wing above it.
"""

from __future__ import annotations

from torch import Tensor

from flows._validation import check_count

__all__ = ["remove_mean"]


def _check_sizes(n_particles: int, spatial_dim: int, who: str) -> None:
    for name, value, low in (("n_particles", n_particles, 2), ("spatial_dim", spatial_dim, 1)):
        check_count(who, name, value, minimum=low)


def remove_mean(x: Tensor, n_particles: int, spatial_dim: int) -> Tensor:
    r"""Project flat configurations ``(*batch, n·d)`` onto the zero-centre-of-mass subspace.

    :math:`P x = x - \mathbf 1 \otimes \bar x` with :math:`\bar x = \frac1n \sum_i x_i`: the
    orthogonal projection (it is symmetric and idempotent).

    Example:
        >>> import torch
        >>> remove_mean(torch.tensor([1.0, 2.0, 3.0, 6.0]), 2, 2).tolist()
        [-1.0, -2.0, 1.0, 2.0]
    """
    pos = x.unflatten(-1, (n_particles, spatial_dim))
    return (pos - pos.mean(-2, keepdim=True)).flatten(-2)
