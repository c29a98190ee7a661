"""Particle flows: EGNN equivariance, the mean-free Gaussian, alignment, equivariant OT, evaluation (float64, tiny)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from flows import CNF
from flows.particles import (
    EGNN,
    EquivariantCNF,
    EquivariantOTCoupling,
    MeanFreeNormal,
    align,
    aligned_distances,
    best_permutation,
    boltzmann_evaluation,
    kabsch,
    nll_conventions,
    particle_nll,
    path_lengths,
    remove_mean,
    subspace_basis,
)
from flows.particles.alignment import _max_trace
from flows.targets import DW4

F64 = torch.float64


def _orthogonal(d: int, gen: torch.Generator, reflect: bool) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    if reflect:
        q[:, -1] = -q[:, -1]
    return q


def _act(x: torch.Tensor, n: int, d: int, perm: torch.Tensor, rot: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Apply x -> permute(R x + c) to flat configurations."""
    pos = x.unflatten(-1, (n, d))
    return (pos[..., perm, :] @ rot.T + shift).flatten(-2)


def _perturbed_field(n: int, d: int, seed: int = 0) -> EGNN:
    torch.manual_seed(seed)
    field = EGNN(n, d, width=8, layers=2).double()
    with torch.no_grad():
        for p in field.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return field


