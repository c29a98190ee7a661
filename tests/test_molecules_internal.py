"""Internal coordinates: round trips, the exact log-det (with the frame factor), signs, chirality, bad Z-matrices."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import flows
from flows.bijections.internal_coordinates import _wrap, dihedral
from flows.targets.alanine import _POSITIONS, CHIRAL_ROW, PHI_ATOMS, PSI_ATOMS, Z_MATRIX

ALDP = torch.tensor(_POSITIONS, dtype=torch.float64)  # (22, 3), an L configuration


def rotations(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    return q * torch.det(q)[:, None, None]  # proper rotations


def aldp_frames(n: int = 16, seed: int = 0, noise: float = 0.005) -> torch.Tensor:
    """Distorted, rotated and translated copies of the built-in ALDP structure, ``(n, 66)``."""
    gen = torch.Generator().manual_seed(seed)
    pos = ALDP + noise * torch.randn(n, 22, 3, generator=gen, dtype=torch.float64)
    return (
        pos @ rotations(n, gen).transpose(-1, -2) + torch.randn(n, 1, 3, generator=gen, dtype=torch.float64)
    ).flatten(-2)


def chiral_index(ic: flows.InternalCoordinates, atom: int) -> int:
    return ic.torsions.start + [row[0] for row in ic.z_matrix[3:]].index(atom)


@pytest.mark.parametrize("keep_frame", [False, True])
def test_round_trip_to_1e_10(keep_frame):
    ic = flows.InternalCoordinates(Z_MATRIX, keep_frame=keep_frame)
    x = aldp_frames()
    q = ic(x)
    assert q.shape == (16, 66 if keep_frame else 60)
    back = ic.inverse(q)
    if keep_frame:
        assert (back - x).abs().max() < 1e-10
    else:  # the canonical frame: same internal coordinates, positions up to a rigid motion
        assert _wrap(ic(back) - q).abs().max() < 1e-10
        pos = back.unflatten(-1, (22, 3))
        assert pos[:, 8].abs().max() < 1e-12 and pos[:, 6, 1:].abs().max() < 1e-12 and pos[:, 14, 2].abs().max() < 1e-12
        d = lambda p: torch.cdist(p, p)  # noqa: E731
        assert (d(pos) - d(x.unflatten(-1, (22, 3)))).abs().max() < 1e-10


def test_log_det_is_the_exact_jacobian_of_the_full_map_including_the_frame_factor():
    full = flows.InternalCoordinates(Z_MATRIX, keep_frame=True)
    reduced = flows.InternalCoordinates(Z_MATRIX)
    x = aldp_frames(3, seed=1)
    z, ladj = full.forward_and_log_det(x)
    for i in range(3):
        jac = torch.func.jacrev(lambda v: full(v))(x[i])
        assert abs(torch.linalg.slogdet(jac)[1] - ladj[i]) < 1e-9
    # the reduced log-det is the full one without the rotation's sin β (t and the Euler angles integrate out)
    _, ladj_reduced = reduced.forward_and_log_det(x)
    torch.testing.assert_close(ladj_reduced, ladj + z[:, -2].sin().log(), rtol=0, atol=1e-12)
    # and it contains the frame factor b1² b2² sin a (which dropping would shift by about 5.8 nats on ALDP)
    q = reduced(x)
    frame = 2 * q[:, 0].log() + 2 * q[:, 1].log() + q[:, 21].sin().log()
    placed = 2 * q[:, 2:21].log().sum(-1) + q[:, 22:41].sin().log().sum(-1)
    torch.testing.assert_close(ladj_reduced, -(frame + placed), rtol=0, atol=1e-12)
    assert frame.mean() < -5
    _, inverse_ladj = reduced.inverse_and_log_det(q)
    torch.testing.assert_close(inverse_ladj, -ladj_reduced, rtol=0, atol=1e-12)


def test_torsion_sign_matches_a_hand_computed_iupac_dihedral():
    # looking along b -> c (the +z axis) the bond c-d is the bond b-a turned by +φ clockwise (IUPAC, mdtraj)
    for phi in (0.3, 2.0, -1.1, -2.9):
        f64 = {"dtype": torch.float64}
        a, b, c = torch.tensor([1.0, 0, 0], **f64), torch.zeros(3, **f64), torch.tensor([0, 0, 1.0], **f64)
        d = torch.tensor([math.cos(phi), math.sin(phi), 1.0], **f64)
        assert math.isclose(float(dihedral(a, b, c, d)), phi, abs_tol=1e-12)
        ic = flows.InternalCoordinates([(1,), (2, 1), (0, 1, 2), (3, 2, 1, 0)])
        x = torch.stack([a, b, c, d]).flatten()
        assert math.isclose(float(ic(x)[ic.torsions]), phi, abs_tol=1e-12)
        placed = ic.inverse(ic(x)).unflatten(-1, (4, 3))  # NeRF puts d back with the same sign
        assert math.isclose(float(dihedral(*placed)), phi, abs_tol=1e-12)


def test_aldp_phi_psi_are_z_matrix_torsions_and_mirror_flips_every_torsion():
    ic = flows.InternalCoordinates(Z_MATRIX)
    x = aldp_frames(4, seed=2)
    q, pos = ic(x), x.unflatten(-1, (22, 3))
    heads = [row[0] for row in Z_MATRIX[3:]]
    phi, psi = q[:, ic.torsions][:, heads.index(4)], q[:, ic.torsions][:, heads.index(16)]
    torch.testing.assert_close(phi, dihedral(*(pos[:, a] for a in PHI_ATOMS)), rtol=0, atol=1e-12)
    torch.testing.assert_close(psi, dihedral(*(pos[:, a] for a in PSI_ATOMS)), rtol=0, atol=1e-12)
    mirrored = ic(-x)
    torch.testing.assert_close(mirrored[:, :41], q[:, :41], rtol=0, atol=1e-12)  # bonds and angles
    torch.testing.assert_close(
        _wrap(mirrored[:, 41:] + q[:, 41:]), torch.zeros(4, 19, dtype=torch.float64), atol=1e-12, rtol=0
    )
    k = chiral_index(ic, CHIRAL_ROW[0])
    assert (q[:, k] < 0).all() and (mirrored[:, k] > 0).all()  # the CB improper carries the chirality


def test_aldp_internal_coordinates_declare_the_l_domain():
    pytest.importorskip("openmm")
    target = flows.targets.AlanineDipeptide()
    ic = target.internal_coordinates()
    k = chiral_index(ic, 10)
    assert not ic.circular[k] and ic.lower[k] == -math.pi and ic.upper[k] == 0
    assert int(ic.circular.sum()) == 18 and (ic.lower[ic.angles] == 0).all() and (ic.upper[ic.angles] == math.pi).all()
    directory = os.environ.get("FLOWS_DATA_DIR")
    if directory and os.path.exists(os.path.join(directory, "aldp_vacuum_300K_md.npz")):
        x = target.reference_samples("val", dtype=torch.float64)
        q = ic(x)
        assert ((q[:, k] > ic.lower[k]) & (q[:, k] < ic.upper[k])).all()  # every MD frame is L
        assert (ic.inverse(q).unflatten(-1, (22, 3))[:, 8].abs() < 1e-12).all()


def test_standardisation_keeps_its_log_det_and_the_circle():
    reference = aldp_frames(64, seed=3, noise=0.01)
    plain = flows.InternalCoordinates(Z_MATRIX, chirality={10: -1})
    ic = flows.InternalCoordinates(Z_MATRIX, reference=reference, chirality={10: -1})
    x = aldp_frames(5, seed=4, noise=0.01)
    (_, ladj0), (z, ladj) = plain.forward_and_log_det(x), ic.forward_and_log_det(x)
    torch.testing.assert_close(ladj, ladj0 - ic.scale.log().sum(), rtol=0, atol=1e-10)
    assert z[:, ~ic.circular].abs().max() < 10 and (z[:, ic.circular].abs() <= math.pi).all()
    assert _wrap(ic(ic.inverse(z)) - z).abs().max() < 1e-10
    k = chiral_index(ic, 10)
    assert ic.upper[k] == -ic.loc[k] / ic.scale[k] and not ic.circular[k]
    with pytest.raises(ValueError, match=r"expected reference configurations \(N >= 2, 66\)"):
        flows.InternalCoordinates(Z_MATRIX, reference=torch.zeros(3, 65))


@pytest.mark.parametrize(
    ("z_matrix", "match"),
    [
        ([(0,), (1, 0), (2, 1, 0), (2, 1, 0, 0)], r"atom\(s\) \[2\] repeated"),
        ([(0,), (1, 0), (2, 1, 0), (4, 2, 1, 0)], r"no row for \[3\] and rows for \[4\]"),
        ([(0,), (1, 0), (2, 1, 0), (3, 2, 1, 1)], "refer to distinct atoms placed earlier"),
        (
            [(0,), (1, 0), (2, 1, 0), (3, 2, 1, 4), (4, 3, 2, 1)],
            r"\(3, 2, 1, 4\) to refer to distinct atoms placed earlier",
        ),
        ([(0,), (1, 0), (2, 1), (3, 2, 1, 0)], "expected row 2 to have 3 atoms"),
        ([(0,), (1, 0)], "at least 3 atoms"),
        ([("a",), (1, 0), (2, 1, 0)], "integer rows"),
    ],
)
def test_bad_z_matrices_get_clear_errors(z_matrix, match):
    with pytest.raises(ValueError, match=match):
        flows.InternalCoordinates(z_matrix)


def test_bad_chirality_gets_a_clear_error():
    with pytest.raises(ValueError, match="expected chirality"):
        flows.InternalCoordinates(Z_MATRIX, chirality={8: -1})  # a frame atom has no torsion
    with pytest.raises(ValueError, match="expected chirality"):
        flows.InternalCoordinates(Z_MATRIX, chirality={10: 0})


def test_reference_frames_match_numpy_iupac_torsions_of_the_data():
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not os.path.exists(os.path.join(directory, "aldp_vacuum_1000K_md.npz")):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    with np.load(os.path.join(directory, "aldp_vacuum_1000K_md.npz")) as f:
        x = torch.from_numpy(f["val"][:200].astype(np.float64))
    ic = flows.InternalCoordinates(Z_MATRIX, keep_frame=True)
    assert (ic.inverse(ic(x)) - x).abs().max() < 1e-10
