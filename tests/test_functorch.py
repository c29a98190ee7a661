"""torch.func (vmap, jacrev, jvp) and torch.jit.trace over flows' log_prob and sample."""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev, jvp, vmap

import flows
from flows.bijections._spline_autograd import BinEnds, SplineForward
from flows.bijections.splines import RationalQuadraticSpline


def _families() -> dict[str, tuple[flows.Flow, torch.Tensor]]:
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    return {
        "MAF": (flows.MAF(3, transforms=2, hidden=(8,)), x),
        "NSF": (flows.NSF(3, transforms=2, hidden=(8,), bins=4), x * 2),  # some points in the identity tails
        "RealNVP": (flows.RealNVP(3, transforms=2, hidden=(8,)), x),
        "Glow": (flows.Glow((2, 4, 4), scales=1, steps=1, hidden=(8, 8)), torch.rand(5, 2, 4, 4)),
        "CNF": (flows.FFJORD(3, transforms=1, hidden=(8,), rtol=1e-7, atol=1e-7), x),
    }


def _perturbed(flow: flows.Flow) -> flows.Flow:
    """Identity-initialised last layers would make every test trivially pass: perturb every parameter."""
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return flow.eval()


FAMILIES = list(_families())


@pytest.mark.parametrize("family", FAMILIES)
def test_vmap_log_prob_equals_the_loop(family: str) -> None:
    flow, x = _families()[family]
    d = _perturbed(flow)()
    loop = torch.stack([d.log_prob(row) for row in x])
    mapped = vmap(d.log_prob)(x)
    assert mapped.shape == (5,)
    # CNF: the loop solves each row alone, vmap the batch with one adaptive step sequence (within tolerance)
    tol = 1e-4 if family == "CNF" else 1e-5
    torch.testing.assert_close(mapped, loop, rtol=tol, atol=tol)
    assert loop.std() > 0.01  # distinct rows: a broadcast of one value would fail above


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "CNF"])
def test_jacrev_and_jvp_of_log_prob_equal_autograd(family: str) -> None:
    flow, x = _families()[family]
    d = _perturbed(flow)()
    x0 = x[0].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(d.log_prob(x0), x0)
    torch.testing.assert_close(jacrev(d.log_prob)(x[0]), grad, rtol=1e-4, atol=1e-5)
    v = torch.randn_like(x[:1])
    # a batch of one: on 0-dim results, torch.func.jvp (2.13) gives float64 tangents for float32 inputs
    value, tangent = jvp(d.log_prob, (x[:1],), (v,))
    torch.testing.assert_close(value, d.log_prob(x[:1]).detach())
    torch.testing.assert_close(tangent, (grad * v[0]).sum().reshape(1), rtol=1e-4, atol=1e-5)
    batched = vmap(jacrev(d.log_prob))(x[:3])  # nested transforms
    torch.testing.assert_close(batched[0], grad, rtol=1e-3, atol=1e-4)  # float32: another reduction order


