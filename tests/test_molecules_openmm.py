"""OpenMM targets: exact oracles (closed-form harmonic bond, finite differences, rigid motions) and bad input."""

from __future__ import annotations

import copy
import math
import os
import pickle

import numpy as np
import pytest
import torch

openmm = pytest.importorskip("openmm")

from flows.targets import AlanineDipeptide, OpenMMTarget  # noqa: E402
from flows.targets.openmm import MOLAR_GAS_CONSTANT  # noqa: E402

K_BOND, R0 = 284512.0, 0.109  # kJ/mol/nm², nm
KT300 = 2.494338785  # kJ/mol at 300 K


def two_atom_system(k: float = K_BOND, r0: float = R0, constrained: bool = False) -> openmm.System:
    system = openmm.System()
    for _ in range(2):
        system.addParticle(1.0)
    bond = openmm.HarmonicBondForce()
    bond.addBond(0, 1, r0, k)
    system.addForce(bond)
    if constrained:
        system.addConstraint(0, 1, r0)
    return system


@pytest.fixture(scope="module")
def aldp() -> AlanineDipeptide:
    return AlanineDipeptide()


def random_rotation(gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


def test_two_atom_bond_energy_and_forces_match_the_closed_form():
    target = OpenMMTarget(two_atom_system(), 300.0)
    assert math.isclose(target.kT, KT300, rel_tol=1e-9)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 6, generator=gen, dtype=torch.float64) * 0.05
    d = x[:, 3:] - x[:, :3]
    r = d.norm(dim=-1)
    u_exact = 0.5 * K_BOND * (r - R0) ** 2 / (MOLAR_GAS_CONSTANT * 300.0)
    grad_exact = (K_BOND * (r - R0) / r)[:, None] * d / (MOLAR_GAS_CONSTANT * 300.0)
    u, grad = target.energy_and_grad(x)
    torch.testing.assert_close(u, u_exact, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad[:, 3:], grad_exact, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(grad[:, :3], -grad[:, 3:], rtol=0, atol=1e-12)  # Newton's third law
    # the autograd bridge gives the same gradient, and (*batch, n, 3) positions are accepted
    xr = x.reshape(4, 5, 2, 3).requires_grad_(True)
    u2 = target.energy(xr)
    assert u2.shape == (4, 5)
    (g2,) = torch.autograd.grad(u2.sum(), xr)
    torch.testing.assert_close(g2.reshape(20, 6), grad, rtol=1e-14, atol=0)


def test_bridge_passes_gradcheck_and_refuses_second_derivatives():
    target = OpenMMTarget(two_atom_system(k=1000.0, r0=0.15), 300.0)
    x = torch.tensor([[0.0, 0.0, 0.0, 0.1, 0.05, 0.02], [0.01, 0.0, 0.0, -0.1, 0.1, 0.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(target.energy, (x.requires_grad_(True),), eps=1e-6, atol=1e-6)
    with pytest.raises(NotImplementedError, match="expected create_graph=False"):
        target.energy_and_grad(x, create_graph=True)
    u = target.energy(x)
    (g,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), x)


def test_dtype_device_and_empty_batches_follow_the_caller(aldp):
    x = aldp.positions0.float()
    u = aldp.energy(x)
    assert u.dtype == torch.float32 and u.shape == ()
    u64, g64 = aldp.energy_and_grad(x.double().expand(3, -1))
    assert u64.dtype == torch.float64 and g64.shape == (3, 66)
    assert math.isclose(float(u), float(u64[0]), rel_tol=1e-5)
    assert aldp.energy(torch.zeros(0, 66)).shape == (0,)


def test_aldp_matches_the_reference_energies_of_the_prmtop_system(aldp):
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not os.path.exists(os.path.join(directory, "aldp_vacuum_300K_md.npz")):
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    with np.load(os.path.join(directory, "aldp_vacuum_300K_md.npz")) as f:
        x, e = torch.from_numpy(f["test"][:100].astype(np.float64)), f["energy_kT_test"][:100]
    u = aldp.energy(x).numpy()
    assert np.abs(u - e).max() < 1e-3  # amber96.xml against the openmmtools ff96 prmtop (measured 1.6e-4 kT)
    torch.testing.assert_close(aldp.reference_samples("val")[:5], torch.from_numpy(_load("val")[:5]).float())


def _load(split: str) -> np.ndarray:
    with np.load(os.path.join(os.environ["FLOWS_DATA_DIR"], "aldp_vacuum_300K_md.npz")) as f:
        return f[split].astype(np.float64)


@pytest.mark.parametrize("solvent", ["vacuum", "implicit"])
def test_aldp_forces_are_minus_the_gradient_by_central_differences(solvent):
    target = AlanineDipeptide(solvent)
    x = target.positions0.double()
    _, grad = target.energy_and_grad(x)
    h = 1e-5
    steps = torch.eye(66, dtype=torch.float64) * h
    fd = (target.energy(x + steps) - target.energy(x - steps)) / (2 * h)
    assert (fd - grad).abs().max() < 1e-4 * grad.abs().max()  # measured ~1e-7 relative


def test_rigid_motions_leave_the_energy_unchanged(aldp):
    gen = torch.Generator().manual_seed(1)
    pos = aldp.positions0.double().reshape(22, 3)
    moved = torch.stack([pos @ random_rotation(gen).T + torch.randn(3, generator=gen) for _ in range(5)])
    u = aldp.energy(moved.flatten(-2))
    assert (u - aldp.energy(pos.flatten())).abs().max() < 1e-9


def test_pickled_and_copied_targets_build_their_own_context(aldp):
    x = aldp.positions0.double()
    u = aldp.energy(x)
    for clone in (pickle.loads(pickle.dumps(aldp)), copy.deepcopy(aldp)):
        assert clone._context is None
        assert float(clone.energy(x)) == float(u)
        assert clone._context is not aldp._context


def test_nan_gives_nan_and_overflow_gives_plus_inf(aldp):
    x = aldp.positions0.double().expand(4, -1).clone()
    x[0, 0], x[1, 5], x[2, 2] = float("nan"), float("inf"), float("-inf")
    u, grad = aldp.energy_and_grad(x)
    assert torch.isnan(u[0]) and torch.isnan(grad[0]).all()
    assert u[1] == math.inf and u[2] == math.inf
    assert torch.isfinite(u[3]) and torch.isfinite(grad[1:]).all()
    two = OpenMMTarget(two_atom_system(), 300.0, check_units=False)  # coinciding atoms stay finite for a bond
    assert torch.isfinite(two.energy(torch.zeros(6)))


def test_bad_systems_and_positions_get_clear_errors(aldp):
    with pytest.raises(ValueError, match="expected a system without constraints, got 1 constraints"):
        OpenMMTarget(two_atom_system(constrained=True), 300.0)
    with pytest.raises(TypeError, match=r"expected an openmm\.System, got str"):
        OpenMMTarget("system.xml", 300.0)
    with pytest.raises(ValueError, match="expected a temperature > 0"):
        OpenMMTarget(two_atom_system(), -1.0)
    with pytest.raises(ValueError, match="expected solvent 'vacuum' or 'implicit'"):
        AlanineDipeptide("water")
    angstrom = aldp.positions0.double() * 10
    with pytest.raises(ValueError, match=r"expected positions in nm.*Ångström"):
        aldp.energy(angstrom)
    with pytest.raises(ValueError, match="expected positions in nm"):
        aldp.energy_and_grad(torch.stack([aldp.positions0.double(), angstrom]))
    assert torch.isfinite(AlanineDipeptide(check_units=False).energy(angstrom))
    # random (non-molecular) configurations in nm do not trip the units check
    assert torch.isfinite(aldp.energy(torch.randn(8, 66, generator=torch.Generator().manual_seed(3)))).all()
    with pytest.raises(ValueError, match="expected"):
        aldp.energy(torch.zeros(2, 65))
    with pytest.raises(ValueError, match="expected"):
        aldp.reference_samples("everything")


def test_three_atom_marginals_by_importance_sampling_match_quadrature():
    """p(b1, b2, a) ∝ b1² b2² sin a · e^{-u}: the OpenMM energy through the internal-coordinate log-det.

    Two harmonic bonds and a harmonic angle factorise, so log Z and ⟨a⟩ follow from 1-D quadratures;
    importance sampling from a uniform box in (b1, b2, a), mapped to positions by the inverse
    Z-matrix map, must recover them (the sin a and r² factors are what is tested).
    """
    from scipy.integrate import quad

    import flows

    k_r, r0, k_a, a0 = 2000.0, 0.1, 20.0, 1.9  # soft enough that the box proposal covers the density
    system = openmm.System()
    for _ in range(3):
        system.addParticle(1.0)
    bonds, angle = openmm.HarmonicBondForce(), openmm.HarmonicAngleForce()
    bonds.addBond(0, 1, r0, k_r)
    bonds.addBond(1, 2, r0, k_r)
    angle.addAngle(0, 1, 2, a0, k_a)
    system.addForce(bonds)
    system.addForce(angle)
    target = OpenMMTarget(system, 300.0)
    kt = target.kT
    ic = flows.InternalCoordinates([(1,), (0, 1), (2, 1, 0)])  # b1 = |x0 - x1|, b2 = |x2 - x1|, a = angle 0-1-2
    gen = torch.Generator().manual_seed(0)
    n = 50_000  # log Z error measured 2e-3 (se 0.011); dropping sin a would shift it by 0.12
    lo = torch.tensor([0.02, 0.02, 0.0], dtype=torch.float64)
    hi = torch.tensor([0.18, 0.18, math.pi], dtype=torch.float64)
    q = lo + (hi - lo) * torch.rand(n, 3, generator=gen, dtype=torch.float64)
    x, log_volume = ic.inverse_and_log_det(q)  # log(b1² b2² sin a)
    log_w = -target.energy(x) + log_volume + torch.log(hi - lo).sum()  # uniform proposal density 1 / box volume
    log_z = float(torch.logsumexp(log_w, 0) - math.log(n))
    w = torch.softmax(log_w, 0)
    z_r = quad(lambda r: r * r * math.exp(-0.5 * k_r * (r - r0) ** 2 / kt), 0.02, 0.18)[0]
    z_a = quad(lambda a: math.sin(a) * math.exp(-0.5 * k_a * (a - a0) ** 2 / kt), 0, math.pi)[0]
    mean_a = quad(lambda a: a * math.sin(a) * math.exp(-0.5 * k_a * (a - a0) ** 2 / kt), 0, math.pi)[0] / z_a
    ess = float(1 / (w.square().sum() * n))
    se = 1 / math.sqrt(ess * n)  # delta-method scale of the log Z error
    assert abs(log_z - math.log(z_r * z_r * z_a)) < 5 * se + 1e-3
    assert abs(float((w * q[:, 2]).sum()) - mean_a) < 0.01  # measured 2.3e-3
    assert abs(mean_a - a0) > 0.04  # the sin a factor moves the mean: the test can tell it is there


def test_backbone_reflection_negates_phi_and_psi_and_nothing_else(aldp):
    gen = torch.Generator().manual_seed(5)
    x = aldp.positions0.double() + 0.002 * torch.randn(8, 66, generator=gen, dtype=torch.float64)
    ic = aldp.internal_coordinates()  # no standardisation: every torsion on the circle, loc = 0
    move = aldp.backbone_reflection(ic).double()
    q = ic(x)
    moved = move(q)
    y = ic.inverse(moved)
    torch.testing.assert_close(aldp.phi_psi(y), -aldp.phi_psi(x), rtol=0, atol=1e-9)
    changed = (moved - q).abs().amax(0) > 1e-12
    assert int(changed.sum()) == 2  # φ and ψ only
    torch.testing.assert_close(move(moved), q, rtol=0, atol=1e-12)  # its own inverse
    assert bool(torch.isfinite(aldp.energy(y)).all())
    # standardised coordinates (φ shifted by its circular mean) give the same configurations
    ic_std = aldp.internal_coordinates(reference=x)
    y_std = ic_std.inverse(aldp.backbone_reflection(ic_std).double()(ic_std(x)))
    torch.testing.assert_close(aldp.phi_psi(y_std), -aldp.phi_psi(x), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="expected φ and ψ on the circle"):
        aldp.backbone_reflection(aldp.internal_coordinates(reference=x, linear_torsions=2.0))
