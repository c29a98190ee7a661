r"""Internal coordinates of a molecule (a Z-matrix) as a bijection with the exact log-determinant.

A Z-matrix orders the ``n`` atoms: the first three define the frame, every later atom :math:`i`
is placed from three atoms placed before it: its bond :math:`r_i = |x_i - x_j|`, its angle
:math:`\theta_i = \angle(i, j, k)` and its torsion :math:`\varphi_i = \operatorname{dih}(i, j, k, l)`
(IUPAC sign, as ``mdtraj``). The Cartesian volume element factorises exactly:

.. math::

    d^{3n}x = \sin\beta\, d\alpha\, d\beta\, d\gamma\; d^3t\;
              b_1^2\, b_2^2 \sin a\; db_1\, db_2\, da\;
              \prod_{i \ge 3} r_i^2 \sin\theta_i\; dr_i\, d\theta_i\, d\varphi_i,

where :math:`t` is the first atom, :math:`(\alpha, \beta, \gamma)` the ZYZ Euler angles of the
frame, :math:`b_1, b_2` its two bonds and :math:`a` its angle. An energy invariant under rigid
motions therefore has the marginal density
:math:`p(q) \propto e^{-u(x(q))}\, b_1^2 b_2^2 \sin a \prod_i r_i^2 \sin\theta_i` on the
:math:`3n - 6` internal coordinates :math:`q` (the rigid motions integrate to the constant
:math:`8\pi^2 V`). The frame factor :math:`b_1^2 b_2^2 \sin a` is part of it; dropping it biases
the density by a smooth factor.

References:
    Noé, Olsson, Köhler, Wu (2019), "Boltzmann generators: Sampling equilibrium states of
    many-body systems with deep learning", Science 365, arXiv:1812.01729. Parsons, Holmes,
    Rojas, Tsai, Strauss (2005), "Practical conversion from torsion space to Cartesian space for
    in silico protein synthesis" (NeRF), J. Comput. Chem. 26.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from flows.bijections.base import Bijection

__all__ = ["InternalCoordinates", "dihedral"]


def _angle(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Angle at ``b`` between ``a`` and ``c`` in ``[0, π]`` (atan2 form: exact near 0 and π)."""
    u, v = a - b, c - b
    return torch.atan2(torch.linalg.cross(u, v).norm(dim=-1), (u * v).sum(-1))


