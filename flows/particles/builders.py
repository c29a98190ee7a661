r""":class:`EquivariantCNF`: a continuous flow over particle configurations with an EGNN field and a mean-free base."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flows._validation import check_hidden
from flows.architectures.registry import register
from flows.bijections.continuous import CNF
from flows.flow import Flow
from flows.nn.egnn import EGNN
from flows.particles.mean_free import MeanFreeNormal

__all__ = ["EquivariantCNF"]

_HIDDEN = (32, 32, 32)


@register
class EquivariantCNF(Flow):
    r"""E(n)-equivariant continuous normalizing flow for ``n`` identical particles in ``d`` dimensions.

    One :class:`~flows.CNF` whose field is an :class:`~flows.particles.EGNN`, and a
    :class:`~flows.particles.MeanFreeNormal` base. Data are flat rows ``(N, n·d)``. Dimension
    bookkeeping (``docs/particles.md``): the field is translation invariant and mean free, so the
    flow moves every configuration within its translate of the zero-centre-of-mass subspace, the
    full :math:`nd \times nd` Jacobian of the solution map is the identity along translations,
    and the exact trace the CNF integrates over all :math:`nd` coordinates equals the trace on the
    :math:`(n-1)d`-dimensional subspace. Hence

    .. math::
        \log q(x) = \log \mathcal N_{\text{mean-free}}(f(x))
        + \int_{t_0}^{t_1} \operatorname{tr} \frac{\partial v}{\partial z}\,dt

    is a density on the subspace, normalised there, and invariant under translations,
    permutations, rotations and reflections of ``x``. The exact trace is taken in one
    forward-mode pass that skips the tangents which cannot reach it (:meth:`EGNN.divergence`).
    Train it by maximum likelihood (``log_prob``, the trace differentiated through the solver) or
    by flow matching with
    :class:`~flows.particles.EquivariantOTCoupling`.

    References:
        Satorras, Hoogeboom, Fuchs, Posner, Welling (2021), "E(n) Equivariant Normalizing Flows",
        NeurIPS, arXiv:2105.09016. Klein, Krämer, Noé (2023), "Equivariant flow matching",
        NeurIPS, arXiv:2306.15030.

    Args:
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        hidden: widths of the EGNN's message-passing layers, one entry per layer, all equal (an
            EGNN keeps one width).
        method: ODE solver of the CNF.
        rtol, atol: its tolerances (the reference code of Klein et al. evaluates with dopri5 at 1e-4).
        **options: further :class:`~flows.CNF` keywords (``t0``, ``t1``, ``adjoint``, ``trace``, ...).

    Example:
        >>> import torch
        >>> flow = EquivariantCNF(4, 2, hidden=(8,))
        >>> x, log_q = flow.sample_and_log_prob((3,))
        >>> x.shape, torch.allclose(flow.log_prob(x), log_q, atol=1e-3)
        (torch.Size([3, 8]), True)
    """

    def __init__(
        self,
        n_particles: int,
        spatial_dim: int,
        *,
        hidden: Sequence[int] = _HIDDEN,
        method: str = "dopri5",
        rtol: float = 1e-5,
        atol: float = 1e-5,
        **options: Any,
    ) -> None:
        hidden = check_hidden("EquivariantCNF", hidden, minimum_layers=1)
        if len(set(hidden)) != 1:
            raise ValueError(f"EquivariantCNF: expected equal hidden widths (an EGNN keeps one width), got {hidden}")
        field = EGNN(n_particles, spatial_dim, width=hidden[0], layers=len(hidden))
        cnf = CNF(n_particles * spatial_dim, field=field, method=method, rtol=rtol, atol=atol, **options)
        super().__init__(cnf, MeanFreeNormal(n_particles, spatial_dim), context=0)
        self.n_particles, self.spatial_dim = n_particles, spatial_dim
