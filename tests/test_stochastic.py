"""Stochastic blocks (SNF, Wu, Köhler, Noé 2020): oracles for the path term ΔS and exact importance weights."""

from __future__ import annotations

import math

import pytest
import torch

from flows import Affine, Chain, Flow, StandardNormal
from flows.bijections import AffineCoupling, HMCBlock, LangevinBlock, MetropolisBlock, StochasticBlock
from flows.bijections.coupling import alternating_mask
from flows.metrics import kish_ess, log_z_estimate, reweighted_mean, sample_log_weights
from flows.targets import DoubleWell, Gaussian, InterpolatedEnergy

MU = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
SIGMA = torch.tensor([0.5, 2.0, 1.5], dtype=torch.float64)


def _u1() -> Gaussian:
    return Gaussian(3, loc=MU, scale=SIGMA).double()


def _quadratic_lambda(x: torch.Tensor, lam: float) -> torch.Tensor:
    """u_λ written out by hand (no library code), up to a constant."""
    return (1 - lam) * 0.5 * x.square().sum(-1) + lam * 0.5 * ((x - MU) / SIGMA).square().sum(-1)


def _affine(shift: torch.Tensor, log_scale: torch.Tensor) -> Affine:
    """A float64 affine layer z = x·e^s + t with the parameters set in float64 (no float32 rounding)."""
    layer = Affine(3).double()
    with torch.no_grad():
        layer.params[..., 0] = shift
        layer.params[..., 1] = log_scale
    return layer


def _exact_affine() -> Affine:
    """The affine layer with z = (x - μ)/σ: the flow is then exactly the target u_1."""
    return _affine(-MU / SIGMA, -SIGMA.log())


def _mh_blocks(energy) -> list[StochasticBlock]:
    return [
        MetropolisBlock(energy, steps=5, step_size=0.6),
        LangevinBlock(energy, steps=5, step_size=0.1, metropolize=True),
        HMCBlock(energy, steps=2, step_size=0.3, leapfrog_steps=4),
    ]


@pytest.mark.parametrize("index", range(3), ids=["metropolis", "mala", "hmc"])
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_detailed_balance_path_term_is_the_energy_change(index: int, direction: str) -> None:
    """Oracle 1: for kernels in detailed balance, ΔS = u_λ(out) − u_λ(in) per sample, 0 when rejected."""
    torch.manual_seed(0)
    lam = 0.3
    energy = InterpolatedEnergy(Gaussian(3), Gaussian(3, loc=MU, scale=SIGMA), lam).double()
    block = _mh_blocks(energy)[index]
    block.steps = 1
    x = 2 * torch.randn(400, 3, dtype=torch.float64)
    run = block.forward_and_log_det if direction == "forward" else block.inverse_and_log_det
    y, delta_s = run(x)
    assert y.shape == x.shape and delta_s.shape == (400,)
    torch.testing.assert_close(delta_s, _quadratic_lambda(y, lam) - _quadratic_lambda(x, lam))
    rejected = (y == x).all(-1)
    assert 0 < rejected.sum() < 400  # both outcomes occur
    assert (delta_s[rejected] == 0).all()
    assert 0 < block.last_acceptance < 1


def test_unadjusted_langevin_path_term_formula_and_small_step_limit() -> None:
    """ULA: ΔS = ½‖η‖² − ½‖η̃‖²; as ε → 0 the kernel does no work, ΔS → u(y) − u(x) (oracle 4)."""
    torch.manual_seed(1)
    u = _u1()
    x = MU + SIGMA * torch.randn(2000, 3, dtype=torch.float64)
    eps = 0.05
    block = LangevinBlock(u, steps=1, step_size=eps)
    torch.manual_seed(2)
    y, delta_s = block.inverse_and_log_det(x)
    torch.manual_seed(2)
    noise = torch.randn_like(x)
    grad = lambda p: (p - MU) / SIGMA**2  # noqa: E731
    torch.testing.assert_close(y, x - eps * grad(x) + math.sqrt(2 * eps) * noise)
    back = (x - y + eps * grad(y)) / math.sqrt(2 * eps)
    torch.testing.assert_close(delta_s, 0.5 * (noise.square() - back.square()).sum(-1))
    errors = []
    for step in (1e-1, 1e-2, 1e-3):
        y, delta_s = LangevinBlock(u, steps=3, step_size=step).inverse_and_log_det(x)
        errors.append((delta_s - (u.energy(y) - u.energy(x))).abs().mean().item())
    assert errors[2] < 0.2 * errors[1] < 0.04 * errors[0]


