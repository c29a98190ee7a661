"""ImportanceForwardKL: the proposal density is the exact mixture, moves reach a missing mode, bad input is refused."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows import Affine, Flow, StandardNormal
from flows.bijections import Bijection
from flows.bijections.base import sum_event_dims
from flows.targets import Gaussian, GaussianMixture
from flows.train import ImportanceForwardKL, MaximumLikelihood, Trainer


class Mirror(Bijection):
    """x -> -x in the first coordinate (log-det 0), a move between the two modes below."""

    def _flip(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.cat([-x[..., :1], x[..., 1:]], -1)
        return z, sum_event_dims(torch.zeros_like(z), 1, self.batch_shape(x))

    def forward_and_log_det(self, x, context=None):
        return self._flip(x)

    def inverse_and_log_det(self, z, context=None):
        return self._flip(z)


def _normal_log_pdf(x: torch.Tensor, loc: float) -> torch.Tensor:
    return -0.5 * (x - loc) ** 2 - 0.5 * math.log(2 * math.pi)


def test_the_proposal_density_is_the_exact_mixture_of_the_model_and_its_moved_copy() -> None:
    """q = N(-1, 1) in 1-D with the mirror move: r(x) = (1 - ε) N(x; -1, 1) + ε N(-x; -1, 1) at every sample."""
    torch.manual_seed(0)
    flow = Flow(Affine(1, shift=1.0), StandardNormal(1)).double()  # z = x + 1: q = N(-1, 1)
    objective = ImportanceForwardKL(Gaussian(1).double(), moves=[Mirror(1)], move_fraction=0.25, batch_size=400)
    x, log_r, moved = objective._propose(flow)
    exact = torch.logaddexp(math.log(0.75) + _normal_log_pdf(x, -1.0), math.log(0.25) + _normal_log_pdf(-x, -1.0))
    torch.testing.assert_close(log_r, exact[:, 0], rtol=1e-12, atol=1e-12)
    assert int(moved.sum()) == 100 and x.shape == (400, 1)
    assert float(x[moved].mean()) > 0.7 and float(x[~moved].mean()) < -0.7  # the moved rows are mirror images


def test_without_moves_the_loss_is_the_self_normalised_forward_kl() -> None:
    """Model N(0, 1), target N(μ, 1): the loss estimates E_π[-log q] = log 2π / 2 + (1 + μ²) / 2."""
    torch.manual_seed(1)
    mu = 0.8
    objective = ImportanceForwardKL(Gaussian(1, loc=mu).double(), batch_size=200_000)
    loss, metrics = objective(Flow(Affine(1), StandardNormal(1)).double(), None)
    assert abs(loss.item() - (0.5 * math.log(2 * math.pi) + (1 + mu**2) / 2)) < 0.02
    assert 0.4 < float(metrics["ess"]) < 0.6  # Kish ESS of N(0,1) -> N(0.8,1) weights: exp(-μ²) = 0.53
    assert float(metrics["moved_weight"]) == 0.0


def _left_mode_flow(target: GaussianMixture) -> flows.Flow:
    """An NSF fitted to the left mode only (as a flow trained on MD frames of one basin)."""
    torch.manual_seed(2)
    flow = flows.NSF(2, transforms=2, hidden=(32, 32), bins=8)
    x = target.sample((4000,))
    left = x[x[:, 0] < 0]
    Trainer(flow, MaximumLikelihood(), lr=5e-3, progress=False).fit(left, batch_size=256, max_steps=200, epochs=100)
    return flow


@pytest.mark.parametrize("moves", [True, False])
def test_a_move_lets_the_model_learn_the_mode_it_misses(moves: bool) -> None:
    """Modes at x₁ = ±3 (σ = 0.3) with weights 0.7 / 0.3; the model starts on the left one only.

    With the mirror as a move the model learns the right mode's mass (0.3); without it the
    importance-weighted forward KL never samples that mode and the mass stays near 0.
    """
    target = GaussianMixture([[-3.0, 0.0], [3.0, 0.0]], stds=0.3, weights=[0.7, 0.3])
    flow = _left_mode_flow(target)
    with torch.no_grad():
        start = float((flow.sample((4000,))[:, 0] > 0).float().mean())
    assert start == 0.0
    objective = ImportanceForwardKL(target, moves=[Mirror(2)] if moves else [], move_fraction=0.5, batch_size=256)
    Trainer(flow, objective, lr=3e-3, progress=False).fit(None, steps_per_epoch=100, max_steps=300, epochs=100)
    with torch.no_grad():
        mass = float((flow.sample((8000,))[:, 0] > 0).float().mean())
    if moves:
        assert abs(mass - 0.3) < 0.06
    else:
        assert mass < 0.01


def test_zero_weight_rows_and_bad_input() -> None:
    class Partial(Gaussian):
        def energy(self, x):  # +inf (zero weight) right of the origin, NaN on a far-left sliver
            u = super().energy(x)
            return torch.where(x[..., 0] > 0, math.inf, torch.where(x[..., 0] < -3, math.nan, u))

    flow = Flow(Affine(1), StandardNormal(1)).double()
    loss, _ = ImportanceForwardKL(Partial(1).double(), batch_size=2000)(flow, None)
    assert math.isfinite(loss.item())

    class Nowhere(Gaussian):
        def energy(self, x):
            return torch.full(x.shape[:-1], math.inf, dtype=x.dtype)

    with pytest.raises(ValueError, match="every proposal sample has weight 0"):
        ImportanceForwardKL(Nowhere(1).double(), batch_size=10)(flow, None)
    with pytest.raises(ValueError, match=r"move_fraction in \[0, 1\), got 1.0"):
        ImportanceForwardKL(Gaussian(1), moves=[Mirror(1)], move_fraction=1.0)
    with pytest.raises(TypeError, match="expected bijections as moves, got function"):
        ImportanceForwardKL(Gaussian(1), moves=[lambda x: -x])
    with pytest.raises(ValueError, match="batch_size"):
        ImportanceForwardKL(Gaussian(1), batch_size=1)


def test_circular_reflection_is_an_involution_onto_the_circle() -> None:
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(500, 3, generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
    t = flows.CircularReflection(3, torch.tensor([0.3, -2.5, 1.0]), circular=torch.tensor([1, 1, 0])).double()
    z, ladj = t.forward_and_log_det(x)
    assert bool((z[:, :2] >= -math.pi).all()) and bool((z[:, :2] < math.pi).all())
    torch.testing.assert_close(z[:, 2], x[:, 2], rtol=0, atol=0)
    torch.testing.assert_close(t(z), x, rtol=0, atol=1e-12)
    assert bool((ladj == 0).all())
    # the reflection about a: angles a + d and a - d swap (mod 2π)
    d = torch.remainder(z[:, 0] - (2 * t.axis[0] - x[:, 0]) + math.pi, 2 * math.pi) - math.pi
    assert float(d.abs().max()) < 1e-12
    with pytest.raises(ValueError, match=r"expected a mask of shape \(3,\)"):
        flows.CircularReflection(3, 0.0, circular=torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="expected a finite axis"):
        flows.CircularReflection(3, math.nan)
