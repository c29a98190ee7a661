r"""Alignment of particle configurations over their symmetry group, and equivariant OT couplings for flow matching.

Two configurations :math:`x, z \in \mathbb R^{n \times d}` (centred) are aligned by the
permutation :math:`\sigma` and orthogonal matrix :math:`R` that minimise
:math:`\|R\,x_\sigma - z\|^2`. For a fixed :math:`\sigma` the best :math:`R` is Kabsch's, and
the minimum is :math:`\|x\|^2 + \|z\|^2 - 2\,\|x_\sigma^\top z\|_*` (nuclear norm over
:math:`O(d)`), so for a few particles (DW4: 24 permutations) the minimum over the whole group is
computed exactly, for all pairs of two batches in a couple of matrix products. For more particles
:math:`\sigma` comes from an assignment on the inter-particle squared distances
(:func:`scipy.optimize.linear_sum_assignment`) and :math:`R` from Kabsch, as in Klein, Krämer,
Noé (2023). :class:`EquivariantOTCoupling` aligns data–noise pairs this way around the optimal
assignment between the batches, so flow-matching paths are short; :func:`path_lengths` reports
the mean straight-path length of a coupling.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from flows._validation import check_count, check_samples
from flows.nn._particles import _check_sizes, remove_mean
from flows.particles._inputs import check_configurations, non_finite_rows
from flows.train.pairs import ot_assignment

__all__ = [
    "MAX_EXACT",
    "EquivariantOTCoupling",
    "align",
    "aligned_distances",
    "best_permutation",
    "kabsch",
    "path_lengths",
]


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
        ``R``, shape ``(*batch, d, d)``: the aligned points are ``x @ R.mT``; all NaN for a batch
        element whose points hold a NaN or infinite value (no rotation fits them). Integer and
        bool points are promoted to float64.

    Raises:
        TypeError: for non-tensor or complex points, or a non-bool ``reflections``.
        ValueError: for different shapes, fewer than two dimensions, or no points (``n = 0``).

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
    layout = "(*batch, n, d)"
    x = check_samples(x, "kabsch", "x", layout=layout, min_ndim=2, empty_batch=True)
    z = check_samples(z, "kabsch", "z", layout=layout, min_ndim=2, empty_batch=True)
    if x.shape != z.shape or 0 in x.shape[-2:]:
        raise ValueError(
            f"kabsch: expected x and z of the same shape (*batch, n, d) with n, d >= 1, "
            f"got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    _check_flag(reflections, "kabsch", "reflections")
    dtype = torch.promote_types(x.dtype, z.dtype)
    x, z = x.to(dtype), z.to(dtype)
    bad = ~(torch.isfinite(x).all((-2, -1)) & torch.isfinite(z).all((-2, -1)))
    if bool(bad.any()):  # NaN in, NaN out: the SVD would refuse the whole batch
        keep = ~bad[..., None, None]
        zero = torch.zeros((), dtype=dtype, device=x.device)
        r = kabsch(torch.where(keep, x, zero), torch.where(keep, z, zero), reflections=reflections)
        return torch.where(keep, r, torch.nan)
    u, _, vh = torch.linalg.svd(x.mT @ z)
    r = vh.mT @ u.mT
    if not reflections:
        sign = torch.sign(torch.linalg.det(r))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        flip = torch.ones(r.shape[:-1], dtype=r.dtype, device=r.device)
        flip[..., -1] = sign
        r = vh.mT @ (flip[..., :, None] * u.mT)
    return r


def _check_flag(value: object, who: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{who}: expected {name} to be True or False, got {value!r}")
    return value


def best_permutation(x: Tensor, z: Tensor) -> Tensor:
    r"""The permutation :math:`\sigma` minimising :math:`\sum_i \|x_{\sigma(i)} - z_i\|^2` for one pair.

    Args:
        x: ``(n, d)`` points to permute.
        z: ``(n, d)`` reference points.

    Returns:
        ``sigma``, a ``LongTensor`` ``(n,)``: ``x[sigma]`` is matched to ``z``.

    Raises:
        TypeError: for non-tensor or complex points.
        ValueError: for different shapes, no points, or NaN/infinite points (an index has no
            NaN to say "undefined", so these are refused rather than matched arbitrarily).

    Example:
        >>> import torch
        >>> z = torch.randn(6, 3)
        >>> perm = torch.tensor([3, 0, 5, 1, 4, 2])
        >>> torch.equal(z[perm][best_permutation(z[perm], z)], z)
        True
    """
    checked = [
        check_samples(v, "best_permutation", name, layout="(n, d)", ndim=2, nan="refuse", inf="refuse")
        for v, name in ((x, "x"), (z, "z"))
    ]
    if checked[0].shape != checked[1].shape:
        raise ValueError(
            f"best_permutation: expected x and z of the same shape (n, d), got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    return _assign(checked[0][None], checked[1][None])[0]


def _assign(x: Tensor, z: Tensor) -> Tensor:
    """Per-pair optimal particle assignment: ``(P, n)`` permutations with ``x[p, sigma[p]]`` matched to ``z[p]``."""
    from scipy.optimize import linear_sum_assignment  # on first use: keeps `import flows.particles` fast

    costs = torch.cdist(z.detach().double(), x.detach().double()).square().cpu().numpy()
    perms = np.stack([linear_sum_assignment(c)[1] for c in costs]) if len(costs) else np.zeros((0, x.shape[1]))
    return torch.from_numpy(perms).to(device=x.device, dtype=torch.long)


def _max_trace(h: Tensor, reflections: bool) -> Tensor:
    r""":math:`\max_R \operatorname{tr}(R H)` over :math:`O(d)` (``reflections``) or :math:`SO(d)`.

    Over :math:`O(d)` it is the nuclear norm :math:`\sum_k s_k` of :math:`H`; over :math:`SO(d)` the
    smallest singular value takes the sign of :math:`\det H` (the Kabsch correction). In two
    dimensions both have closed forms: :math:`\sqrt{(H_{11} + H_{22})^2 + (H_{12} - H_{21})^2}`
    over rotations and :math:`\sqrt{(H_{11} - H_{22})^2 + (H_{12} + H_{21})^2}` over reflections.
    """
    if h.shape[-1] == 1:
        return h[..., 0, 0].abs() if reflections else h[..., 0, 0]
    if h.shape[-1] == 2:
        a, b, c, e = h[..., 0, 0], h[..., 0, 1], h[..., 1, 0], h[..., 1, 1]
        proper = torch.hypot(a + e, b - c)
        return torch.maximum(proper, torch.hypot(a - e, b + c)) if reflections else proper
    s = torch.linalg.svdvals(h)
    if reflections:
        return s.sum(-1)
    sign = torch.where(torch.linalg.det(h) < 0, -1.0, 1.0).to(s.dtype)
    return s[..., :-1].sum(-1) + sign * s[..., -1]


def _permutations(n: int, device: torch.device) -> Tensor:
    return torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long, device=device)


def _permuted_covariances(x: Tensor, z: Tensor) -> Tensor:
    r"""Cross-covariances :math:`H_\sigma = x_\sigma^\top z` for all :math:`n!` permutations.

    ``x`` ``(P, n, d)`` and ``z`` ``(P, n, d)`` give ``(P, n!, d, d)``; with ``pairwise=True`` via
    :func:`_pairwise_covariances`, every row of ``x`` against every row of ``z``.
    :math:`H_\sigma = \sum_i x_{\sigma(i)} z_i^\top` is a sum of the :math:`n^2` outer products
    :math:`x_k z_i^\top` selected by :math:`\sigma`: one ``(n!, n^2)`` 0/1 matrix times all outer
    products, a single matrix product instead of ``n!`` gathers.
    """
    p, n, d = x.shape
    outer = x.permute(1, 0, 2)[:, None, :, :, None] * z.permute(1, 0, 2)[None, :, :, None, :]  # (n, n, P, d, d)
    return (_selection(n, x) @ outer.reshape(n * n, -1)).reshape(-1, p, d, d).transpose(0, 1)


def _pairwise_covariances(x: Tensor, z: Tensor) -> Tensor:
    """:func:`_permuted_covariances` of all rows of ``x`` ``(A, n, d)`` with all of ``z`` ``(B, n, d)``.

    Returns ``(A, B, n!, d, d)``.

    One matrix product: the ``A·n!·d`` rows of the permuted ``x`` (particles as columns) times
    ``z`` with particles as rows.
    """
    a, n, d = x.shape
    b = z.shape[0]
    perms = _permutations(n, x.device)
    xs = x[:, perms].transpose(-1, -2).reshape(-1, n)  # (A n! d, n): row (I, sigma, a), column i
    h = xs @ z.permute(1, 0, 2).reshape(n, b * d)  # (A n! d, B d)
    return h.reshape(a, len(perms), d, b, d).permute(0, 3, 1, 2, 4)


def _pairwise_max_trace_2d(x: Tensor, z: Tensor, reflections: bool) -> Tensor:
    r"""In two dimensions, :math:`\max_{\sigma, R} \operatorname{tr}(R H_\sigma)` for every row pair, ``(A, B)``.

    The closed form of :func:`_max_trace` needs only :math:`H_{11} \pm H_{22}` and
    :math:`H_{12} \mp H_{21}`, which are dot products of the permuted ``x`` with four signed
    rearrangements of ``z``: one ``(A·n!, 2n) @ (2n, 4B)`` matrix product for all pairs and permutations.
    """
    a, n, _ = x.shape
    b = z.shape[0]
    perms = _permutations(n, x.device)
    xs = x[:, perms].reshape(a * len(perms), 2 * n)  # row (I, sigma): x_{sigma(0),0}, x_{sigma(0),1}, ...
    z0, z1 = z[..., 0], z[..., 1]
    # columns (combination, J): H11 + H22, H12 - H21, H11 - H22, H12 + H21
    combos = [(z0, z1), (z1, -z0), (z0, -z1), (z1, z0)]
    zs = torch.stack([torch.stack(c, -1).reshape(b, 2 * n) for c in combos])  # (4, B, 2n)
    h = (xs @ zs.reshape(4 * b, 2 * n).T).reshape(a, len(perms), 4, b)
    best = torch.hypot(h[:, :, 0], h[:, :, 1])
    if reflections:
        best = torch.maximum(best, torch.hypot(h[:, :, 2], h[:, :, 3]))
    return best.amax(1)


def _centred(x: Tensor, shape: tuple[int, int]) -> Tensor:
    """Flat configurations ``(*batch, n·d)`` centred and shaped ``(*batch, n, d)``."""
    return remove_mean(x, *shape).unflatten(-1, shape)


def _permuted(x: Tensor, sigma: Tensor) -> Tensor:
    """``x[p, sigma[p]]`` for every row ``p``: ``x`` ``(P, n, d)``, ``sigma`` ``(P, n)``."""
    return torch.gather(x, 1, sigma[..., None].expand_as(x))


def _matched(x: Tensor, z: Tensor, reflections: bool, exact_up_to: int) -> tuple[Tensor, Tensor | None]:
    r"""``x`` ``(P, n, d)`` with its particles permuted to match ``z`` pair by pair (both centred).

    For ``n <= exact_up_to`` the permutation maximises :math:`\max_R \operatorname{tr}(R H_\sigma)`
    over all :math:`n!` (the exact group minimum, :func:`aligned_distances`), returned with that
    maximum ``(P,)``; for more particles it is the assignment on squared particle distances, returned
    with ``None``.
    """
    n = x.shape[1]
    if n > exact_up_to:
        return _permuted(x, _assign(x, z)), None
    traces = _max_trace(_permuted_covariances(x, z), reflections)  # (P, n!)
    return _permuted(x, _permutations(n, x.device)[traces.argmax(-1)]), traces.amax(-1)


def _selection(n: int, like: Tensor) -> Tensor:
    """The ``(n!, n^2)`` 0/1 matrix with a one at ``sigma(i) * n + i`` in the row of each permutation ``sigma``."""
    perms = _permutations(n, like.device)
    select = torch.zeros(len(perms), n * n, dtype=like.dtype, device=like.device)
    return select.scatter_(1, perms * n + torch.arange(n, device=like.device), 1.0)


MAX_EXACT = 8
"""The most particles for which :func:`align` and :func:`aligned_distances` enumerate all ``n!`` permutations."""


def _pair_inputs(
    x: object, z: object, n_particles: int, spatial_dim: int, who: str, reflections: object, exact_up_to: object
) -> tuple[Tensor, Tensor]:
    """Checked ``(N, n·d)`` configurations ``x`` and ``z`` broadcast to one batch, in one floating dtype."""
    x = check_configurations(x, who, "x", n_particles, spatial_dim)
    z = check_configurations(z, who, "z", n_particles, spatial_dim)
    _check_flag(reflections, who, "reflections")
    check_count(who, "exact_up_to", exact_up_to, minimum=0, maximum=MAX_EXACT)
    if z.shape[0] not in (1, x.shape[0]) and x.shape[0] != 1:
        raise ValueError(
            f"{who}: expected z with as many rows as x ({x.shape[0]}) or one, "
            f"got {tuple(z.shape)} for x {tuple(x.shape)}"
        )
    dtype = torch.promote_types(x.dtype, z.dtype)
    x, z = torch.broadcast_tensors(x.to(dtype), z.to(dtype))
    return x, z


def aligned_distances(
    x: Tensor,
    z: Tensor,
    n_particles: int,
    spatial_dim: int,
    *,
    reflections: bool = True,
    exact_up_to: int = 6,
) -> Tensor:
    r"""Squared distances :math:`\min_{\sigma, R} \|R\,x_\sigma - z\|^2` after centring, pair by pair, without aligning.

    With :math:`H = x_\sigma^\top z`, the best orthogonal map gives
    :math:`\|x\|^2 + \|z\|^2 - 2 \max_R \operatorname{tr}(R H)` in closed form (the nuclear norm
    of :math:`H` over :math:`O(d)`), so for ``n <= exact_up_to`` particles every permutation is
    tried at once and the minimum over the whole group is exact (DW4: 24 permutations). For
    more particles :math:`\sigma` comes from the assignment on squared particle distances and
    :math:`R` from Kabsch, the alignment of Klein, Krämer, Noé (2023): an upper bound of the
    group minimum.

    Args:
        x: flat configurations ``(P, n·d)`` (or ``(1, n·d)`` to broadcast).
        z: reference configurations, the same shape (or broadcastable).
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        reflections: minimise over :math:`O(d)` (default) or :math:`SO(d)`.
        exact_up_to: enumerate all permutations for at most this many particles.

    Returns:
        ``(P,)`` squared distances; NaN for a pair with a NaN or infinite coordinate. Integer and
        bool configurations are promoted to float64; zero rows give ``(0,)``.

    Raises:
        TypeError: for non-tensor or complex configurations, non-integer sizes or a non-bool ``reflections``.
        ValueError: for bad sizes, a width other than ``n·d``, batches that do not broadcast, or
            ``exact_up_to`` outside ``[0, MAX_EXACT]``.
    """
    x, z = _pair_inputs(x, z, n_particles, spatial_dim, "aligned_distances", reflections, exact_up_to)
    bad = non_finite_rows(x, z)
    if bool(bad.any()):
        out = torch.full((x.shape[0],), torch.nan, dtype=x.dtype, device=x.device)
        out[~bad] = aligned_distances(
            x[~bad], z[~bad], n_particles, spatial_dim, reflections=reflections, exact_up_to=exact_up_to
        )
        return out
    if not len(x):
        return x.new_zeros(0)
    shape = (n_particles, spatial_dim)
    x, z = torch.broadcast_tensors(_centred(x, shape), _centred(z, shape))
    norms = x.square().sum((-2, -1)) + z.square().sum((-2, -1))
    x, best = _matched(x, z, reflections, exact_up_to)
    if best is None:
        best = _max_trace(x.mT @ z, reflections)
    return (norms - 2 * best).clamp_min(0)


def align(
    x: Tensor,
    z: Tensor,
    n_particles: int,
    spatial_dim: int,
    *,
    reflections: bool = True,
    exact_up_to: int = 6,
    refine: int = 1,
) -> Tensor:
    r"""Align flat configurations ``x`` to ``z`` pair by pair over permutations, orthogonal maps and translations.

    For ``n <= exact_up_to`` particles the permutation is the best of all :math:`n!` (each with
    its closed-form best orthogonal map, :func:`aligned_distances`), so the result is the exact
    minimiser over the group. For more particles: the assignment on squared particle distances
    (:func:`scipy.optimize.linear_sum_assignment`), then Kabsch (Klein, Krämer, Noé 2023), then
    ``refine`` more rounds of assignment on the rotated points and Kabsch, each of which can only
    lower the distance.

    Args:
        x: configurations to move, ``(N, n·d)``.
        z: reference configurations, ``(N, n·d)`` (or broadcastable, e.g. ``(1, n·d)``).
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        reflections: allow reflections in the orthogonal alignment.
        exact_up_to: enumerate all permutations for at most this many particles.
        refine: extra assignment + Kabsch rounds for larger systems.

    Returns:
        the aligned, centred configurations ``(N, n·d)``: the same points up to a permutation, an
        orthogonal map and a translation. A row whose pair holds a NaN or infinite coordinate
        comes out all NaN (the other rows are unchanged); integer and bool configurations are
        promoted to float64; zero rows give ``(0, n·d)``.

    Raises:
        TypeError: for non-tensor or complex configurations, non-integer sizes or a non-bool ``reflections``.
        ValueError: for bad sizes, a width other than ``n·d``, batches that do not broadcast,
            ``exact_up_to`` outside ``[0, MAX_EXACT]`` or ``refine`` outside ``[0, 100]``.
    """
    x, z = _pair_inputs(x, z, n_particles, spatial_dim, "align", reflections, exact_up_to)
    check_count("align", "refine", refine, minimum=0, maximum=100)
    bad = non_finite_rows(x, z)
    if bool(bad.any()):
        out = torch.full_like(x, torch.nan)
        kwargs = {"reflections": reflections, "exact_up_to": exact_up_to, "refine": refine}
        out[~bad] = align(x[~bad], z[~bad], n_particles, spatial_dim, **kwargs)
        return out
    shape = (n_particles, spatial_dim)
    x = _centred(x, shape)
    z = _centred(z, shape).expand_as(x)
    if not len(x):
        return x.flatten(-2)
    x, _ = _matched(x, z, reflections, exact_up_to)
    moved = x @ kabsch(x, z, reflections=reflections).mT
    if n_particles > exact_up_to:  # the assignment on the rotated points, and Kabsch again
        for _ in range(refine):
            x = _permuted(moved, _assign(moved, z))
            moved = x @ kabsch(x, z, reflections=reflections).mT
    return moved.flatten(-2)


class EquivariantOTCoupling:
    r"""Equivariant optimal-transport coupling of a data batch with a noise batch (Klein, Krämer, Noé 2023).

    For every pair :math:`(x_i, z_j)` of the two batches the cost is the distance after aligning
    the data configuration to the noise configuration over the symmetry group,
    :math:`C_{ij} = \min_{\sigma, R} \|R\,(x_i)_\sigma - z_j\|^2` (:func:`aligned_distances`: exact
    over all permutations and orthogonal maps, in closed form, for up to ``exact_up_to``
    particles; the assignment-then-Kabsch alignment of Klein et al. beyond). The optimal
    assignment :math:`\pi` of the batches under :math:`C`
    (:func:`scipy.optimize.linear_sum_assignment`) then pairs :math:`z_j` with
    :math:`x_{\pi(j)}`, which alone is aligned to :math:`z_j` (:func:`align`, with ``refine``
    rounds for large systems): :math:`N^2` costs but only :math:`N` alignments. Aligned data are
    still samples of an invariant target, so the flow-matching objective is unchanged while paths
    get shorter. With ``ot=False`` the pairs are kept and only aligned.

    ``cost="radial"`` replaces :math:`C` for large systems by the invariant lower bound
    :math:`\sum_i (r^{x}_{(i)} - r^{z}_{(i)})^2` of sorted distances to the centre (no per-pair
    assignment at all, for when :math:`N^2` assignments cost more than a training step).

    The call signature is the flow-matching coupling interface:
    ``coupling(x, z) -> (x', z')`` with ``x`` the data and ``z`` the base samples, both
    ``(N, n·d)``.

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
        cost: ``"aligned"`` (the group-aligned distance) or ``"radial"`` (its invariant lower bound).
        exact_up_to: enumerate all permutations for at most this many particles.
        refine: extra assignment + Kabsch rounds when aligning the chosen pairs of large systems.

    Example:
        >>> import torch
        >>> coupling = EquivariantOTCoupling(4, 2)
        >>> x, z = torch.randn(6, 8), torch.randn(6, 8)
        >>> x2, z2 = coupling(x, z)
        >>> x2.shape, torch.equal(z2, z)
        (torch.Size([6, 8]), True)
    """

    def __init__(
        self,
        n_particles: int,
        spatial_dim: int,
        *,
        reflections: bool = True,
        ot: bool = True,
        cost: str = "aligned",
        exact_up_to: int = 6,
        refine: int = 1,
        candidates: int | None = None,
    ) -> None:
        _check_sizes(n_particles, spatial_dim, "EquivariantOTCoupling")
        if cost not in ("aligned", "radial"):
            raise ValueError(f"EquivariantOTCoupling: expected cost 'aligned' or 'radial', got {cost!r}")
        for name, value, top in (("exact_up_to", exact_up_to, MAX_EXACT), ("refine", refine, 100)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise ValueError(f"EquivariantOTCoupling: expected {name} to be an int in [0, {top}], got {value!r}")
        _check_flag(reflections, "EquivariantOTCoupling", "reflections")
        _check_flag(ot, "EquivariantOTCoupling", "ot")
        self.n_particles, self.spatial_dim, self.reflections, self.ot = n_particles, spatial_dim, reflections, ot
        if candidates is not None and (
            not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 1
        ):
            raise ValueError(
                f"EquivariantOTCoupling: expected candidates to be None or an int >= 1, got {candidates!r}"
            )
        self.cost, self.exact_up_to, self.refine, self.candidates = cost, exact_up_to, refine, candidates

    def _align(self, x: Tensor, z: Tensor) -> Tensor:
        return align(
            x,
            z,
            self.n_particles,
            self.spatial_dim,
            reflections=self.reflections,
            exact_up_to=self.exact_up_to,
            refine=self.refine,
        )

    def cost_matrix(self, x: Tensor, z: Tensor) -> Tensor:
        """The ``(N, N)`` cost :math:`C_{ij}` between data row ``i`` and noise row ``j``."""
        n = x.shape[0]
        shape = (self.n_particles, self.spatial_dim)
        pruned = self.candidates is not None and self.candidates < n and self.n_particles > self.exact_up_to
        if self.cost == "radial" or pruned:
            rx = _centred(x, shape).norm(dim=-1).sort(-1).values
            rz = _centred(z, shape).norm(dim=-1).sort(-1).values
            bound = torch.cdist(rx.double(), rz.double()).square()
            if self.cost == "radial":
                return bound
            # the aligned cost only for each noise row's `candidates` data rows of smallest lower bound
            rows = bound.topk(self.candidates, dim=0, largest=False).indices  # (candidates, N)
            cols = torch.arange(n, device=x.device).expand_as(rows)
            exact = aligned_distances(
                x[rows.reshape(-1)], z[cols.reshape(-1)], *shape, reflections=self.reflections, exact_up_to=0
            ).double()
            cost = bound + exact.max()  # outside the candidates: only when the assignment needs them
            cost[rows.reshape(-1), cols.reshape(-1)] = exact
            return cost
        if self.n_particles <= self.exact_up_to:  # all pairs and permutations in closed form, no loop
            xc, zc = _centred(x, shape), _centred(z, shape)
            norms = xc.square().sum((-2, -1))[:, None] + zc.square().sum((-2, -1))[None, :]
            if self.spatial_dim == 2:
                best = _pairwise_max_trace_2d(xc, zc, self.reflections)
            else:
                best = _max_trace(_pairwise_covariances(xc, zc), self.reflections).amax(-1)
            return (norms - 2 * best).clamp_min(0)
        xs, zs = x.repeat_interleave(n, 0), z.repeat(n, 1)  # row i*n + j: x_i against z_j
        return aligned_distances(xs, zs, *shape, reflections=self.reflections, exact_up_to=self.exact_up_to).reshape(
            n, n
        )

    def __call__(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """Pair and align a data batch ``x`` with a noise batch ``z``, both ``(N, n·d)`` and finite.

        Raises:
            TypeError: for non-tensor or complex batches.
            ValueError: for a wrong shape, or NaN/infinite values (a coupling has no answer for them).
        """
        features = self.n_particles * self.spatial_dim
        shape = self.n_particles, self.spatial_dim
        z = check_configurations(z, "EquivariantOTCoupling", "z", *shape, nan="refuse")
        x = check_configurations(x, "EquivariantOTCoupling", "x", *shape, nan="refuse").to(z.dtype)
        if x.dim() != 2 or x.shape != z.shape or x.shape[-1] != features:
            raise ValueError(
                f"EquivariantOTCoupling: expected x and z of shape (N, {features}), "
                f"got {tuple(x.shape)} and {tuple(z.shape)}"
            )
        with torch.no_grad():
            if self.ot and len(x):
                from scipy.optimize import linear_sum_assignment

                rows, cols = linear_sum_assignment(self.cost_matrix(x, z).double().cpu().numpy())
                pi = np.empty_like(rows)
                pi[cols] = rows  # z_j is paired with x_{pi[j]}
                x = x[torch.from_numpy(pi).to(x.device)]
            return self._align(x, z).to(x.dtype), z

    def __repr__(self) -> str:
        return (
            f"EquivariantOTCoupling(n_particles={self.n_particles}, spatial_dim={self.spatial_dim}, "
            f"reflections={self.reflections}, ot={self.ot}, cost={self.cost!r})"
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
        couplings: name → coupling callable; default independent, OT (:func:`flows.train.pairs.ot_assignment`)
            and equivariant OT (:class:`EquivariantOTCoupling`).

    Returns:
        name → mean path length.

    Raises:
        TypeError: for non-tensor or complex batches, or a non-integer ``batch_size``.
        ValueError: for zero rows (a mean of no paths), a wrong shape, NaN/infinite values or ``batch_size < 1``.

    Example:
        >>> import torch
        >>> x, z = torch.randn(32, 8), torch.randn(32, 8)
        >>> lengths = path_lengths(x, z, 4, 2, batch_size=16)
        >>> lengths["equivariant OT"] <= lengths["OT"] <= lengths["independent"]
        True
    """
    x = check_configurations(x, "path_lengths", "x", n_particles, spatial_dim, nan="refuse", empty_batch=False)
    z = check_configurations(z, "path_lengths", "z", n_particles, spatial_dim, nan="refuse", empty_batch=False)
    if x.shape != z.shape:
        raise ValueError(
            f"path_lengths: expected x and z of the same shape (N, n·d), got {tuple(x.shape)} and {tuple(z.shape)}"
        )
    check_count("path_lengths", "batch_size", batch_size)
    dtype = torch.promote_types(x.dtype, z.dtype)
    x, z = x.to(dtype), z.to(dtype)
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
