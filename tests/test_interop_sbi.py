"""flows.interop.sbi: flows' builders as sbi NPE/NLE density estimators (runs when sbi is installed)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributions import MultivariateNormal

pytest.importorskip("sbi", reason="the optional dependency sbi (pip install 'flows[sbi]') is not installed")

from sbi.inference import NLE, NPE

from flows.interop.sbi import FlowEstimator, builder

SIGMA = 0.5


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch) -> None:
    """sbi's trainers write TensorBoard logs to ./sbi-logs: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


def _simulations(n: int, seed: int = 0) -> tuple[MultivariateNormal, torch.Tensor, torch.Tensor]:
    """θ ~ N(0, I₂), x | θ ~ N(θ, σ² I): the posterior is N(x / (1 + σ²), σ² / (1 + σ²) I)."""
    torch.manual_seed(seed)
    prior = MultivariateNormal(torch.zeros(2), torch.eye(2))
    theta = prior.sample((n,))
    return prior, theta, theta + SIGMA * torch.randn(n, 2)


def _exact_posterior(x_o: torch.Tensor) -> MultivariateNormal:
    return MultivariateNormal(x_o / (1 + SIGMA**2), SIGMA**2 / (1 + SIGMA**2) * torch.eye(2))


@torch.no_grad()
def _kl(estimator, x_o: torch.Tensor, n: int = 4000) -> float:
    """KL(p ‖ q) by Monte Carlo over exact posterior draws (standard error ≈ 0.005 at these sizes)."""
    p = _exact_posterior(x_o)
    theta = p.sample((n,))
    return float((p.log_prob(theta) - estimator.log_prob(theta.unsqueeze(1), x_o.unsqueeze(0))[:, 0]).mean())


def test_npe_with_a_flows_maf_reaches_the_exact_gaussian_posterior() -> None:
    # KL < 0.1 is a mean error of at most 0.45 posterior sd (KL of two Gaussians of equal covariance is
    # |Δμ|²/2σ²); the prior, what an untrained estimator is near, is at KL ≥ 0.8 from this posterior.
    prior, theta, x = _simulations(1000)
    npe = NPE(prior, density_estimator=builder("maf", transforms=2, hidden=(32,)), show_progress_bars=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = npe.append_simulations(theta, x).train(max_num_epochs=30, training_batch_size=100)
    assert isinstance(estimator, FlowEstimator)
    for x_o in (torch.tensor([0.8, -0.5]), torch.tensor([-1.5, 0.3])):
        assert _kl(estimator, x_o) < 0.1
    posterior = npe.build_posterior()  # sbi's own sampling and log_prob go through the estimator
    x_o = torch.tensor([[0.8, -0.5]])
    samples = posterior.sample((2000,), x=x_o, show_progress_bars=False)
    exact = _exact_posterior(x_o[0])
    assert samples.shape == (2000, 2)
    assert (samples.mean(0) - exact.mean).abs().max() < 0.1  # 0.22 posterior sd
    assert torch.isfinite(posterior.log_prob(samples[:10], x=x_o)).all()


def test_the_estimator_follows_sbis_shape_contract_and_z_scores_both_sides() -> None:
    _, theta, x = _simulations(200)
    estimator = builder("nsf", transforms=1, hidden=(8,), bins=4)(100 + 3 * theta, x - 7)
    assert estimator.input_shape == (2,) and estimator.condition_shape == (2,)
    torch.testing.assert_close(estimator.condition_loc, (x - 7).mean(0))
    standardize = estimator.net.transform[0]  # the input's z-scoring layer, data side
    torch.testing.assert_close(standardize.forward(100 + 3 * theta).mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    conditions = torch.randn(4, 2)
    assert estimator.log_prob(torch.randn(5, 4, 2), conditions).shape == (5, 4)
    assert estimator.log_prob(torch.randn(4, 2), conditions).shape == (1, 4)
    assert estimator.loss(torch.randn(4, 2), conditions).shape == (4,)
    assert estimator.sample(torch.Size((6,)), conditions).shape == (6, 4, 2)
    samples, log_p = estimator.sample_and_log_prob(torch.Size((3,)), conditions)
    torch.testing.assert_close(log_p, estimator.log_prob(samples, conditions), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="condition"):
        estimator.log_prob(torch.randn(4, 2), torch.randn(4, 3))


def test_structured_and_no_z_scoring_and_the_likelihood_side() -> None:
    _, theta, x = _simulations(100)
    none = builder("maf", transforms=1, hidden=(8,), z_score_theta="none", z_score_x=None)(theta, x)
    assert len(none.net.preprocessing) == 0 and torch.equal(none.condition_scale, torch.ones(2))
    structured = builder("maf", transforms=1, hidden=(8,), z_score_x="structured")(theta, 5 * x)
    assert structured.condition_scale[0] == structured.condition_scale[1]
    likelihood = builder("maf", estimate="likelihood", transforms=1, hidden=(8,))(theta, torch.cat((x, x), 1))
    assert likelihood.input_shape == (4,) and likelihood.condition_shape == (2,)  # models x given θ


def test_nle_trains_with_the_builder() -> None:
    prior, theta, x = _simulations(1000)
    build = builder("maf", estimate="likelihood", transforms=2, hidden=(32,))
    nle = NLE(prior, density_estimator=build, show_progress_bars=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = nle.append_simulations(theta, x).train(
            max_num_epochs=20, training_batch_size=50, learning_rate=3e-3
        )
    theta_o = torch.tensor([[1.0, -1.0]])
    draws = estimator.sample(torch.Size((4000,)), theta_o)[:, 0]
    # x | θ has mean θ and sd 0.5; the marginal of x (what ignoring θ gives) has mean 0 and sd 1.1
    assert (draws.mean(0) - theta_o[0]).abs().max() < 0.15
    assert (draws.std(0) - SIGMA).abs().max() < 0.1


def test_bad_options_are_refused_when_the_builder_is_made() -> None:
    with pytest.raises(ValueError, match="expected one of"):
        builder("not-a-flow")
    with pytest.raises(ValueError, match="z_score_x"):
        builder("maf", z_score_x="sometimes")
    with pytest.raises(ValueError, match="estimate"):
        builder("maf", estimate="ratio")
    with pytest.raises(ValueError, match="equal size"):
        builder("maf", transforms=1, hidden=(8,))(torch.randn(10, 2), torch.randn(9, 2))
