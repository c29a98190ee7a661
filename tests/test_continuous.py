"""Oracles for continuous normalizing flows (docs/continuous.md): linear ODEs, Hutchinson statistics,
adjoint gradients, round trips, normalisation on a grid, determinism, RNODE integrals, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import flows
from flows import CNF, AuxiliaryLosses, Chain, Flow, StandardNormal, TimeMLP
from flows.testing import check_bijection, perturb_parameters

F64 = torch.float64


class Linear(nn.Module):
    """The linear field f(t, z) = A z (autograd traces: it has no jvp method)."""

    def __init__(self, a: Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a.clone())

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return z @ self.a.T


class Hidden(nn.Module):
    """Wraps a field and hides its jvp method, forcing the autograd path."""

    def __init__(self, field: nn.Module) -> None:
        super().__init__()
        self.field = field

    def forward(self, t: Tensor, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self.field(t, z) if context is None else self.field(t, z, context)


def _matrix(d: int = 3, seed: int = 0) -> Tensor:
    return 0.6 * torch.randn(d, d, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _cnf(features: int = 2, context: int = 0, init: int = 0, perturb: float = 0.3, **options) -> CNF:
    torch.manual_seed(init)
    cnf = CNF(features, context, hidden=(16,), **options).double()
    return perturb_parameters(cnf, perturb, generator=torch.Generator().manual_seed(init + 1))


def _x(*shape: int, seed: int = 5) -> Tensor:
    return torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


# -- the linear ODE: closed-form state and log-determinant ----------------------------------------
@pytest.mark.parametrize(("t0", "t1"), [(0.0, 1.0), (0.5, 2.0), (1.0, -0.5)])
def test_linear_field_gives_interval_times_trace(t0: float, t1: float) -> None:
    a = _matrix()
    cnf = CNF(3, field=Linear(a), t0=t0, t1=t1, rtol=1e-9, atol=1e-9)
    x = _x(4, 3)
    z, ladj = cnf.forward_and_log_det(x)
    torch.testing.assert_close(z, x @ torch.linalg.matrix_exp((t1 - t0) * a).T, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(ladj, torch.full((4,), (t1 - t0) * float(torch.trace(a)), dtype=F64))
    x_back, ladj_back = cnf.inverse_and_log_det(z)
    torch.testing.assert_close(x_back, x, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(ladj_back, -ladj)


def test_linear_field_error_follows_the_tolerance() -> None:
    a = _matrix()
    x = _x(8, 3)
    exact = x @ torch.linalg.matrix_exp(a).T
    errors = []
    for tol in (1e-4, 1e-7, 1e-10):
        z = CNF(3, field=Linear(a), rtol=tol, atol=tol)(x)
        errors.append(float((z - exact).detach().abs().max()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[1] < 1e-5 and errors[2] < 1e-8


# -- Hutchinson: unbiased, noise drawn once per solve, reproducible ------------------------------
@pytest.mark.parametrize("probe", ["rademacher", "gaussian"])
def test_hutchinson_mean_matches_exact_trace(probe: str) -> None:
    """10⁴ copies of one point in one batch: each row draws its own noise; mean within 3 SE."""
    cnf = _cnf(2, trace="hutchinson", probe=probe, rtol=1e-7, atol=1e-7)
    x = _x(1, 2)
    with torch.no_grad():
        estimates = cnf.forward_and_log_det(x.expand(10_000, 2))[1]
        cnf.trace = "exact"
        exact = cnf.forward_and_log_det(x)[1]
    standard_error = estimates.std() / math.sqrt(len(estimates))
    assert estimates.std() > 1e-3  # a genuine estimator, not the exact trace in disguise
    assert abs(float(estimates.mean() - exact)) < 3 * float(standard_error)


def test_rademacher_variance_is_below_gaussian() -> None:
    variances = {}
    for probe in ("rademacher", "gaussian"):
        cnf = _cnf(2, trace="hutchinson", probe=probe, rtol=1e-6, atol=1e-6)
        with torch.no_grad():
            variances[probe] = float(cnf.forward_and_log_det(_x(1, 2).expand(4000, 2))[1].var())
    assert variances["rademacher"] < variances["gaussian"]


def test_hutchinson_noise_is_drawn_once_per_solve() -> None:
    """With f = A z and one ε per solve, ladj = (t1 - t0) εᵀAε exactly; fresh noise per step would average."""
    a = _matrix(2, seed=3)
    cnf = CNF(2, field=Linear(a), trace="hutchinson", seed=7, t1=0.5, rtol=1e-9, atol=1e-9)
    ladj = cnf.forward_and_log_det(_x(64, 2))[1]
    eps = torch.randint(0, 2, (64, 2), generator=torch.Generator().manual_seed(7)).to(F64) * 2 - 1
    torch.testing.assert_close(ladj, 0.5 * torch.einsum("ni,ij,nj->n", eps, a, eps))
    values = {round(v, 9) for v in ladj.tolist()}  # Rademacher: tr A ± (a12 + a21), halved
    assert len(values) == 2

    gaussian = CNF(2, field=Linear(a), trace="hutchinson", probe="gaussian", seed=7, rtol=1e-9, atol=1e-9)
    eps = torch.randn(64, 2, generator=torch.Generator().manual_seed(7), dtype=F64)
    torch.testing.assert_close(gaussian.forward_and_log_det(_x(64, 2))[1], torch.einsum("ni,ij,nj->n", eps, a, eps))


def test_seed_makes_hutchinson_deterministic() -> None:
    cnf = _cnf(2, trace="hutchinson", seed=3)
    x = _x(16, 2)
    first, second = cnf.forward_and_log_det(x)[1], cnf.forward_and_log_det(x)[1]
    assert torch.equal(first, second)
    cnf.seed = 4
    assert not torch.allclose(cnf.forward_and_log_det(x)[1], first)
    cnf.seed = None  # the global generator: fresh noise per call, reproducible by torch.manual_seed
    torch.manual_seed(11)
    a = cnf.forward_and_log_det(x)[1]
    b = cnf.forward_and_log_det(x)[1]
    torch.manual_seed(11)
    assert not torch.allclose(a, b) and torch.equal(cnf.forward_and_log_det(x)[1], a)


def test_seeded_hutchinson_round_trip_negates_ladj() -> None:
    cnf = _cnf(3, trace="hutchinson", seed=0, rtol=1e-8, atol=1e-8)
    x = _x(6, 3)
    z, ladj = cnf.forward_and_log_det(x)
    x_back, ladj_back = cnf.inverse_and_log_det(z)
    torch.testing.assert_close(x_back, x, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ladj_back, -ladj, atol=1e-6, rtol=1e-6)


def test_eval_trace_switches_the_estimator_in_eval_mode() -> None:
    cnf = _cnf(2, trace="hutchinson", eval_trace="exact", seed=1)
    x = _x(8, 2)
    exact = CNF.forward_and_log_det(_cnf(2), x)[1]  # same parameters (same seeds), exact trace
    train_ladj = cnf.forward_and_log_det(x)[1]
    with flows.evaluating(cnf):
        eval_ladj = cnf.forward_and_log_det(x)[1]
    torch.testing.assert_close(eval_ladj, exact)
    assert not torch.allclose(train_ladj, exact)
    assert "hutchinson/exact (eval)" in repr(cnf)


# -- round trips, composition, density ----------------------------------------------------------
@pytest.mark.parametrize("tol", [1e-5, 1e-8])
def test_round_trip_error_is_of_the_order_of_the_tolerance(tol: float) -> None:
    cnf = _cnf(3, rtol=tol, atol=tol)
    x = _x(32, 3)
    with torch.no_grad():
        z, ladj = cnf.forward_and_log_det(x)
        x_back, ladj_back = cnf.inverse_and_log_det(z)
    assert float((x_back - x).abs().max()) < 100 * tol
    assert float((ladj_back + ladj).abs().max()) < 100 * tol


def test_composes_inside_chain_with_discrete_layers() -> None:
    torch.manual_seed(0)
    chain = Chain(flows.Affine(3), CNF(3, hidden=(8,), rtol=1e-8, atol=1e-8), flows.LULinear(3)).double()
    perturb_parameters(chain, 0.3, generator=torch.Generator().manual_seed(1))
    check_bijection(chain, _x(3, 3), atol=1e-5, rtol=1e-5)
    flow = Flow(chain, StandardNormal(3)).double()
    samples, log_p = flow.sample_and_log_prob((5,))
    torch.testing.assert_close(flow.log_prob(samples), log_p, atol=1e-5, rtol=1e-5)


def test_density_of_a_2d_cnf_integrates_to_one() -> None:
    flow = Flow(_cnf(2, perturb=0.5, rtol=1e-6, atol=1e-6), StandardNormal(2)).double()
    step = 0.1
    axis = torch.arange(-7.0, 7.0 + step / 2, step, dtype=F64)
    grid = torch.cartesian_prod(axis, axis)
    with torch.no_grad():
        log_p = flow.log_prob(grid)
    mass = float(log_p.exp().sum()) * step**2
    assert abs(mass - 1) < 2e-3
    assert float(log_p.std()) > 1.0  # not flat: the grid covers the bulk and the tails


def test_tensor_only_calls_skip_the_trace_and_agree() -> None:
    cnf = _cnf(2, rtol=1e-8, atol=1e-8)
    x = _x(10, 2)
    z, _ = cnf.forward_and_log_det(x)
    with_trace = cnf.nfe
    torch.testing.assert_close(cnf(x), z, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cnf.inverse(z), x, atol=1e-6, rtol=1e-6)
    assert with_trace > 0 and cnf.nfe > 0


def test_context_conditions_the_field() -> None:
    cnf = _cnf(2, context=3)
    x, c = _x(4, 2), _x(4, 3, seed=6)
    z1, _ = cnf.forward_and_log_det(x, c)
    z2, _ = cnf.forward_and_log_det(x, c + 1)
    assert not torch.allclose(z1, z2)
    z3, ladj3 = cnf.forward_and_log_det(x, c[0])  # one context broadcast over the batch
    z4, ladj4 = cnf.forward_and_log_det(x, c[:1].expand(4, 3))
    torch.testing.assert_close(z3, z4)
    torch.testing.assert_close(ladj3, ladj4)


def test_empty_batch_is_the_identity() -> None:
    z, ladj = _cnf(2).forward_and_log_det(torch.zeros(0, 2, dtype=F64))
    assert z.shape == (0, 2) and ladj.shape == (0,)


def test_float32_with_tolerances_below_its_precision_still_solves() -> None:
    cnf = _cnf(2, rtol=1e-12, atol=1e-12).float()
    z, ladj = cnf.forward_and_log_det(_x(4, 2).float())
    assert torch.isfinite(z).all() and torch.isfinite(ladj).all()


@pytest.mark.parametrize("method", ["rk4", "euler"])
def test_fixed_step_solvers(method: str) -> None:
    a = _matrix()
    cnf = CNF(3, field=Linear(a), method=method, options={"step_size": 0.01})
    x = _x(4, 3)
    z, ladj = cnf.forward_and_log_det(x)
    assert cnf.nfe >= 100
    tol = 1e-8 if method == "rk4" else 0.05
    torch.testing.assert_close(z, x @ torch.linalg.matrix_exp(a).T, atol=tol, rtol=tol)
    torch.testing.assert_close(ladj, torch.full((4,), float(torch.trace(a)), dtype=F64), atol=tol, rtol=tol)


# -- fused and autograd traces, gradients, adjoint ------------------------------------------------
@pytest.mark.parametrize("trace", ["exact", "hutchinson"])
def test_fused_and_autograd_traces_agree(trace: str) -> None:
    fused = _cnf(3, context=2, trace=trace, seed=2, rtol=1e-8, atol=1e-8)
    plain = CNF(3, 2, field=Hidden(fused.field), trace=trace, seed=2, rtol=1e-8, atol=1e-8)
    x, c = _x(5, 3), _x(5, 2, seed=9)
    torch.testing.assert_close(plain.forward_and_log_det(x, c), fused.forward_and_log_det(x, c))
    grads = []
    for cnf in (fused, plain):
        cnf.zero_grad()
        z, ladj = cnf.forward_and_log_det(x, c)
        grads.append(torch.autograd.grad(z.sin().sum() + ladj.sum(), list(fused.parameters())))
    for g_fused, g_plain in zip(*grads, strict=True):
        torch.testing.assert_close(g_fused, g_plain, atol=1e-6, rtol=1e-6)


def test_time_mlp_jvp_matches_autograd_jacobian() -> None:
    z, c, t = _x(4, 3), _x(4, 2, seed=1), torch.tensor(0.3, dtype=F64)
    for activation in (nn.Tanh, nn.Softplus, nn.ELU, nn.SiLU, nn.Sigmoid):
        field = TimeMLP(3, 2, hidden=(8, 8), activation=activation, zero_init=False).double()
        f, jv = field.jvp(t, z, torch.eye(3, dtype=F64)[:, None, :], c)
        torch.testing.assert_close(f, field(t, z, c))
        jac = torch.func.vmap(torch.func.jacrev(lambda v, w, field=field: field(t, v, w)))(z, c)  # (4, 3, 3)
        torch.testing.assert_close(jv.permute(1, 2, 0), jac)


def test_adjoint_and_direct_gradients_agree() -> None:
    cnf = _cnf(3, context=2, rtol=1e-8, atol=1e-8)
    x, c = _x(6, 3).requires_grad_(True), _x(6, 2, seed=8).requires_grad_(True)
    grads = {}
    for adjoint in (False, True):
        cnf.adjoint = adjoint
        z, ladj = cnf.forward_and_log_det(x, c)
        loss = (z.square().sum(-1) - ladj).mean()
        grads[adjoint] = torch.autograd.grad(loss, [x, c, *cnf.parameters()])
        if adjoint:
            assert cnf.nfe > 0 and cnf.nfe_backward > 0
        else:
            assert cnf.nfe_backward == 0
    for direct, adjoint in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(adjoint, direct, atol=1e-6, rtol=1e-6)  # seen: 3e-8


# -- RNODE regularisers --------------------------------------------------------------------------
def test_rnode_integrals_on_a_linear_field() -> None:
    """∫‖Az(t)‖² dt by Gauss-Legendre on the closed-form path; ∫‖A‖_F² dt = (t1 - t0)‖A‖_F²."""
    a = _matrix()
    cnf = CNF(3, field=Linear(a), kinetic=0.5, jacobian=2.0, t1=0.8, rtol=1e-10, atol=1e-10)
    x = _x(5, 3)
    with AuxiliaryLosses() as aux:
        cnf.forward_and_log_det(x)
    terms = aux.by_name()
    nodes, weights = (torch.tensor(v, dtype=F64) for v in np.polynomial.legendre.leggauss(20))
    times = 0.4 * (nodes + 1)
    path = torch.stack([x @ torch.linalg.matrix_exp(t * a).T for t in times])  # (20, 5, 3)
    kinetic = 0.4 * torch.einsum("k,kn->n", weights, (path @ a.T).square().sum(-1))
    torch.testing.assert_close(terms["rnode_kinetic"], 0.5 * kinetic.mean())
    torch.testing.assert_close(terms["rnode_jacobian"], 2.0 * 0.8 * a.square().sum())
    with AuxiliaryLosses() as back:  # the same positive integrals when integrating backwards
        cnf.inverse_and_log_det(x)
    torch.testing.assert_close(back.by_name()["rnode_jacobian"], terms["rnode_jacobian"])


def test_rnode_hutchinson_frobenius_is_unbiased() -> None:
    cnf = _cnf(2, jacobian=1.0, rtol=1e-6, atol=1e-6)
    x = _x(1, 2)
    with torch.no_grad(), AuxiliaryLosses() as exact:
        cnf.forward_and_log_det(x)
    cnf.trace = "hutchinson"
    with torch.no_grad(), AuxiliaryLosses() as estimate:
        cnf.forward_and_log_det(x.expand(10_000, 2))
    # the batch mean of 10⁴ single-noise estimates: within 1% of the exact integral (seen: 0.05%)
    assert float(estimate.total()) == pytest.approx(float(exact.total()), rel=0.01)


def test_rnode_terms_only_when_collecting_and_weighted() -> None:
    cnf = _cnf(2, kinetic=0.1, rtol=1e-6, atol=1e-6)
    x = _x(8, 2)
    z_plain, ladj_plain = cnf.forward_and_log_det(x)
    with AuxiliaryLosses() as aux:
        z, ladj = cnf.forward_and_log_det(x)
    assert set(aux.by_name()) == {"rnode_kinetic"}  # jacobian weight 0: not computed
    torch.testing.assert_close(z, z_plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ladj, ladj_plain, atol=1e-5, rtol=1e-5)
    loss = -ladj.mean() + aux.total()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in cnf.parameters())
    with AuxiliaryLosses() as none:
        _cnf(2).forward_and_log_det(x)  # no weights: nothing added
    assert len(none) == 0


# -- NFE and bad input ---------------------------------------------------------------------------
def test_nfe_counts_the_last_solve() -> None:
    cnf = _cnf(2, rtol=1e-4, atol=1e-4)
    cnf.forward_and_log_det(_x(4, 2))
    loose = cnf.nfe
    cnf.rtol = cnf.atol = 1e-9
    cnf.forward_and_log_det(_x(4, 2))
    assert 0 < loose < cnf.nfe


def test_user_field_for_image_shaped_events() -> None:
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)

        def forward(self, t: Tensor, z: Tensor) -> Tensor:
            return torch.tanh(self.conv(z)) * (1 + t)

    torch.manual_seed(0)
    cnf = CNF((2, 3, 3), field=Conv(), rtol=1e-8, atol=1e-8).double()
    check_bijection(cnf, _x(2, 2, 3, 3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"trace": "brute"}, ValueError, r"expected trace in \('exact', 'hutchinson'\), got 'brute'"),
        ({"eval_trace": "fast"}, ValueError, r"expected eval_trace in"),
        ({"probe": "uniform"}, ValueError, r"expected probe in \('rademacher', 'gaussian'\)"),
        ({"method": "rk45"}, ValueError, r"expected method in \("),
        ({"rtol": 0.0}, ValueError, r"expected rtol to be a finite number > 0 and <= 1, got 0.0"),
        ({"rtol": math.inf}, ValueError, r"expected rtol to be a finite number > 0 and <= 1, got inf"),
        ({"atol": "1e-5"}, TypeError, r"expected atol to be a real number, got str '1e-5'"),
        ({"t0": 1.0, "t1": 1.0}, ValueError, r"expected t0 and t1 distinct and finite in torch.float32"),
        # distinct in float64, equal after rounding to float32: a solve over nothing
        ({"t0": 1.0, "t1": 1.0 + 1e-9}, ValueError, r"expected t0 and t1 distinct and finite in torch.float32"),
        ({"t1": 1e-300}, ValueError, r"expected t0 and t1 distinct .* got t0=0.0, t1=1e-300"),
        ({"t1": math.nan}, ValueError, r"expected t1 to be a finite number, got nan"),
        ({"kinetic": -1.0}, ValueError, r"expected kinetic to be a finite number >= 0, got -1.0"),
        ({"kinetic": math.inf}, ValueError, r"expected kinetic to be a finite number >= 0, got inf"),
        ({"method": "euler", "options": {"step_size": 0.0}}, ValueError, r"expected options\['step_size'\]"),
        ({"method": "euler", "options": {"step_size": -0.1}}, ValueError, r"expected options\['step_size'\]"),
        ({"method": "euler", "options": {"step_size": math.nan}}, ValueError, r"expected options\['step_size'\]"),
        ({"options": [("step_size", 0.1)]}, TypeError, r"expected options to be a dict or None"),
        ({"adjoint": "yes"}, TypeError, r"expected adjoint to be a bool"),
        ({"max_evaluations": 0}, ValueError, r"expected max_evaluations to be an int >= 1, got 0"),
        ({"seed": 1.5}, TypeError, r"expected seed to be an int, got 1.5"),
        ({"method": ["dopri5"]}, ValueError, r"expected method in"),
        ({"field": lambda t, z: z}, TypeError, r"expected field to be an nn.Module, got function"),
        ({"context": -1}, ValueError, r"expected context to be an int >= 0, got -1"),
        ({"activation": nn.ReLU}, ValueError, r"TimeMLP: expected a smooth activation among .*, got ReLU"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CNF(2, **kwargs)


def test_bad_inputs() -> None:
    cnf = _cnf(2, context=3)
    with pytest.raises(ValueError, match=r"CNF: expected input of shape \(\*batch, 2\), got \(4, 3\)"):
        cnf.forward_and_log_det(_x(4, 3), _x(4, 3))
    with pytest.raises(ValueError, match=r"CNF: expected latent input of shape \(\*batch, 2\), got \(4,\)"):
        cnf.inverse_and_log_det(_x(4), _x(4, 3))
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 3\), got None"):
        cnf.forward_and_log_det(_x(4, 2))
    with pytest.raises(ValueError, match=r"this module is unconditional"):
        _cnf(2).forward_and_log_det(_x(4, 2), _x(4, 3))
    with pytest.raises(ValueError, match=r"the default field needs vector events, got event shape \(2, 2\)"):
        CNF((2, 2))
    with pytest.raises(ValueError, match=r"TimeMLP: expected features to be an int >= 1, got 0"):
        TimeMLP(0)


def test_a_failing_solve_raises_a_clear_error() -> None:
    class Blowup(nn.Module):
        def forward(self, t: Tensor, z: Tensor) -> Tensor:
            return z.exp() * 1e300  # overflows to inf at once

    with pytest.raises(FloatingPointError, match=r"CNF: the ODE solve failed after \d+ evaluations"):
        CNF(2, field=Blowup()).forward_and_log_det(_x(3, 2))
    nan_input = _x(3, 2)
    nan_input[1, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"expected a finite, non-stiff field: check the inputs"):
        _cnf(2).forward_and_log_det(nan_input)


# -- fields that do not depend on z, fixed-step defaults, the evaluation bound (issue 27) ------------
class Constant(nn.Module):
    """``f(t, z) = c``: a translation by ``(t1 - t0) c``, divergence 0 (autograd sees no use of ``z``)."""

    def __init__(self, c: Tensor, learnable: bool = False) -> None:
        super().__init__()
        self.c = nn.Parameter(c) if learnable else c

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.c.to(z.dtype).expand_as(z)


class TimeOnly(nn.Module):
    """``f(t, z) = t 1``: ``z(t1) = z(t0) + (t1² - t0²)/2``, divergence 0."""

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return t * torch.ones_like(z)


@pytest.mark.parametrize("trace", ["exact", "hutchinson"])
@pytest.mark.parametrize("learnable", [False, True])
def test_a_field_that_does_not_depend_on_z_has_zero_divergence(trace: str, learnable: bool) -> None:
    c = torch.tensor([1.0, -2.0], dtype=F64)
    x = _x(4, 2)
    for field, shift in ((Constant(c, learnable), 1.5 * c), (TimeOnly(), torch.full((2,), (2.0**2 - 0.5**2) / 2))):
        cnf = CNF(2, field=field, trace=trace, t0=0.5, t1=2.0, rtol=1e-9, atol=1e-9).double()
        z, ladj = cnf.forward_and_log_det(x)
        torch.testing.assert_close(z, x + shift.to(F64))
        torch.testing.assert_close(ladj, torch.zeros(4, dtype=F64))
        back, ladj_back = cnf.inverse_and_log_det(z)
        torch.testing.assert_close(back, x)
        torch.testing.assert_close(ladj_back, torch.zeros(4, dtype=F64))
        log_p = Flow(cnf, StandardNormal(2)).double().log_prob(x)  # ... and with a graph (a training step)
        if learnable and isinstance(field, Constant):
            log_p.sum().backward()
            assert field.c.grad is not None and torch.isfinite(field.c.grad).all()


def test_a_fixed_step_solver_without_a_step_size_takes_a_hundred_steps() -> None:
    a = _matrix()
    cnf = CNF(3, field=Linear(a), method="euler", t1=2.0)
    assert cnf.options["step_size"] == pytest.approx(0.02)
    x = _x(4, 3)
    z, _ = cnf.forward_and_log_det(x)
    assert cnf.nfe == 100  # not torchdiffeq's one step over the whole interval
    exact = x @ torch.linalg.matrix_exp(2 * a).T
    one_step = x + 2 * x @ a.T
    assert (z - exact).abs().max() < 0.2 * (one_step - exact).abs().max()


def test_the_evaluation_bound_stops_a_runaway_solve_and_names_the_limit() -> None:
    assert CNF(2).max_evaluations == flows.bijections.continuous.MAX_EVALUATIONS == 10_000
    cnf = CNF(2, hidden=(8,), t1=1e30, max_evaluations=300)  # the interval of issue 27's hang
    with pytest.raises(FloatingPointError, match=r"over \[0, 1e\+30\] needed more than max_evaluations=300"):
        cnf.forward_and_log_det(torch.randn(3, 2))
    assert CNF(2, hidden=(8,), max_evaluations=300).forward_and_log_det(torch.randn(3, 2))[0].shape == (3, 2)


def test_an_interval_that_collapses_in_the_input_dtype_is_refused_when_called() -> None:
    cnf = CNF(2, hidden=(8,), t0=1.0, t1=1.0 + 1e-6)  # distinct in float32, equal in float16
    with pytest.raises(ValueError, match=r"expected t0 and t1 distinct and finite in torch.float16"):
        cnf.half().forward_and_log_det(torch.zeros(2, 2, dtype=torch.float16))