def dihedral(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    r"""IUPAC torsion ``a-b-c-d`` in ``(-π, π]`` of positions ``(*batch, 3)``.

    Looking along :math:`b \to c`, the angle from bond :math:`b\text{-}a` to bond
    :math:`c\text{-}d`, clockwise positive (the sign of ``mdtraj.compute_dihedrals``).
    """
    b0, b1, b2 = a - b, c - b, d - c
    b1 = b1 / b1.norm(dim=-1, keepdim=True)
    v = b0 - (b0 * b1).sum(-1, keepdim=True) * b1
    w = b2 - (b2 * b1).sum(-1, keepdim=True) * b1
    return torch.atan2((torch.linalg.cross(b1, v) * w).sum(-1), (v * w).sum(-1))


def _place(c: Tensor, b: Tensor, a: Tensor, r: Tensor, theta: Tensor, phi: Tensor) -> Tensor:
    """NeRF: the atom ``d`` with ``|d - c| = r``, ``∠(d, c, b) = θ`` and IUPAC ``dih(d, c, b, a) = φ``."""
    bc = c - b
    bc = bc / bc.norm(dim=-1, keepdim=True)
    n = torch.linalg.cross(b - a, bc)
    n = n / n.norm(dim=-1, keepdim=True)
    m = torch.linalg.cross(n, bc)
    sin_t = torch.sin(theta)
    local = (-r * torch.cos(theta), r * sin_t * torch.cos(phi), r * sin_t * torch.sin(phi))
    return c + local[0][..., None] * bc + local[1][..., None] * m + local[2][..., None] * n


def _wrap(t: Tensor) -> Tensor:
    """Angles wrapped to ``[-π, π)``."""
    return torch.remainder(t + math.pi, 2 * math.pi) - math.pi


class InternalCoordinates(Bijection):
    r"""Cartesian positions ``(*batch, 3n)`` (atom-major) → internal coordinates of a Z-matrix.

    Output layout (the event ``(3n - 6,)``): the ``n - 1`` bonds :math:`(b_1, b_2, r_3, \dots)`,
    then the ``n - 2`` angles :math:`(a, \theta_3, \dots)`, then the ``n - 3`` torsions
    :math:`(\varphi_3, \dots)`; :attr:`bonds`, :attr:`angles` and :attr:`torsions` are the slices.
    Domains: bonds in :math:`(0, \infty)`, angles in :math:`(0, \pi)`, torsions on the circle
    :math:`[-\pi, \pi)`, except a torsion named in ``chirality``, which keeps one sign (the
    interval :math:`(-\pi, 0)` or :math:`(0, \pi)`): a density on that interval lives on one
    enantiomer only. :attr:`lower`, :attr:`upper` and :attr:`circular` describe the domains of
    the (standardised) outputs.

    **Log-determinant.** Forward, ``ladj`` :math:`= -\log(b_1^2 b_2^2 \sin a \prod_i r_i^2 \sin\theta_i)
    - \sum \log s` (the volume factor of the module docstring, and the standardisation scales
    :math:`s`), so that :math:`\log p_X(x) = \log p_Q(q) + \mathrm{ladj}` is the density of the
    positions per unit volume of rigid motions: the inverse places the frame canonically (first
    atom at 0, second on +x, third in the xy-plane, +y side). With ``keep_frame=True`` the map
    is a bijection of :math:`\mathbb{R}^{3n}`: six more outputs, the first atom's position
    :math:`t` and the ZYZ Euler angles :math:`(\alpha, \beta, \gamma)`, and ``ladj`` gains
    :math:`-\log\sin\beta`: it is then the exact ``log|det ∂z/∂x|`` of the full map.

    **Standardisation.** ``reference`` (Cartesian configurations ``(N, 3n)``) sets a location and
    scale per output: bonds, angles and chiral torsions become :math:`(q - \mu)/\sigma` (mean and
    standard deviation), the other torsions :math:`\operatorname{wrap}(\varphi - \mu)` (circular
    mean, no scaling, so they stay on the circle); the constant :math:`-\sum\log\sigma` is in ``ladj``.

    **Stiff torsions.** With ``reference`` and ``linear_torsions=δ``, a torsion whose reference
    values all lie within :math:`\delta` of their circular mean :math:`\mu` (an improper, a methyl
    hydrogen placed against its sibling, a carbonyl oxygen: standard deviations of 0.1-0.2 rad on
    alanine dipeptide) is cut open at :math:`\mu + \pi` and standardised like a bond,
    :math:`\operatorname{wrap}(\varphi - \mu)/\sigma`, on the interval
    :math:`(-\pi/\sigma, \pi/\sigma)` (an exact bijection of the circle minus one point, log-det
    :math:`-\log\sigma`). A flow then models it like a bond, from a Gaussian base, instead of
    squeezing a uniform density on the circle into a spike; :attr:`circular` is ``False`` there.

    Args:
        z_matrix: one row per atom, every atom exactly once: ``(a0,)``, ``(a1, a0)``,
            ``(a2, b, c)`` with ``{b, c} = {a0, a1}`` (bond to ``b``, angle at ``b``), then
            ``(i, j, k, l)``: bond ``i-j``, angle ``i-j-k``, torsion ``i-j-k-l``, with ``j, k, l``
            distinct atoms of earlier rows.
        keep_frame: also output the rigid motion (a square bijection, see above).
        reference: configurations to standardise with (``None``: no standardisation).
        chirality: ``{atom: sign}`` for placed atoms whose torsion keeps the sign ``±1``.
        linear_torsions: the angle :math:`\delta` (radians, in ``(0, π)``) within which a torsion's
            reference values must all stay to be treated as an interval (needs ``reference``;
            ``None``: every torsion stays on the circle).

    Raises:
        ValueError: for a Z-matrix with a repeated, missing or out-of-range atom, a reference to an
            atom not placed yet, a row of the wrong length, or a ``chirality`` entry that is not a
            placed atom with sign ±1.

    Example:
        >>> import torch
        >>> ic = InternalCoordinates([(0,), (1, 0), (2, 1, 0), (3, 2, 1, 0)])  # a 4-atom chain
        >>> x = torch.tensor([0.0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.float64)
        >>> q, ladj = ic.forward_and_log_det(x)
        >>> [round(v, 4) for v in q.tolist()]  # bonds 1, 1, 1; angles π/2, π/2; torsion +π/2
        [1.0, 1.0, 1.0, 1.5708, 1.5708, 1.5708]
    """

    def __init__(
        self,
        z_matrix: Sequence[Sequence[int]],
        *,
        keep_frame: bool = False,
        reference: Tensor | None = None,
        chirality: Mapping[int, int] | None = None,
        linear_torsions: float | None = None,
    ) -> None:
        rows = _check_z_matrix(z_matrix)
        if linear_torsions is not None:
            if reference is None:
                raise ValueError(
                    "InternalCoordinates: expected reference configurations with linear_torsions, got none"
                )
            if not (isinstance(linear_torsions, (int, float)) and 0 < linear_torsions < math.pi):
                raise ValueError(f"InternalCoordinates: expected linear_torsions in (0, π), got {linear_torsions!r}")
        n = len(rows)
        super().__init__(3 * n, 3 * n if keep_frame else 3 * n - 6)
        self.n_atoms, self.keep_frame, self.z_matrix = n, bool(keep_frame), rows
        self.bonds, self.angles, self.torsions = slice(0, n - 1), slice(n - 1, 2 * n - 3), slice(2 * n - 3, 3 * n - 6)
        placed = torch.tensor([row for row in rows[3:]], dtype=torch.long).reshape(-1, 4)
        self.register_buffer("_placed", placed, persistent=False)
        self.chirality = _check_chirality(chirality, rows)
        d = 3 * n - 6
        circular = torch.zeros(d, dtype=torch.bool)
        lower, upper = torch.full((d,), -math.inf, dtype=torch.float64), torch.full((d,), math.inf, dtype=torch.float64)
        lower[self.bonds], lower[self.angles], upper[self.angles] = 0.0, 0.0, math.pi
        circular[self.torsions] = True
        for atom, sign in self.chirality.items():
            k = self.torsions.start + [row[0] for row in rows[3:]].index(atom)
            circular[k] = False
            lower[k], upper[k] = (0.0, math.pi) if sign > 0 else (-math.pi, 0.0)
        loc, scale = torch.zeros(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)
        if reference is not None:
            loc, scale, spread = self._statistics(reference, circular)
            if linear_torsions is not None:
                cut = circular & (spread < linear_torsions)
                circular = circular & ~cut
                lower, upper = torch.where(cut, loc - math.pi, lower), torch.where(cut, loc + math.pi, upper)
            scale = torch.where(circular, 1.0, scale)  # circular torsions are shifted, never scaled
        is_torsion = torch.zeros(d, dtype=torch.bool)
        is_torsion[self.torsions] = True
        self.register_buffer("_is_torsion", is_torsion, persistent=False)
        self.register_buffer("loc", loc)
        self.register_buffer("scale", scale)
        self.register_buffer("circular", circular)
        self.register_buffer("lower", torch.where(circular, -math.pi, (lower - loc) / scale))
        self.register_buffer("upper", torch.where(circular, math.pi, (upper - loc) / scale))

    def _statistics(self, reference: Tensor, circular: Tensor) -> tuple[Tensor, Tensor]:
        reference = torch.as_tensor(reference, dtype=torch.float64)
        if reference.dim() != 2 or reference.shape[-1] != 3 * self.n_atoms or len(reference) < 2:
            raise ValueError(
                f"InternalCoordinates: expected reference configurations (N >= 2, {3 * self.n_atoms}), "
                f"got {tuple(reference.shape)}"
            )
        q = self._internal(reference.unflatten(-1, (self.n_atoms, 3)))
        circular_mean = torch.atan2(q.sin().mean(0), q.cos().mean(0))
        deviation = _wrap(q - circular_mean)
        spread = deviation.abs().amax(0)  # the largest distance of a reference value from the circular mean
        loc = torch.where(circular, circular_mean, q.mean(0))
        scale = torch.where(circular, deviation.std(0), q.std(0)).clamp_min(1e-6)
        return loc, scale, spread

    def _internal(self, pos: Tensor) -> Tensor:
        """Raw internal coordinates ``(*batch, 3n - 6)`` of positions ``(*batch, n, 3)``."""
        (a0,), (a1, _), (a2, b, c) = self.z_matrix[:3]
        i, j, k, l = self._placed.unbind(-1)  # noqa: E741
        xi, xj, xk, xl = pos[..., i, :], pos[..., j, :], pos[..., k, :], pos[..., l, :]
        p0, p1, p2, pb, pc = pos[..., a0, :], pos[..., a1, :], pos[..., a2, :], pos[..., b, :], pos[..., c, :]
        bonds = torch.cat(
            [(p1 - p0).norm(dim=-1)[..., None], (p2 - pb).norm(dim=-1)[..., None], (xi - xj).norm(dim=-1)], -1
        )
        angles = torch.cat([_angle(p2, pb, pc)[..., None], _angle(xi, xj, xk)], -1)
        return torch.cat([bonds, angles, dihedral(xi, xj, xk, xl)], -1)

    def _volume(self, q: Tensor) -> Tensor:
        r""":math:`\log(b_1^2 b_2^2 \sin a \prod_i r_i^2 \sin\theta_i)` of raw internal coordinates."""
        return 2 * q[..., self.bonds].log().sum(-1) + q[..., self.angles].sin().log().sum(-1)

    def _standardize(self, q: Tensor, inverse: bool = False) -> Tensor:
        loc, scale = self.loc.to(q), self.scale.to(q)
        if inverse:
            return torch.where(self.circular, q + loc, q * scale + loc)
        # torsions cut open (and chiral ones, whose values and mean share a half-circle) are wrapped
        centred = torch.where(self._is_torsion, _wrap(q - loc), q - loc)
        return torch.where(self.circular, _wrap(q - loc), centred / scale)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        pos = x.unflatten(-1, (self.n_atoms, 3))
        q = self._internal(pos)
        ladj = -self._volume(q) - self.scale.to(q).log().sum()
        z = self._standardize(q)
        if self.keep_frame:
            (a0,), (a1, _), (a2, _, _) = self.z_matrix[:3]
            t = pos[..., a0, :]
            e1 = pos[..., a1, :] - t
            e1 = e1 / e1.norm(dim=-1, keepdim=True)
            v = pos[..., a2, :] - t
            e2 = v - (v * e1).sum(-1, keepdim=True) * e1
            e2 = e2 / e2.norm(dim=-1, keepdim=True)
            e3 = torch.linalg.cross(e1, e2)
            # R = [e1 e2 e3] (columns) = Rz(α) Ry(β) Rz(γ)
            alpha = torch.atan2(e3[..., 1], e3[..., 0])
            beta = torch.atan2(e3[..., :2].norm(dim=-1), e3[..., 2])
            gamma = torch.atan2(e2[..., 2], -e1[..., 2])
            z = torch.cat([z, t, torch.stack([alpha, beta, gamma], -1)], -1)
            ladj = ladj - beta.sin().log()
        return z, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        d = 3 * self.n_atoms - 6
        q = self._standardize(z[..., :d], inverse=True)
        ladj = self._volume(q) + self.scale.to(q).log().sum()
        bonds, angles, torsions = q[..., self.bonds], q[..., self.angles], q[..., self.torsions]
        (a0,), (a1, _), (a2, b, _) = self.z_matrix[:3]
        zero = torch.zeros_like(bonds[..., 0])
        pos: dict[int, Tensor] = {a0: torch.stack([zero, zero, zero], -1)}
        pos[a1] = torch.stack([bonds[..., 0], zero, zero], -1)
        cos_a, sin_a = angles[..., 0].cos(), angles[..., 0].sin()
        direction = cos_a if b == a0 else -cos_a  # the angle is at b, measured from the other frame atom
        pos[a2] = pos[b] + bonds[..., 1, None] * torch.stack([direction, sin_a, zero], -1)
        for m, (i, j, k, l) in enumerate(self.z_matrix[3:]):  # noqa: E741
            pos[i] = _place(pos[j], pos[k], pos[l], bonds[..., m + 2], angles[..., m + 1], torsions[..., m])
        x = torch.stack([pos[a] for a in range(self.n_atoms)], -2)
        if self.keep_frame:
            t, (alpha, beta, gamma) = z[..., d : d + 3], z[..., d + 3 :].unbind(-1)
            x = x @ _zyz(alpha, beta, gamma).transpose(-1, -2) + t[..., None, :]
            ladj = ladj + beta.sin().log()
        return x.flatten(-2), ladj

    def extra_repr(self) -> str:
        return f"n_atoms={self.n_atoms}, keep_frame={self.keep_frame}, chirality={self.chirality}"


def _zyz(alpha: Tensor, beta: Tensor, gamma: Tensor) -> Tensor:
    """The rotation matrices ``Rz(α) Ry(β) Rz(γ)``, shape ``(*batch, 3, 3)``."""

    def rz(t: Tensor) -> Tensor:
        c, s, o, i = t.cos(), t.sin(), torch.zeros_like(t), torch.ones_like(t)
        return torch.stack([c, -s, o, s, c, o, o, o, i], -1).unflatten(-1, (3, 3))

    c, s, o, i = beta.cos(), beta.sin(), torch.zeros_like(beta), torch.ones_like(beta)
    ry = torch.stack([c, o, s, o, i, o, -s, o, c], -1).unflatten(-1, (3, 3))
    return rz(alpha) @ ry @ rz(gamma)


def _check_z_matrix(z_matrix: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """The rows as tuples of ints, or a ``ValueError`` naming the first problem."""
    name = "InternalCoordinates"
    try:
        rows = tuple(tuple(int(a) for a in row) for row in z_matrix)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a Z-matrix of integer rows, got {z_matrix!r}") from None
    n = len(rows)
    if n < 3:
        raise ValueError(f"{name}: expected a Z-matrix of at least 3 atoms, got {n}")
    for position, row in enumerate(rows):
        expected = min(position + 1, 4)
        if len(row) != expected:
            raise ValueError(f"{name}: expected row {position} to have {expected} atoms, got {row}")
    heads = [row[0] for row in rows]
    repeated = sorted({a for a in heads if heads.count(a) > 1})
    if repeated:
        raise ValueError(f"{name}: expected every atom in exactly one row, got atom(s) {repeated} repeated")
    missing, extra = sorted(set(range(n)) - set(heads)), sorted(set(heads) - set(range(n)))
    if missing or extra:
        raise ValueError(
            f"{name}: expected one row for each atom 0..{n - 1}, got no row for {missing} and rows for {extra}"
        )
    seen: set[int] = set()
    for position, row in enumerate(rows):
        refs = row[1:]
        if len(set(refs)) != len(refs) or any(r not in seen for r in refs):
            raise ValueError(
                f"{name}: expected row {position} {row} to refer to distinct atoms placed earlier ({sorted(seen)})"
            )
        seen.add(row[0])
    return rows


def _check_chirality(chirality: Mapping[int, int] | None, rows: tuple[tuple[int, ...], ...]) -> dict[int, int]:
    if chirality is None:
        return {}
    placed = [row[0] for row in rows[3:]]
    out = {}
    for atom, sign in dict(chirality).items():
        if atom not in placed or sign not in (-1, 1):
            raise ValueError(
                f"InternalCoordinates: expected chirality {{placed atom: ±1}}, got {{{atom!r}: {sign!r}}} "
                f"(placed atoms: {placed})"
            )
        out[int(atom)] = int(sign)
    return out
