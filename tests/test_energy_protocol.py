"""One contract for targets: every sampler and objective takes the ``Energy`` protocol the SNF blocks take."""

from __future__ import annotations

import pytest
import torch

from flows import Affine, Flow, RealNVP, StandardNormal
from flows.mcmc import HMC, IMH, MALA, NeuTra, RandomWalk, sample
from flows.targets import EnergyTarget, Gaussian, ProtocolTarget, TemperedEnergy, as_target
from flows.train import ReverseKL


class Quadratic:
    """A plain object (no EnergyTarget) with the three members of the protocol: u = |x - 1|² / 2."""

    event_shape = torch.Size([2])

    def __init__(self) -> None:
        self.grad_calls = 0

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((x - 1.0) ** 2).sum(-1)

    def energy_and_grad(self, x: torch.Tensor, *, create_graph: bool = False):
        self.grad_calls += 1
        return self.energy(x), x - 1.0


def test_as_target_passes_energy_targets_through_and_wraps_the_protocol() -> None:
    gaussian = Gaussian(2)
    assert as_target(gaussian, "t") is gaussian
    wrapped = as_target(Quadratic(), "t")
    assert isinstance(wrapped, ProtocolTarget) and isinstance(wrapped, EnergyTarget)
    x = torch.randn(5, 2)
    log_p, grad = wrapped.log_prob_and_grad(x)
    torch.testing.assert_close(log_p, -0.5 * ((x - 1) ** 2).sum(-1))
    torch.testing.assert_close(grad, 1.0 - x)
    assert wrapped.wrapped.grad_calls == 1  # the object's analytic gradient is used, not autograd
    assert not wrapped.has_exact_sampler


@pytest.mark.parametrize("bad", [3.0, "gaussian", torch.zeros(2), object()])
def test_anything_else_is_refused_naming_the_protocol(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^HMC: expected target to be an EnergyTarget or an object with event_shape"):
        HMC(bad)


def test_a_protocol_object_drives_local_and_flow_kernels_to_its_mean() -> None:
    torch.manual_seed(0)
    target = Quadratic()
    flow = Flow(Affine(2), StandardNormal(2))
    kernels = [RandomWalk(target), MALA(target), HMC(target), IMH(target, flow)]
    for kernel in kernels:
        trace = sample(kernel, torch.zeros(64, 2), 300, warmup=100)
        mean = trace.samples.reshape(-1, 2).mean(0)
        torch.testing.assert_close(mean, torch.ones(2), atol=0.2, rtol=0, msg=type(kernel).__name__)
    assert NeuTra(target, flow).target.wrapped is target


def test_objectives_and_tempering_take_the_protocol() -> None:
    torch.manual_seed(0)
    flow = RealNVP(2, transforms=2, hidden=(8,))
    objective = ReverseKL(Quadratic(), batch_size=16, eval_samples=16)
    loss, _ = objective(flow)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in flow.parameters())
    hot = TemperedEnergy(Quadratic(), temperature=2.0)
    x = torch.randn(4, 2)
    torch.testing.assert_close(hot.energy(x), Quadratic().energy(x) / 2)


def test_flow_dtype_and_device_follow_the_module() -> None:
    flow = RealNVP(2, transforms=1, hidden=(4,))
    assert flow.dtype == torch.float32 and flow.device == torch.device("cpu")
    flow.double()
    assert flow.dtype == torch.float64
    with pytest.raises(TypeError, match=r"expected input with dtype torch\.float64"):
        flow.log_prob(torch.zeros(3, 2))