@pytest.mark.parametrize("family", ["MAF", "NSF", "RealNVP"])
def test_gradients_through_vmapped_log_prob_reach_the_parameters(family: str) -> None:
    flow, x = _families()[family]
    flow = _perturbed(flow)
    vmap(flow().log_prob)(x).sum().backward()
    mapped = [p.grad.clone() for p in flow.parameters()]
    flow.zero_grad()
    flow.log_prob(x).sum().backward()
    for a, b in zip(mapped, (p.grad for p in flow.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", ["MAF", "NSF", "RealNVP", "CNF"])
def test_vmap_sample_over_contexts(family: str) -> None:
    torch.manual_seed(1)
    builder = {"MAF": flows.MAF, "NSF": flows.NSF, "RealNVP": flows.RealNVP, "CNF": flows.FFJORD}[family]
    flow = _perturbed(builder(3, context=2, transforms=1, hidden=(8,)))
    contexts = torch.randn(4, 2)
    # randomness="same": one base draw shared by every context, so it equals the inverse of that draw
    torch.manual_seed(7)
    same = vmap(lambda c: flow.sample((), c), randomness="same")(contexts)
    torch.manual_seed(7)
    z = flow.base.sample(())
    with torch.no_grad():
        expected = flow.transform.inverse(z.expand(4, 3), contexts)
    tol = 1e-4 if family == "CNF" else 1e-5
    torch.testing.assert_close(same, expected, rtol=tol, atol=tol)
    different = vmap(lambda c: flow(c).sample(), randomness="different")(contexts)
    assert different.shape == (4, 3) and torch.isfinite(different).all()
    assert not torch.allclose(
        flow.transform.forward(different, contexts)[0], flow.transform.forward(different, contexts)[1]
    )
    with pytest.raises(RuntimeError, match="randomness"):  # vmap's default refuses random draws
        vmap(lambda c: flow.sample((), c))(contexts)


def test_vmap_skips_the_finiteness_check_but_eager_keeps_its_error() -> None:
    flow = _perturbed(flows.MAF(3, transforms=1, hidden=(8,)))
    x = torch.randn(4, 3)
    x[2, 1] = float("nan")
    out = vmap(flow().log_prob)(x)
    assert torch.isnan(out[2]) and torch.isfinite(out[[0, 1, 3]]).all()
    with pytest.raises(ValueError, match="expected a finite input"):
        flow.log_prob(x)


def test_spline_functions_vmap_rules_equal_the_batched_call() -> None:
    torch.manual_seed(2)
    spline = RationalQuadraticSpline(bins=5).double()
    x = 4 * torch.randn(3, 6, dtype=torch.float64)
    params = torch.randn(3, 6, spline.params_per_dim, dtype=torch.float64)
    y, ladj = vmap(lambda a, p: SplineForward.apply(a, p, spline)[:2])(x, params)
    y0, ladj0 = SplineForward.apply(x, params, spline)[:2]
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(ladj, ladj0)
    offsets, scales = spline._knot_constants(params)
    lower = vmap(lambda p, v: BinEnds.apply(p, v, offsets, scales, 1, spline._softplus_shift)[0], out_dims=1)(
        params, x.clamp(-3, 3)
    )
    torch.testing.assert_close(
        lower, BinEnds.apply(params, x.clamp(-3, 3), offsets, scales, 1, spline._softplus_shift)[0]
    )


def test_openmm_energy_vmap_rule() -> None:
    openmm = pytest.importorskip("openmm")
    from flows.targets.openmm import OpenMMTarget, _OpenMMEnergy

    system = openmm.System()
    for _ in range(2):
        system.addParticle(1.0)
    bond = openmm.HarmonicBondForce()
    bond.addBond(0, 1, 0.109, 1000.0)
    system.addForce(bond)
    target = OpenMMTarget(system, check_units=False)
    x = 0.1 * torch.randn(3, 4, 6, dtype=torch.float64)
    u, grad = vmap(lambda a: _OpenMMEnergy.apply(a, target))(x)
    u0, grad0 = _OpenMMEnergy.apply(x.reshape(12, 6), target)
    torch.testing.assert_close(u, u0.reshape(3, 4))
    torch.testing.assert_close(grad, grad0.reshape(3, 4, 6))


@pytest.mark.parametrize("family", ["MAF", "NSF"])
def test_jit_trace_of_log_prob_matches_eager_on_new_inputs(family: str) -> None:
    flow, x = _families()[family]
    flow = _perturbed(flow)
    new = 2 * torch.randn(9, 3)  # another batch size, other values
    traced = torch.jit.trace(flow, (x,))  # Flow.forward(x) is log_prob
    torch.testing.assert_close(traced(new), flow.log_prob(new).detach())
    flow.requires_grad_(False)  # a bound method may close over parameters only when they need no gradient
    traced = torch.jit.trace(flow().log_prob, (x,))
    torch.testing.assert_close(traced(new), flow.log_prob(new))
