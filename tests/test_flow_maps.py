"""Regression-trained flow maps (FORT / RegFlow): the loss, the pair generators, distillation, SNIS oracles."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import flows
from flows import Affine, Chain, Flow, LULinear, RealNVP, StandardNormal
from flows.metrics import kish_ess, log_z_estimate, reweighted_mean, sample_log_weights
from flows.targets import Gaussian
from flows.testing import perturb_parameters
from flows.train import PairRegression, Trainer, pair_regression_loss
from flows.train.pairs import ot_assignment, ot_pairs, teacher_pairs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _affine_teacher(seed: int = 0) -> Flow:
    """An exact affine teacher x = A z + b (non-diagonal A), float64: LU-linear then elementwise affine."""
    torch.manual_seed(seed)
    transform = Chain(LULinear(2), Affine(2))  # identity LU signs: a student of the same class can match it
    perturb_parameters(transform, 0.5, generator=_gen(seed + 1))
    return Flow(transform, StandardNormal(2)).double()


def _regress(student: Flow, z: torch.Tensor, x: torch.Tensor, *, steps: int, lr: float, consistency: float = 1.0):
    """Full-batch Adam on the regression loss (float64, deterministic)."""
    optimizer = torch.optim.Adam(student.parameters(), lr=lr)
    for _ in range(steps):
        loss, _ = pair_regression_loss(student, x, z, consistency=consistency)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


# -- the loss ------------------------------------------------------------------------------------


@pytest.mark.parametrize("consistency", [0.0, 1.0, 3.0])
def test_loss_is_zero_for_the_exact_map(consistency: float) -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(RealNVP(2, transforms=4, hidden=(16,)).double(), 0.3, generator=_gen(1))
    x = torch.randn(64, 2, dtype=torch.float64, generator=_gen(2))
    with torch.no_grad():
        z = flow.transform(x)
    for model in (flow, flow.transform):  # a Flow or its transform
        loss, metrics = pair_regression_loss(model, x, z, consistency=consistency)
        assert loss.item() < 1e-24
        assert ("consistency_error" in metrics) == (consistency > 0)
    # and not zero for pairs that are not the map's
    loss, _ = pair_regression_loss(flow, x, z + 0.1, consistency=consistency)
    assert loss.item() > 1e-4


def test_loss_value_and_gradient_on_a_linear_toy() -> None:
    """T(x) = x e^s + t: closed-form value and gradients of both terms (per sample: sums over dims, mean over batch)."""
    shift = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64)
    log_scale = torch.tensor([0.2, -0.4, 0.5], dtype=torch.float64)
    layer = Affine(3, shift=shift, log_scale=log_scale).double()
    z = torch.randn(50, 3, dtype=torch.float64, generator=_gen(0))
    x = torch.randn(50, 3, dtype=torch.float64, generator=_gen(1))
    lam = 0.7
    loss, metrics = pair_regression_loss(layer, x, z, consistency=lam)
    loss.backward()
    t, s = layer.params.detach()[..., 0], layer.params.detach()[..., 1]  # the float32-rounded initial values
    r = (z - t) * torch.exp(-s) - x  # T⁻¹(z) − x
    q = x * torch.exp(s) + t - z  # T(x) − z
    assert loss.item() == pytest.approx((r.square().sum(1).mean() + lam * q.square().sum(1).mean()).item(), rel=1e-12)
    assert metrics["sampling_error"].item() == pytest.approx(r.square().sum(1).mean().item(), rel=1e-12)
    assert metrics["consistency_error"].item() == pytest.approx(q.square().sum(1).mean().item(), rel=1e-12)
    grad_t = (2 * r * -torch.exp(-s)).mean(0) + lam * (2 * q).mean(0)
    grad_s = (2 * r * -(z - t) * torch.exp(-s)).mean(0) + lam * (2 * q * x * torch.exp(s)).mean(0)
    grad = layer.params.grad  # (..., [shift, log_scale])
    torch.testing.assert_close(grad[..., 0], grad_t, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad[..., 1], grad_s, rtol=1e-12, atol=1e-12)


def test_loss_handles_batch_shapes_and_context() -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(RealNVP(3, context=2, transforms=2, hidden=(8,)).double(), 0.2, generator=_gen(0))
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    c = torch.randn(4, 5, 2, dtype=torch.float64)
    with torch.no_grad():
        z = flow.transform(x, c)
    loss, _ = pair_regression_loss(flow, x, z, c)
    assert loss.shape == () and loss.item() < 1e-24
    loss, _ = PairRegression()(flow, (x + 1.0, z, c))
    assert loss.item() > 1.0


def test_loss_rejects_bad_input() -> None:
    flow = RealNVP(2, transforms=2, hidden=(8,))
    z, x = torch.randn(5, 2), torch.randn(5, 2)
    with pytest.raises(ValueError, match="expected z and x with the same batch shape"):
        pair_regression_loss(flow, x[:4], z)
    with pytest.raises(ValueError, match=r"expected x of shape \(\*batch, 2\)"):
        pair_regression_loss(flow, torch.randn(5, 3), z)
    with pytest.raises(ValueError, match="expected a finite consistency weight >= 0"):
        pair_regression_loss(flow, x, z, consistency=-1.0)
    with pytest.raises(TypeError, match="expected a Flow or a Bijection"):
        pair_regression_loss(torch.nn.Linear(2, 2), z, x)
    with pytest.raises(ValueError, match="expected a finite consistency weight >= 0"):
        PairRegression(float("nan"))
    with pytest.raises(TypeError, match=r"expected a batch \(x, z\) or \(x, z, context\)"):
        PairRegression()(flow, (x,))
    with pytest.raises(TypeError, match=r"expected a batch \(x, z\) or \(x, z, context\)"):
        PairRegression()(flow, x)


# -- optimal-transport pairs ---------------------------------------------------------------------


def _cost(z: torch.Tensor, x: torch.Tensor) -> float:
    return (z - x).reshape(z.shape[0], -1).square().sum().item()


@pytest.mark.parametrize("seed", range(5))
def test_ot_assignment_is_optimal_by_brute_force(seed: int) -> None:
    n = 6  # 720 permutations
    z = torch.randn(n, 2, dtype=torch.float64, generator=_gen(seed))
    x = 1.5 * torch.randn(n, 2, dtype=torch.float64, generator=_gen(seed + 100)) + 0.5
    sigma = ot_assignment(z, x)
    assert sorted(sigma.tolist()) == list(range(n))
    best = min(_cost(z, x[list(p)]) for p in itertools.permutations(range(n)))
    assert _cost(z, x[sigma]) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_ot_assignment_flattens_event_dims_and_keeps_device_dtype() -> None:
    z = torch.randn(5, 2, 3, generator=_gen(0))
    x = torch.randn(5, 2, 3, generator=_gen(1))
    sigma = ot_assignment(z, x)
    best = min(_cost(z, x[list(p)]) for p in itertools.permutations(range(5)))
    assert sigma.dtype == torch.long and _cost(z, x[sigma]) == pytest.approx(best, rel=1e-6)


def test_ot_pairs_is_optimal_within_each_chunk() -> None:
    n, chunk = 17, 5
    z = torch.randn(n, 2, dtype=torch.float64, generator=_gen(0))
    x = torch.randn(n, 2, dtype=torch.float64, generator=_gen(1)) + 1.0
    for shuffle in (False, True):
        x_out, z_out = ot_pairs(x, z, batch_size=chunk, shuffle=shuffle, generator=_gen(2))
        assert z_out is z
        # a permutation of the target samples (each used once)
        assert torch.equal(torch.sort(x_out[:, 0]).values, torch.sort(x[:, 0]).values)
        for start in range(0, n, chunk):
            zc, xc = z[start : start + chunk], x_out[start : start + chunk]
            best = min(_cost(zc, xc[list(p)]) for p in itertools.permutations(range(xc.shape[0])))
            assert _cost(zc, xc) == pytest.approx(best, rel=1e-12)
    # without shuffling, chunk i pairs z's chunk i with x's chunk i
    x_out, _ = ot_pairs(x, z, batch_size=chunk, shuffle=False)
    assert torch.equal(torch.sort(x_out[:chunk, 0]).values, torch.sort(x[:chunk, 0]).values)
    # one chunk: the global optimum
    x_all, _ = ot_pairs(x[:7], z[:7], batch_size=100, shuffle=False)
    assert torch.equal(x_all, x[:7][ot_assignment(z[:7], x[:7])])


def test_ot_pairs_reject_bad_input() -> None:
    x = torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"expected x and z of the same shape \(N, \*event\)"):
        ot_assignment(x, torch.randn(5, 2))
    with pytest.raises(ValueError, match="expected a finite z"):
        ot_assignment(x, torch.tensor([[0.0, float("nan")]] * 4))
    with pytest.raises(TypeError, match="expected a floating-point z"):
        ot_assignment(x, torch.ones(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected x of shape \(N, \*event\) with N >= 1"):
        ot_assignment(torch.randn(4), torch.randn(4))
    with pytest.raises(ValueError, match="expected batch_size to be an int >= 1"):
        ot_pairs(x, x, batch_size=0)


# -- teacher pairs -------------------------------------------------------------------------------


def test_teacher_pairs_are_the_teachers_sampling_map() -> None:
    teacher = _affine_teacher()
    teacher.train()
    torch.manual_seed(0)
    x, z = teacher_pairs(teacher, 10, batch_size=3)
    assert z.shape == x.shape == (10, 2) and z.dtype == torch.float64
    torch.testing.assert_close(x, teacher.transform.inverse(z))
    assert teacher.training  # mode restored
    # conditional teacher: one latent per context row, x = f⁻¹(z; c)
    cond = perturb_parameters(RealNVP(2, context=1, transforms=2, hidden=(8,)), 0.3, generator=_gen(0))
    c = torch.randn(7, 1)
    x, z = teacher_pairs(cond, 7, context=c, batch_size=4)
    torch.testing.assert_close(x, cond.transform.inverse(z, c))


def test_teacher_pairs_reject_bad_input() -> None:
    teacher = Flow(Affine(2), StandardNormal(2))
    with pytest.raises(TypeError, match="expected a Flow as teacher"):
        teacher_pairs(Affine(2), 4)
    with pytest.raises(ValueError, match="expected n to be an int >= 1"):
        teacher_pairs(teacher, 0)
    with pytest.raises(ValueError, match="expected batch_size to be an int >= 1"):
        teacher_pairs(teacher, 3, batch_size=0)
    cond = RealNVP(2, context=1, transforms=2, hidden=(8,))
    with pytest.raises(ValueError, match=r"expected a context of shape \(4, context_features\)"):
        teacher_pairs(cond, 4, context=torch.randn(3, 1))
    broken = Flow(Affine(2, log_scale=-1000.0), StandardNormal(2))  # x = z e^{1000} overflows
    with pytest.raises(ValueError, match="expected finite teacher samples"):
        teacher_pairs(broken, 4)


# -- distillation ----------------------------------------------------------------------------------


def test_distilled_flow_recovers_a_known_affine_map() -> None:
    """Teacher x = A z + b; a student of the same (affine) class, trained on pairs only, recovers map and density."""
    teacher = _affine_teacher(seed=3)
    torch.manual_seed(1)
    x, z = teacher_pairs(teacher, 256)
    student = Flow(Chain(LULinear(2), Affine(2)), StandardNormal(2)).double()
    loss = _regress(student, z, x, steps=1500, lr=0.02)
    assert loss < 1e-12
    z_new = torch.randn(100, 2, dtype=torch.float64, generator=_gen(5))
    with torch.no_grad():
        x_new = teacher.transform.inverse(z_new)
        torch.testing.assert_close(student.transform.inverse(z_new), x_new, atol=1e-6, rtol=0)
        # the density follows from the map: log q equal to the teacher's (never in the loss)
        torch.testing.assert_close(student.log_prob(x_new), teacher.log_prob(x_new), atol=1e-6, rtol=0)


def test_pair_regression_in_the_trainer() -> None:
    teacher = _affine_teacher(seed=4).float()
    torch.manual_seed(0)
    x, z = teacher_pairs(teacher, 512)
    student = RealNVP(2, transforms=2, hidden=(16,))
    before, _ = pair_regression_loss(student, x, z)
    history = Trainer(student, PairRegression(consistency=0.5), lr=1e-2, progress=False).fit(
        (x[:448], z[:448]), val=(x[448:], z[448:]), epochs=8, batch_size=64
    )
    last = history.last()
    assert {"val_loss", "val_sampling_error", "val_consistency_error", "sampling_error"} <= set(last)
    assert last["val_loss"] == pytest.approx(last["val_sampling_error"] + 0.5 * last["val_consistency_error"], rel=1e-5)
    assert last["val_loss"] < 0.1 * before.item()
    assert repr(PairRegression(0.5)) == "PairRegression(consistency=0.5)"


# -- the distilled flow as a Boltzmann generator: SNIS on a Gaussian has a closed form, ESS 1 when exact --


def test_exact_distilled_map_has_unit_ess_and_exact_snis() -> None:
    """Gaussian target N(μ, σ²): the teacher's map is exact; the distilled flow gives ESS 1 and log Z = 0."""
    loc, scale = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 2.0])
    target = Gaussian(2, loc=loc, scale=scale).double()
    teacher = Flow(Affine(2, shift=-loc / scale, log_scale=-scale.log()), StandardNormal(2)).double()  # z = (x − μ)/σ
    torch.manual_seed(0)
    x, z = teacher_pairs(teacher, 128)
    student = Flow(Affine(2), StandardNormal(2)).double()
    assert _regress(student, z, x, steps=1500, lr=0.05) < 1e-14
    torch.manual_seed(1)
    xs, log_w = sample_log_weights(student, target, 4000)
    assert kish_ess(log_w).item() > 1 - 1e-9
    log_z, _ = log_z_estimate(log_w)
    assert abs(log_z.item()) < 1e-6
    # ⟨x²⟩ = μ² + σ²: plain Monte Carlo error only (weights are constant)
    estimate = reweighted_mean(xs.square(), log_w)
    stderr = xs.square().std(0) / math.sqrt(xs.shape[0])
    assert ((estimate - (loc.double() ** 2 + scale.double() ** 2)).abs() < 4 * stderr).all()


