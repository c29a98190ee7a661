"""Flow and distributions: log_prob, sampling, conditional flows, dtype/device, bad input, normalisation."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows import NICE, DiagNormal, Flow, RealNVP, StandardNormal
from flows.testing import perturb_parameters


def _flow(context: int = 0) -> Flow:
    torch.manual_seed(0)
    return perturb_parameters(RealNVP(3, context, transforms=3, hidden=(16,)).double(), 0.2)


def test_log_prob_is_base_plus_ladj() -> None:
    flow = _flow()
    x = torch.randn(5, 3, dtype=torch.float64)
    z, ladj = flow.transform.forward_and_log_det(x)
    expected = -0.5 * z.square().sum(-1) - 1.5 * math.log(2 * math.pi) + ladj
    torch.testing.assert_close(flow.log_prob(x), expected)


def test_sample_and_log_prob_agrees_with_log_prob() -> None:
    flow = _flow()
    x, log_p = flow.sample_and_log_prob((4, 2))
    assert x.shape == (4, 2, 3) and log_p.shape == (4, 2)
    torch.testing.assert_close(log_p, flow.log_prob(x), atol=1e-10, rtol=1e-10)


def test_sample_rsample_shapes_and_gradients() -> None:
    flow = _flow()
    assert flow.sample().shape == (3,)
    assert flow.sample(7).shape == (7, 3)
    assert not flow.sample((2,)).requires_grad
    x = flow.rsample((6,))
    x.sum().backward()
    assert all(p.grad is not None for p in flow.parameters())


def test_conditional_flow_broadcasts_context_over_samples() -> None:
    flow = _flow(context=2)
    context = torch.randn(4, 2, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob((5,), context=context)
    assert x.shape == (5, 4, 3)
    torch.testing.assert_close(log_p, flow.log_prob(x, context=context.expand(5, 4, 2)), atol=1e-10, rtol=1e-10)
    # the context matters
    other = flow.log_prob(x, context=torch.randn(5, 4, 2, dtype=torch.float64))
    assert not torch.allclose(other, log_p)


def test_flow_follows_dtype_and_state_dict() -> None:
    flow = RealNVP(3, transforms=2, hidden=(8,))
    assert flow.sample(2).dtype == torch.float32
    flow = flow.double()
    assert flow.sample(2).dtype == torch.float64
    perturb_parameters(flow)
    clone = RealNVP(3, transforms=2, hidden=(8,)).double()
    clone.load_state_dict(flow.state_dict())
    x = torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(clone.log_prob(x), flow.log_prob(x))


def test_bad_input_errors() -> None:
    flow = _flow(context=2)
    c = torch.zeros(2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"RealNVP: expected input of shape \(\*batch, 3\), got \(2, 4\)"):
        flow.log_prob(torch.zeros(2, 4, dtype=torch.float64), c)
    with pytest.raises(TypeError, match=r"expected input with dtype torch\.float64 on cpu .*got dtype torch\.float32"):
        flow.log_prob(torch.zeros(2, 3), c)
    with pytest.raises(TypeError, match="floating-point input"):
        flow.log_prob(torch.zeros(2, 3, dtype=torch.long), c)
    bad = torch.zeros(2, 3, dtype=torch.float64)
    bad[1, 2] = float("nan")
    with pytest.raises(
        ValueError, match=r"expected a finite input, got 1 NaN/Inf value\(s\), the first at index \(1, 2\)"
    ):
        flow.log_prob(bad, c)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="NaN/Inf"):
        flow.log_prob(bad, c)
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 2\), got None"):
        flow.log_prob(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"expected context with dtype torch\.float64"):
        flow.log_prob(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"unconditional \(context=0\)"):
        _flow().log_prob(torch.zeros(2, 3, dtype=torch.float64), c)


def test_finite_check_can_be_turned_off() -> None:
    flow = Flow(flows.Affine(2), StandardNormal(2), check_finite=False)
    assert torch.isnan(flow.log_prob(torch.tensor([[float("nan"), 0.0]]))).all()


def test_flow_rejects_mismatched_base() -> None:
    with pytest.raises(
        ValueError, match=r"transform outputs events of shape \(3,\) but the base distribution has event\s+shape \(2,\)"
    ):
        Flow(flows.Affine(3), StandardNormal(2))


@pytest.mark.parametrize("builder", [RealNVP, NICE])
def test_two_dimensional_density_integrates_to_one(builder) -> None:
    torch.manual_seed(1)
    flow = perturb_parameters(builder(2, transforms=4, hidden=(16,)).double(), 0.1)
    grid = torch.linspace(-10, 10, 801, dtype=torch.float64)
    step = float(grid[1] - grid[0])
    xx, yy = torch.meshgrid(grid, grid, indexing="ij")
    with torch.no_grad():
        density = flow.log_prob(torch.stack([xx, yy], -1)).exp()
    assert abs(float(density.sum()) * step**2 - 1.0) < 2e-3


def test_builders_validate_arguments() -> None:
    with pytest.raises(ValueError, match="features to be an int >= 2"):
        RealNVP(1)
    with pytest.raises(ValueError, match="NICE: expected transforms to be an int >= 1, got 0"):
        NICE(4, transforms=0)


def test_distributions() -> None:
    d = DiagNormal((2, 2), loc=1.0, scale=0.5).double()
    x = d.sample((1000,))
    assert x.shape == (1000, 2, 2)
    ref = torch.distributions.Normal(torch.tensor(1.0, dtype=torch.float64), 0.5)
    torch.testing.assert_close(d.log_prob(x[:3]), ref.log_prob(x[:3]).sum((-1, -2)))
    assert {n for n, _ in d.named_parameters()} == {"loc", "log_scale"}
    fixed = DiagNormal(2, trainable=False)
    assert not list(fixed.parameters()) and set(fixed.state_dict()) == {"loc", "log_scale"}
    with pytest.raises(ValueError, match="positive scale"):
        DiagNormal(2, scale=-1.0)
    std = StandardNormal((2, 3)).double()
    torch.testing.assert_close(
        std.log_prob(x.new_zeros(2, 3)), torch.tensor(-3 * math.log(2 * math.pi), dtype=torch.float64)
    )
    with pytest.raises(ValueError, match=r"StandardNormal: expected input of shape \(\*batch, 2, 3\)"):
        std.log_prob(torch.zeros(3, 2))


def test_evaluating_restores_modes() -> None:
    flow = RealNVP(2, transforms=1, hidden=(4,))
    flow.train()
    flow.transform[0].eval()
    with flows.evaluating(flow):
        assert not any(m.training for m in flow.modules())
    assert flow.training and not flow.transform[0].training