@pytest.mark.parametrize(("n", "d"), [(4, 2), (5, 3)])
@pytest.mark.parametrize("reflect", [False, True])
def test_egnn_equivariance(n: int, d: int, reflect: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    field = _perturbed_field(n, d)
    z = torch.randn(6, n * d, generator=gen, dtype=F64)
    perm, rot = torch.randperm(n, generator=gen), _orthogonal(d, gen, reflect)
    shift = torch.randn(d, generator=gen, dtype=F64)
    for t in (torch.tensor(0.3, dtype=F64), torch.rand(6, generator=gen, dtype=F64)):
        f = field(t, z)
        moved = field(t, _act(z, n, d, perm, rot, shift))
        torch.testing.assert_close(moved, _act(f, n, d, perm, rot, torch.zeros(d, dtype=F64)), atol=1e-12, rtol=0)
        assert f.unflatten(-1, (n, d)).sum(-2).abs().max() < 1e-12  # mean free
        assert f.abs().max() > 1e-3  # not trivially zero


def test_egnn_jvp_matches_autograd_jacobian() -> None:
    n, d = 4, 3
    field = _perturbed_field(n, d)
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(3, n * d, generator=gen, dtype=F64)
    t = torch.rand(3, generator=gen, dtype=F64)
    tangents = torch.randn(5, 3, n * d, generator=gen, dtype=F64)
    f, jv = field.jvp(t, z, tangents)
    torch.testing.assert_close(f, field(t, z), atol=1e-14, rtol=0)
    for i in range(3):
        jac = torch.func.jacrev(lambda s, i=i: field(t[i : i + 1], s[None])[0])(z[i])
        torch.testing.assert_close(jv[:, i], tangents[:, i] @ jac.T, atol=1e-12, rtol=0)
    # the Jacobian is P J P: zero along translations and mean free
    jac = torch.func.jacrev(lambda s: field(t[:1], s[None])[0])(z[0])
    ones = torch.eye(d, dtype=F64).repeat(n, 1)  # (n d, d): the translation directions
    assert (jac @ ones).abs().max() < 1e-12 and (ones.T @ jac).abs().max() < 1e-12


@pytest.mark.parametrize("contract", [False, True])
@pytest.mark.parametrize(("n", "d", "layers"), [(4, 2, 1), (3, 2, 2), (4, 3, 3), (5, 2, 4)])
def test_egnn_divergence_matches_the_autograd_trace(n: int, d: int, layers: int, contract: bool) -> None:
    """Both routes through the last node update (dense tangents, or contracted with the last layer)."""
    torch.manual_seed(layers)
    field = EGNN(n, d, width=6, layers=layers).double()
    field.contract_from = 0 if contract else 10**9
    with torch.no_grad():
        for p in field.parameters():
            p.add_(0.3 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(7, n * d, generator=gen, dtype=F64)
    t = torch.rand(7, generator=gen, dtype=F64)
    field.divergence_chunk = n**3 * d * 6 * 2  # two samples per chunk: the chunked path is exercised
    f, div = field.divergence(t, z)
    torch.testing.assert_close(f, field(t, z), atol=1e-14, rtol=0)
    traces = torch.stack(
        [torch.func.jacrev(lambda s, i=i: field(t[i : i + 1], s[None])[0])(z[i]).trace() for i in range(len(z))]
    )
    torch.testing.assert_close(div, traces, atol=1e-12, rtol=0)
    assert traces.abs().min() > 1e-4  # a zero trace would pass any implementation
    # scalar time, and differentiable: the gradient of the trace matches autograd through jacrev
    _, div0 = field.divergence(torch.tensor(0.4, dtype=F64), z[:2])
    weights = [field.coord[-1][-1].weight, field.edge[-1][2].weight, field.edge[0][0].weight]
    weights += [field.node[-1][0].weight] if layers > 1 else []
    grads = torch.autograd.grad(div0.sum(), weights)
    expect = sum(
        torch.func.jacrev(lambda s, i=i: field(torch.tensor(0.4, dtype=F64), s[None])[0])(z[i]).trace()
        for i in range(2)
    )
    grads_ref = torch.autograd.grad(expect, weights)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(grad, grad_ref, atol=1e-11, rtol=0)
    with pytest.raises(ValueError, match=r"expected z of shape \(N, n·d\)"):
        field.divergence(torch.tensor(0.0), z[None])


def test_cnf_uses_the_divergence_hook_for_the_exact_trace() -> None:
    """The CNF's log-det through EGNN.divergence equals the one through the dense JVPs."""

    class DenseOnly(torch.nn.Module):
        def __init__(self, inner: EGNN) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, t, z):
            return self.inner(t, z)

        def jvp(self, t, z, tangents):
            return self.inner.jvp(t, z, tangents)

    n, d = 4, 2
    field = _perturbed_field(n, d)
    calls = []
    original = field.divergence
    field.divergence = lambda t, z: calls.append(1) or original(t, z)
    x = torch.randn(3, n * d, dtype=F64)
    fast = CNF(n * d, field=field, rtol=1e-10, atol=1e-10)
    dense = CNF(n * d, field=DenseOnly(field), rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        z1, ladj1 = fast.forward_and_log_det(x)
        z2, ladj2 = dense.forward_and_log_det(x)
    assert calls and fast.nfe == dense.nfe
    torch.testing.assert_close(z1, z2, atol=1e-12, rtol=0)
    torch.testing.assert_close(ladj1, ladj2, atol=1e-10, rtol=0)
    assert ladj1.abs().min() > 1e-3


def test_egnn_rejects_bad_shapes() -> None:
    field = EGNN(3, 2, width=4, layers=1)
    with pytest.raises(ValueError, match=r"expected z of shape \(\*batch, 6\)"):
        field(torch.tensor(0.0), torch.randn(2, 5))
    with pytest.raises(ValueError, match="expected t of shape"):
        field(torch.zeros(3), torch.randn(2, 6))
    with pytest.raises(ValueError, match="expected n_particles to be an int >= 2"):
        EGNN(1, 2)


def test_log_prob_invariant_under_the_symmetry_group() -> None:
    n, d = 4, 2
    torch.manual_seed(0)
    flow = EquivariantCNF(n, d, hidden=(8, 8), rtol=1e-11, atol=1e-11).double()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, n * d, generator=gen, dtype=F64)
    log_q = flow.log_prob(x).detach()
    for reflect in (False, True):
        perm, rot = torch.randperm(n, generator=gen), _orthogonal(d, gen, reflect)
        moved = _act(x, n, d, perm, rot, 3 * torch.randn(d, generator=gen, dtype=F64))
        torch.testing.assert_close(flow.log_prob(moved).detach(), log_q, atol=1e-8, rtol=0)
    assert (log_q - flow.base.log_prob(x)).abs().max() > 1e-3  # the flow is not the identity


def test_cnf_log_det_on_the_subspace() -> None:
    """ladj = log|det| of the solution map's Jacobian in an orthonormal basis of the subspace."""
    n, d = 3, 2
    cnf = CNF(n * d, field=_perturbed_field(n, d), rtol=1e-10, atol=1e-10)
    q = subspace_basis(n, d, dtype=F64)
    gen = torch.Generator().manual_seed(4)
    for x in remove_mean(torch.randn(2, n * d, generator=gen, dtype=F64), n, d):
        jac = torch.autograd.functional.jacobian(lambda s: cnf(s[None])[0], x)
        sub = q.T @ jac @ q
        _, ladj = cnf.forward_and_log_det(x[None])
        torch.testing.assert_close(ladj[0].detach(), torch.linalg.slogdet(sub)[1], atol=1e-7, rtol=0)
        torch.testing.assert_close(jac @ (torch.eye(n * d, dtype=F64) - q @ q.T), torch.eye(n * d, dtype=F64) - q @ q.T)
        assert abs(ladj.item()) > 1e-3


def test_subspace_basis_is_orthonormal_and_spans_the_subspace() -> None:
    q = subspace_basis(4, 3, dtype=F64)
    torch.testing.assert_close(q.T @ q, torch.eye(9, dtype=F64))
    x = torch.randn(7, 12, dtype=F64)
    torch.testing.assert_close(x @ q @ q.T, remove_mean(x, 4, 3))


@pytest.mark.parametrize(("n", "d"), [(2, 1), (3, 1), (2, 2)])
def test_mean_free_normal_integrates_to_one_on_its_subspace(n: int, d: int) -> None:
    base = MeanFreeNormal(n, d).double()
    q = subspace_basis(n, d, dtype=F64)
    k = (n - 1) * d
    grid = torch.linspace(-9, 9, 801, dtype=F64)
    step = (grid[1] - grid[0]).item()
    coords = torch.cartesian_prod(*([grid] * k)).reshape(-1, k)
    density = base.log_prob(coords @ q.T).exp()
    assert abs(density.sum().item() * step**k - 1) < 1e-6
    assert base.subspace_dim == k and math.isclose(base.log_normalizer, 0.5 * k * math.log(2 * math.pi))


def test_mean_free_normal_samples_and_invariance() -> None:
    base = MeanFreeNormal(5, 3).double()
    torch.manual_seed(0)
    z = base.sample((2000,))
    assert z.unflatten(-1, (5, 3)).sum(-2).abs().max() < 1e-12
    cov = torch.cov(z.T)
    torch.testing.assert_close(cov, remove_mean(torch.eye(15, dtype=F64), 5, 3), atol=0.1, rtol=0)
    shifted = (z[:3].unflatten(-1, (5, 3)) + torch.tensor([1.0, -2.0, 0.5], dtype=F64)).flatten(-2)
    torch.testing.assert_close(base.log_prob(shifted), base.log_prob(z[:3]))
    with pytest.raises(ValueError, match="expected spatial_dim to be an int >= 1"):
        MeanFreeNormal(3, 0)


@pytest.mark.parametrize("reflect", [False, True])
def test_kabsch_recovers_a_known_rotation(reflect: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    x = remove_mean(torch.randn(7 * 3, generator=gen, dtype=F64), 7, 3).reshape(7, 3)
    rot = _orthogonal(3, gen, reflect)
    torch.testing.assert_close(kabsch(x, x @ rot.T), rot)
    proper = kabsch(x, x @ rot.T, reflections=False)
    assert torch.linalg.det(proper).item() == pytest.approx(1.0)
    if not reflect:
        torch.testing.assert_close(proper, rot)
    with pytest.raises(ValueError, match="expected x and z of the same shape"):
        kabsch(x, x[:3])


def test_permutation_alignment_recovers_a_known_permutation() -> None:
    gen = torch.Generator().manual_seed(6)
    z = torch.randn(9, 2, generator=gen, dtype=F64)
    perm = torch.randperm(9, generator=gen)
    sigma = best_permutation(z[perm], z)
    assert torch.equal(perm[sigma], torch.arange(9))


def test_align_undoes_permutation_rotation_and_translation() -> None:
    n, d = 6, 3
    gen = torch.Generator().manual_seed(7)
    z = remove_mean(torch.randn(4, n * d, generator=gen, dtype=F64), n, d)
    perm, rot = torch.randperm(n, generator=gen), _orthogonal(d, gen, True)
    # rotate by a small angle so the assignment on raw distances can find the permutation first
    rot = torch.linalg.matrix_exp(0.1 * (rot - rot.T) / 2)
    x = _act(z, n, d, perm, rot, torch.randn(d, generator=gen, dtype=F64))
    torch.testing.assert_close(align(x, z, n, d), z, atol=1e-10, rtol=0)


def _brute_force_aligned(x: torch.Tensor, z: torch.Tensor, n: int, d: int, reflections: bool) -> float:
    """min over all permutations (each with Kabsch) of ||R x_sigma - z||^2, centred."""
    xc, zc = remove_mean(x, n, d).reshape(n, d), remove_mean(z, n, d).reshape(n, d)
    best = math.inf
    for perm in itertools.permutations(range(n)):
        xp = xc[list(perm)]
        r = kabsch(xp, zc, reflections=reflections)
        best = min(best, float((xp @ r.T - zc).square().sum()))
    return best


@pytest.mark.parametrize(("n", "d"), [(4, 2), (3, 3), (4, 1)])
@pytest.mark.parametrize("reflections", [True, False])
def test_aligned_distances_are_the_group_minimum(n: int, d: int, reflections: bool) -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, n * d, generator=gen, dtype=F64) + 5  # not centred: translations are removed
    z = torch.randn(6, n * d, generator=gen, dtype=F64)
    got = aligned_distances(x, z, n, d, reflections=reflections)
    expect = [_brute_force_aligned(x[i], z[i], n, d, reflections) for i in range(6)]
    torch.testing.assert_close(got, torch.tensor(expect, dtype=F64), atol=1e-10, rtol=0)
    moved = align(x, z, n, d, reflections=reflections)
    torch.testing.assert_close((moved - remove_mean(z, n, d)).square().sum(-1), got, atol=1e-10, rtol=0)
    # the closed form of the orthogonal fit agrees with the singular values
    h = torch.randn(5, d, d, generator=gen, dtype=F64)
    s = torch.linalg.svdvals(h)
    if reflections:
        expect_trace = s.sum(-1)
    else:
        expect_trace = s[:, :-1].sum(-1) + torch.sign(torch.linalg.det(h)) * s[:, -1]
    torch.testing.assert_close(_max_trace(h, reflections), expect_trace, atol=1e-12, rtol=0)


def test_large_systems_align_by_assignment_then_kabsch_and_refinement_helps() -> None:
    n, d = 9, 3  # beyond exact_up_to: assignment on distances, then Kabsch, then refinement rounds
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(16, n * d, generator=gen, dtype=F64)
    z = torch.randn(16, n * d, generator=gen, dtype=F64)
    zc = remove_mean(z, n, d)
    plain = (align(x, z, n, d, refine=0) - zc).square().sum(-1)
    refined = (align(x, z, n, d, refine=3) - zc).square().sum(-1)
    assert (refined <= plain + 1e-9).all() and (refined < plain - 1e-6).any()
    torch.testing.assert_close(aligned_distances(x, z, n, d), plain, atol=1e-9, rtol=0)
    # the aligned rows are the same configurations (distance multisets unchanged)
    for a, b in zip(align(x, z, n, d, refine=2), x, strict=True):
        torch.testing.assert_close(_pair_distances(a, n, d), _pair_distances(b, n, d))


@pytest.mark.parametrize(("n", "d"), [(4, 2), (8, 3)])  # all permutations; assignment then Kabsch
def test_alignment_broadcasts_a_single_reference_row(n: int, d: int) -> None:
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(5, n * d, generator=gen, dtype=F64)
    z = torch.randn(5, n * d, generator=gen, dtype=F64)
    one_x, one_z = x[:1].expand_as(z).clone(), z[:1].expand_as(x).clone()
    assert torch.equal(aligned_distances(x[:1], z, n, d), aligned_distances(one_x, z, n, d))
    assert torch.equal(aligned_distances(x, z[:1], n, d), aligned_distances(x, one_z, n, d))
    assert torch.equal(align(x, z[:1], n, d, refine=2), align(x, one_z, n, d, refine=2))
    assert align(x[:0], z[:0], n, d).shape == (0, n * d)


def test_coupling_costs_radial_bound_and_candidates() -> None:
    n, d, batch = 8, 3, 12
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(batch, n * d, generator=gen, dtype=F64)
    z = remove_mean(torch.randn(batch, n * d, generator=gen, dtype=F64), n, d)
    full = EquivariantOTCoupling(n, d).cost_matrix(x, z)
    radial = EquivariantOTCoupling(n, d, cost="radial").cost_matrix(x, z)
    assert (radial <= full + 1e-9).all()  # sorted radii give a lower bound of every alignment
    some = EquivariantOTCoupling(n, d, candidates=3).cost_matrix(x, z)
    chosen = radial.topk(3, dim=0, largest=False).indices
    for j in range(batch):
        torch.testing.assert_close(some[chosen[:, j], j], full[chosen[:, j], j])
        others = [i for i in range(batch) if i not in chosen[:, j].tolist()]
        assert (some[others, j] >= full[chosen[:, j], j].max() - 1e-12).all()
    # as many candidates as rows: every cost is the aligned one
    torch.testing.assert_close(EquivariantOTCoupling(n, d, candidates=batch).cost_matrix(x, z), full)
    for x2, _ in (EquivariantOTCoupling(n, d, candidates=3)(x, z), EquivariantOTCoupling(n, d, cost="radial")(x, z)):
        rows = [
            [i for i in range(batch) if torch.allclose(_pair_distances(r, n, d), _pair_distances(x[i], n, d))]
            for r in x2
        ]
        assert sorted(r[0] for r in rows) == list(range(batch))
    with pytest.raises(ValueError, match="expected cost 'aligned' or 'radial'"):
        EquivariantOTCoupling(n, d, cost="rmsd")
    with pytest.raises(ValueError, match="expected candidates to be None or an int >= 1"):
        EquivariantOTCoupling(n, d, candidates=0)


def _pair_distances(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    pos = x.unflatten(-1, (n, d))
    return torch.cdist(pos, pos).flatten(-2).sort(-1).values


def test_equivariant_ot_coupling_matches_brute_force() -> None:
    n, d, batch = 4, 2, 4
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(batch, n * d, generator=gen, dtype=F64)
    z = remove_mean(torch.randn(batch, n * d, generator=gen, dtype=F64), n, d)
    x2, z2 = EquivariantOTCoupling(n, d)(x, z)
    assert torch.equal(z2, z)
    # every output row is a data row moved by a symmetry: same distance multiset, each used once
    used = []
    for row in x2:
        match = [i for i in range(batch) if torch.allclose(_pair_distances(row, n, d), _pair_distances(x[i], n, d))]
        assert len(match) == 1
        used.append(match[0])
    assert sorted(used) == list(range(batch))
    # the total cost is the brute-force minimum over batch assignments of the aligned costs
    cost = torch.stack(
        [((align(x[i : i + 1], z[j : j + 1], n, d) - z[j]) ** 2).sum() for i in range(batch) for j in range(batch)]
    )
    cost = cost.reshape(batch, batch)
    best = min(sum(cost[p[j], j] for j in range(batch)) for p in itertools.permutations(range(batch)))
    assert (x2 - z2).square().sum().item() == pytest.approx(best.item(), abs=1e-10)
    # without OT the pairs are kept
    x3, _ = EquivariantOTCoupling(n, d, ot=False)(x, z)
    for i in range(batch):
        torch.testing.assert_close(_pair_distances(x3[i], n, d), _pair_distances(x[i], n, d))
    with pytest.raises(ValueError, match=r"expected [xz] of shape \(N, 8\) for 4 particles in 2 dimensions"):
        EquivariantOTCoupling(n, d)(x[:, :6], z[:, :6])


def test_path_lengths_shrink_with_the_coupling() -> None:
    target = DW4().double()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, 8, generator=gen, dtype=F64) * 2
    z = MeanFreeNormal(4, 2).double()
    torch.manual_seed(0)
    lengths = path_lengths(x, z.sample((64,)), 4, 2, batch_size=32)
    assert lengths["equivariant OT"] < lengths["OT"] < lengths["independent"]
    assert target.dim == 8


def test_nll_conventions_match_published_pairs() -> None:
    # Klein et al. (2023) report DW4 1.70 (bgflow) = 7.21 normalised, LJ13 -14.96 = 18.12
    assert nll_conventions(7.21, 4, 2)["bgflow"] == pytest.approx(1.70, abs=0.005)
    assert nll_conventions(18.12, 13, 3)["bgflow"] == pytest.approx(-14.96, abs=0.005)


def test_particle_nll_and_boltzmann_evaluation() -> None:
    torch.manual_seed(0)
    flow = EquivariantCNF(4, 2, hidden=(8,), rtol=1e-6, atol=1e-6)
    x = torch.randn(6, 8) * 2
    nll = particle_nll(flow, x, batch_size=4)
    assert nll.dtype == F64 and nll.shape == (6,) and flow._anchor.dtype == torch.float32
    # no autograd graph is kept through the solves (a graph over every step exhausts memory on real sizes)
    assert not nll.requires_grad
    torch.testing.assert_close(particle_nll(flow, x, batch_size=4, progress=True), nll)
    with pytest.raises(ValueError, match="expected batch_size to be an int >= 1"):
        particle_nll(flow, x, batch_size=0)
    with torch.no_grad():
        torch.testing.assert_close(nll.float(), -flow.log_prob(x), atol=1e-3, rtol=0)
    result = boltzmann_evaluation(flow, DW4(), 50, batch_size=20)
    assert result.samples.shape == (50, 8) and result.log_w.shape == (50,)
    assert 0 < result.ess <= 1 and np.isfinite(result.mean_energy[0]) and result.mean_energy[1] >= 0
    assert flow._anchor.dtype == torch.float32


def test_boltzmann_evaluation_standard_error_survives_samples_of_huge_energy() -> None:
    """A sample of enormous energy has zero weight; its (u - <u>)^2 overflowing must not turn the error into NaN."""

    class Clashing(torch.nn.Module):
        def energy(self, x: torch.Tensor) -> torch.Tensor:
            u = x.square().sum(-1)
            return torch.where(torch.arange(len(x)) % 2 == 0, u, torch.full_like(u, 1e30))

    torch.manual_seed(0)
    flow = EquivariantCNF(4, 2, hidden=(8,), rtol=1e-5, atol=1e-5)
    result = boltzmann_evaluation(flow, Clashing(), 20, batch_size=20, dtype=torch.float32)
    assert math.isfinite(result.mean_energy[0]) and math.isfinite(result.mean_energy[1])
    assert result.mean_energy[0] < 1e3  # the clashing half has no weight


def test_egnn_compiled_divergence_is_the_eager_one() -> None:
    """``compile_divergence``: the same field, trace and gradient, with the last chunk padded and cut."""
    torch.manual_seed(3)
    field = EGNN(5, 3, width=6, layers=3).double()
    with torch.no_grad():
        for p in field.parameters():
            p.add_(0.3 * torch.randn_like(p))
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(7, 15, generator=gen, dtype=F64)
    t = torch.rand(7, generator=gen, dtype=F64)
    field.divergence_chunk = 5**3 * 3 * 6 * 3  # chunks of 3: the last of the 7 rows is padded
    eager = field.divergence(t, z)
    field.compile_divergence = True
    try:
        compiled = field.divergence(t, z)
        with torch.no_grad():  # as in an ODE solve: a scalar time, no graph
            scalar = field.divergence(torch.tensor(0.25, dtype=F64), z)
    finally:
        field.compile_divergence = False
    assert compiled[0].shape == (7, 15) and compiled[1].shape == (7,)
    torch.testing.assert_close(compiled, eager, atol=1e-12, rtol=0)
    torch.testing.assert_close(scalar, field.divergence(torch.tensor(0.25, dtype=F64), z), atol=1e-12, rtol=0)
    weight = field.coord[-1][-1].weight
    (grad,) = torch.autograd.grad(compiled[1].sum(), weight)
    (grad_eager,) = torch.autograd.grad(eager[1].sum(), weight)
    torch.testing.assert_close(grad, grad_eager, atol=1e-11, rtol=0)


def _poisoned_pair(n: int = 4, d: int = 2, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n * d, generator=gen, dtype=torch.float64)
    z = torch.randn(batch, n * d, generator=gen, dtype=torch.float64)
    return x, z


@pytest.mark.parametrize("n", [4, 8])  # the exact enumeration and the assignment + Kabsch path
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_align_gives_nan_rows_for_non_finite_pairs_and_keeps_the_others(n: int, value: float) -> None:
    x, z = _poisoned_pair(n)
    clean_aligned, clean_distances = align(x, z, n, 2), aligned_distances(x, z, n, 2)
    x[1, 3] = value
    aligned, distances = align(x, z, n, 2), aligned_distances(x, z, n, 2)
    assert bool(torch.isnan(aligned[1]).all()) and torch.isnan(distances[1])
    torch.testing.assert_close(aligned[[0, 2]], clean_aligned[[0, 2]])
    torch.testing.assert_close(distances[[0, 2]], clean_distances[[0, 2]])
    r = kabsch(x.reshape(3, n, 2), z.reshape(3, n, 2))
    assert bool(torch.isnan(r[1]).all()) and bool(torch.isfinite(r[[0, 2]]).all())


def test_particle_functions_share_one_input_check() -> None:
    x, z = _poisoned_pair()
    ints = x.round().long()
    torch.testing.assert_close(align(ints, z, 4, 2), align(ints.double(), z, 4, 2))  # promoted, not refused
    torch.testing.assert_close(remove_mean(ints, 4, 2), remove_mean(ints.double(), 4, 2))
    assert align(x[:0], z[:0], 4, 2).shape == (0, 8) and aligned_distances(x[:0], z[:0], 4, 2).shape == (0,)
    for call in (lambda: align(x, z, 3, 2), lambda: remove_mean(x, 3, 2), lambda: path_lengths(x, z, 3, 2)):
        with pytest.raises(ValueError, match=r"expected x of shape \(.*6\) for 3 particles in 2 dimensions"):
            call()
    with pytest.raises(ValueError, match="expected non-empty x"):
        path_lengths(x[:0], z[:0], 4, 2)
    bad = x.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="expected x without NaN values"):
        path_lengths(bad, z, 4, 2)
    with pytest.raises(ValueError, match="expected x without NaN values"):
        best_permutation(bad[0].reshape(4, 2), z[0].reshape(4, 2))
    with pytest.raises(ValueError, match="expected x without NaN values"):
        EquivariantOTCoupling(4, 2)(bad, z)
    with pytest.raises(ValueError, match=r"with n, d >= 1"):
        kabsch(torch.zeros(0, 2), torch.zeros(0, 2))
    with pytest.raises(TypeError, match=r"expected x to be a torch\.Tensor"):
        align(x.tolist(), z, 4, 2)
    with pytest.raises(ValueError, match=r"expected exact_up_to to be an int in \[0, 8\]"):
        align(x, z, 4, 2, exact_up_to=12)
    with pytest.raises(TypeError, match="expected a floating-point dtype"):
        subspace_basis(3, 2, dtype=torch.int64)