@pytest.mark.parametrize("n", [2_000, 50_000])
def test_snis_with_an_inexact_distilled_map_converges_to_the_closed_form(n: int) -> None:
    """A student stopped early (wrong scale and shift): its SNIS estimates stay within their CLT error."""
    loc, scale = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 2.0])
    target = Gaussian(2, loc=loc, scale=scale).double()
    teacher = Flow(Affine(2, shift=-loc / scale, log_scale=-scale.log()), StandardNormal(2)).double()
    torch.manual_seed(0)
    x, z = teacher_pairs(teacher, 128)
    student = Flow(Affine(2), StandardNormal(2)).double()
    _regress(student, z, x, steps=15, lr=0.05)  # far from converged
    torch.manual_seed(2)
    xs, log_w = sample_log_weights(student, target, n)
    ess = kish_ess(log_w).item()
    assert 0.05 < ess < 0.95  # a genuinely inexact proposal
    exact = loc.double() ** 2 + scale.double() ** 2
    values = xs.square()
    estimate = reweighted_mean(values, log_w)
    w = torch.softmax(log_w, 0)[:, None]
    stderr = (w.square() * (values - estimate).square()).sum(0).sqrt()  # delta-method SNIS error
    assert ((estimate - exact).abs() < 4 * stderr).all()
    log_z, log_z_se = log_z_estimate(log_w)
    assert abs(log_z.item()) < 4 * log_z_se.item()


def test_public_names() -> None:
    assert flows.train.PairRegression is PairRegression
    assert set(flows.train.pairs.__all__) == {"ot_assignment", "ot_pairs", "teacher_pairs"}
