"""Energy-target objectives: reverse KL (with temperature), forward KL on samples, and the shared-block flow."""

from __future__ import annotations

import math

import pytest
import torch

from flows import Affine, Chain, Flow, StandardNormal
from flows.bijections import AffineCoupling, MetropolisBlock, SharedBlocks
from flows.targets import DoubleWell, Gaussian, ManyWell, PhiFour
from flows.train.energy import ForwardKL, ReverseKL, forward_kl_loss, reverse_kl_loss


def _gaussian_flow(dim: int) -> Flow:
    return Flow(Affine(dim), StandardNormal(dim)).double()


def test_reverse_kl_loss_is_kl_minus_log_z() -> None:
    """For q = N(0, 1) and π = N(μ, σ²) (normalised), the loss estimates KL(q‖π) in closed form."""
    torch.manual_seed(0)
    mu, sigma = 0.7, 1.8
    target = Gaussian(1, loc=mu, scale=sigma).double()
    loss, log_w = reverse_kl_loss(_gaussian_flow(1), target, 200_000)
    kl = math.log(sigma) + (1 + mu**2) / (2 * sigma**2) - 0.5
    assert abs(loss.item() - kl) < 0.01
    assert log_w.shape == (200_000,) and not log_w.requires_grad
    # temperature T: the loss targets exp(-u/T); for a Gaussian that is N(μ, T σ²) up to log Z_T
    loss_t, _ = reverse_kl_loss(_gaussian_flow(1), target, 200_000, temperature=2.0)
    log_z_t = 0.5 * math.log(2 * math.pi * 2.0 * sigma**2) - 0.5 * math.log(2 * math.pi * sigma**2) / 2.0
    kl_t = math.log(math.sqrt(2.0) * sigma) + (1 + mu**2) / (2 * 2.0 * sigma**2) - 0.5
    assert abs(loss_t.item() - (kl_t - log_z_t)) < 0.01


def test_reverse_kl_trains_a_flow_to_the_target() -> None:
    torch.manual_seed(1)
    target = Gaussian(2, loc=torch.tensor([1.0, -2.0]), scale=torch.tensor([0.5, 2.0])).double()
    flow = _gaussian_flow(2)
    objective = ReverseKL(target, batch_size=128, eval_samples=4000)
    opt = torch.optim.Adam(flow.parameters(), lr=5e-2)
    for _ in range(200):
        loss, metrics = objective(flow, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert set(metrics) == {"ess", "log_z"}
    result = objective.evaluate(flow)
    assert result["ess"] > 0.97
    assert abs(result["log_z_error"]) < 0.01
    assert result["log_z_stderr"] < 0.01
    assert abs(result["loss"]) < 0.01  # KL → 0 and log Z = 0


def test_evaluate_is_reproducible_and_temperature_aware() -> None:
    target = DoubleWell().double()
    flow = _gaussian_flow(2)
    objective = ReverseKL(target, eval_samples=2000)
    assert objective.evaluate(flow) == objective.evaluate(flow)
    hot = ReverseKL(target, temperature=3.0, eval_samples=2000).evaluate(flow)
    assert "log_z_error" not in hot  # log Z is known at T = 1 only
    # at T = 3 the tempered double well is closer to the standard normal: a better ESS
    assert hot["ess"] > objective.evaluate(flow)["ess"]


def test_forward_kl_from_batches_or_exact_samples() -> None:
    torch.manual_seed(2)
    target = Gaussian(2, loc=1.0).double()
    flow = _gaussian_flow(2)
    x = target.sample(50_000)
    expected = math.log(2 * math.pi) + 0.5 * 4  # -E log N(x; 0, I) for x ~ N(1, I) in 2-D
    assert abs(forward_kl_loss(flow, x).item() - expected) < 0.05
    objective = ForwardKL(target, batch_size=50_000)
    assert abs(objective(flow, None).item() - expected) < 0.05
    assert abs(objective(flow, (x,)).item() - expected) < 0.05
    assert abs(objective.evaluate(flow, [(x[:100],), (x[100:],)])["loss"] - expected) < 0.05
    assert abs(objective.evaluate(flow)["loss"] - expected) < 0.1
    # self-normalised weights: all the weight on one sample gives its own loss
    log_w = torch.full((3,), -math.inf, dtype=torch.float64)
    log_w[1] = 0.0
    torch.testing.assert_close(forward_kl_loss(flow, x[:3], log_w=log_w), -flow.log_prob(x[1:2])[0])


def test_objectives_work_through_stochastic_blocks() -> None:
    torch.manual_seed(3)
    target = DoubleWell().double()
    flow = Flow(Chain(MetropolisBlock(target, steps=2, step_size=0.3), Affine(2)), StandardNormal(2)).double()
    loss, _ = ReverseKL(target, batch_size=64)(flow, None)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in flow.parameters())
    assert torch.isfinite(ForwardKL(target, batch_size=64)(flow, None))