def test_exact_flow_with_detailed_balance_blocks_has_constant_weights() -> None:
    """Oracle 2: Gaussian → Gaussian with the exact affine layer and blocks on u_1: log w constant, ESS = 1."""
    torch.manual_seed(3)
    u1 = _u1()
    blocks = _mh_blocks(u1)
    prior_block = MetropolisBlock(Gaussian(3).double(), steps=3, step_size=0.8)  # on the latent side, u_0
    flow = Flow(Chain(*blocks, _exact_affine(), prior_block), StandardNormal(3)).double()
    x, log_w = sample_log_weights(flow, u1, 3000, batch_size=1000)
    assert x.shape == (3000, 3)
    torch.testing.assert_close(log_w, torch.zeros_like(log_w), atol=1e-10, rtol=0)  # log Z_1 − log Z_0 = 0
    assert kish_ess(log_w).item() == pytest.approx(1.0, abs=1e-12)
    assert all(0 < b.last_acceptance < 1 for b in (*blocks, prior_block))
    # the density direction (the backward path for maximum likelihood) is exact for such a flow
    x_data = u1.sample(500)
    torch.testing.assert_close(flow.log_prob(x_data), u1.log_prob(x_data, normalized=True))


def test_any_blocks_keep_reweighted_moments_exact() -> None:
    """Oracle 2 (continued): unadjusted Langevin and intermediate-λ blocks change the weights, not the answer."""
    torch.manual_seed(4)
    u0, u1 = Gaussian(3).double(), _u1()
    near = InterpolatedEnergy(u0, u1, 0.9)
    # a deliberately wrong affine layer, then blocks: Metropolis on u_{0.9}, ULA on u_1
    wrong = _affine(-MU / SIGMA + 0.3, -SIGMA.log() + 0.2)
    flow = Flow(
        Chain(
            LangevinBlock(u1, steps=3, step_size=0.05),
            MetropolisBlock(near, steps=2, step_size=0.3),
            wrong,
        ),
        StandardNormal(3),
    ).double()
    x, log_w = sample_log_weights(flow, u1, 40_000)
    ess = kish_ess(log_w).item()
    assert 0.05 < ess < 0.999  # the weights are not constant...
    n_eff = ess * x.shape[0]
    mean = reweighted_mean(x, log_w)
    var = reweighted_mean((x - MU).square(), log_w)
    assert ((mean - MU).abs() < 5 * SIGMA / math.sqrt(n_eff)).all(), (mean, MU)  # ...but the moments are right
    assert ((var / SIGMA**2 - 1).abs() < 5 * math.sqrt(2 / n_eff)).all(), var
    log_z, se = log_z_estimate(log_w)
    assert abs(log_z.item()) < 5 * se.item() + 1e-3  # Z_1/Z_0 = 1 for two normalised energies


def test_double_well_log_z_from_path_weights_converges() -> None:
    """Oracle 3: annealing through Metropolis blocks from N(0, I) to the double well gives exact log Z."""
    torch.manual_seed(5)
    target = DoubleWell().double()
    u0 = Gaussian(2).double()
    lambdas = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
    blocks = [MetropolisBlock(InterpolatedEnergy(u0, target, lam), steps=10, step_size=0.5) for lam in lambdas]
    widen = Affine(2, log_scale=torch.tensor([-math.log(2.0), 0.0])).double()  # x₁ = 2 z₁
    flow = Flow(Chain(*reversed(blocks), widen), StandardNormal(2)).double()
    _, log_w = sample_log_weights(flow, target, 20_000)
    log_z, se = log_z_estimate(log_w)
    exact = math.log(11784.50927 * math.sqrt(2 * math.pi))
    assert se.item() < 0.05
    assert abs(log_z.item() - exact) < 4 * se.item() + 1e-3, (log_z.item(), exact, se.item())
    # without the blocks the same flow is a much worse sampler
    _, log_w_plain = sample_log_weights(Flow(Chain(widen), StandardNormal(2)).double(), target, 20_000)
    assert kish_ess(log_w).item() > 2 * kish_ess(log_w_plain).item()


def test_reverse_kl_gradients_flow_through_the_blocks() -> None:
    torch.manual_seed(6)
    target = DoubleWell().double()
    u0 = Gaussian(2).double()
    coupling = AffineCoupling(2, mask=alternating_mask(2), hidden=(8,)).double()
    with torch.no_grad():
        for p in coupling.parameters():
            p.add_(0.1 * torch.randn_like(p))
    layers = [
        MetropolisBlock(target, steps=3, step_size=0.3),
        LangevinBlock(InterpolatedEnergy(u0, target, 0.5), steps=2, step_size=0.01),
        HMCBlock(InterpolatedEnergy(u0, target, 0.5), steps=1, step_size=0.05, leapfrog_steps=3),
        coupling,
    ]
    flow = Flow(Chain(*layers), StandardNormal(2)).double()
    x, log_q = flow.sample_and_log_prob((256,))
    loss = (log_q + target.energy(x)).mean()
    loss.backward()
    for name, p in coupling.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert sum(p.grad.abs().sum() for p in coupling.parameters()) > 0


def test_shapes_dtypes_and_bad_arguments() -> None:
    u = Gaussian((2, 2)).double()
    for block in [*_mh_blocks(u), LangevinBlock(u)]:
        for batch in ((), (4,), (2, 3)):
            x = torch.randn(*batch, 2, 2, dtype=torch.float64)
            y, ladj = block.forward_and_log_det(x)
            assert y.shape == x.shape and ladj.shape == batch and ladj.dtype == torch.float64
            assert block.inverse(x).shape == x.shape
        assert type(block).__name__ in repr(block)
    with pytest.raises(TypeError, match="expected an energy"):
        MetropolisBlock(lambda x: x)
    with pytest.raises(ValueError, match="steps to be an int >= 1"):
        LangevinBlock(u, steps=0)
    with pytest.raises(ValueError, match="positive finite step_size"):
        HMCBlock(u, step_size=-0.1)
    with pytest.raises(ValueError, match="leapfrog_steps to be an int >= 1"):
        HMCBlock(u, leapfrog_steps=0)
    with pytest.raises(ValueError, match="lam in"):
        InterpolatedEnergy(u, u, 1.5)
    with pytest.raises(ValueError, match="same event shape"):
        InterpolatedEnergy(u, Gaussian(4), 0.5)


def test_any_object_with_the_energy_protocol_drives_a_block() -> None:
    """Blocks need only event_shape, energy and energy_and_grad (flows._energy.Energy), not an EnergyTarget."""

    class Quadratic:  # a plain object: no nn.Module, no EnergyTarget
        event_shape = torch.Size([2])

        def energy(self, x: torch.Tensor) -> torch.Tensor:
            return 0.5 * x.square().sum(-1)

        def energy_and_grad(self, x: torch.Tensor, *, create_graph: bool = False):
            return self.energy(x), x

    torch.manual_seed(0)
    x = torch.randn(5, 2, dtype=torch.float64)
    reference = Gaussian(2).double()
    plain, target = MetropolisBlock(Quadratic(), step_size=0.3), MetropolisBlock(reference, step_size=0.3)
    torch.manual_seed(1)
    y_plain, dlogp_plain = plain.forward_and_log_det(x)
    torch.manual_seed(1)
    y_target, dlogp_target = target.forward_and_log_det(x)
    torch.testing.assert_close(y_plain, y_target)
    torch.testing.assert_close(dlogp_plain, dlogp_target)