def test_shared_blocks_learn_the_many_well_from_one_pair() -> None:
    """Forward KL on exact samples: the shared pair flow sees d/2 pairs per sample."""
    torch.manual_seed(4)
    target = ManyWell(6).double()
    pair = Chain(*[AffineCoupling(2, mask=torch.tensor([i % 2 == 0, i % 2 == 1]), hidden=(16,)) for i in range(3)])
    flow = Flow(SharedBlocks(pair, blocks=3), StandardNormal(6)).double()
    objective = ForwardKL(target, batch_size=64, eval_samples=4000)
    before = objective.evaluate(flow)["loss"]
    opt = torch.optim.Adam(flow.parameters(), lr=1e-2)
    for _ in range(100):
        loss = objective(flow, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = objective.evaluate(flow)["loss"]
    entropy = -(target.log_prob(target.sample(4000), normalized=True)).mean().item()
    assert after < before - 1.0
    assert after - entropy < 0.5 * (before - entropy)  # at least halfway to the optimum KL = 0


def test_bad_arguments() -> None:
    target = DoubleWell()
    with pytest.raises(ValueError, match="positive finite temperature"):
        ReverseKL(target, temperature=0.0)
    with pytest.raises(ValueError, match="positive finite temperature"):
        reverse_kl_loss(_gaussian_flow(2), target, 8, temperature=math.inf)
    with pytest.raises(ValueError, match="expected n to be an int >= 1"):
        reverse_kl_loss(_gaussian_flow(2), target, 0)
    with pytest.raises(TypeError, match=r"expected target to be an EnergyTarget or an object"):
        ReverseKL(lambda x: x)
    with pytest.raises(ValueError, match="no exact sampler"):
        ForwardKL(PhiFour(4))
    with pytest.raises(ValueError, match="no target"):
        ForwardKL()(_gaussian_flow(2), None)
    with pytest.raises(TypeError, match="expected a batch"):
        ForwardKL(target)(_gaussian_flow(2), {"x": 1})
    with pytest.raises(ValueError, match="vector events"):
        SharedBlocks(Chain(Affine((2, 2))), blocks=2)
    with pytest.raises(ValueError, match="blocks to be an int >= 1"):
        SharedBlocks(Affine(2), blocks=0)


def test_trainer_runs_energy_objectives_with_annealing_and_mixtures() -> None:
    from flows.train import AnnealTemperature, Trainer, WeightedSum

    torch.manual_seed(5)
    target = DoubleWell()
    flow = Flow(Affine(2), StandardNormal(2))
    reverse = ReverseKL(target, batch_size=64, eval_samples=500)
    temperatures = []

    class Record(AnnealTemperature):
        def on_step_end(self, trainer, metrics) -> None:
            super().on_step_end(trainer, metrics)
            temperatures.append(reverse.temperature)

    trainer = Trainer(flow, reverse, lr=1e-2, callbacks=[Record(reverse, steps=10)])
    history = trainer.fit(None, val=[None], steps_per_epoch=5, max_steps=10)
    assert temperatures[0] == pytest.approx(4.0 ** (1 - 1 / 6)) and temperatures[-1] == 1.0
    assert {"val_ess", "val_log_z", "val_log_z_error", "ess"} <= set(history.last())
    # a mixture of reverse KL and forward KL on exact samples, as SNF trains
    mix = WeightedSum(
        [(0.5, ReverseKL(target, batch_size=64), "energy"), (0.5, ForwardKL(target, batch_size=64), "ml")]
    )
    history = Trainer(flow, mix, lr=1e-2).fit(None, steps_per_epoch=5, max_steps=5)
    assert {"energy_loss", "ml_loss", "energy_ess"} <= set(history.last())
    with pytest.raises(ValueError, match="exactly one of steps and seconds"):
        AnnealTemperature(reverse)
