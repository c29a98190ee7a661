"""flows inside Pyro (``flows.interop.pyro``): SVI guide, ``Predictive``, NUTS prior and likelihood, bounded support.

Every model here has an exact posterior (conjugate Gaussians, or a 2-D density integrated on a
grid), so the checks compare with it; MCMC tolerances come from the chains' own effective sample
size (four Monte-Carlo standard errors).
"""

from __future__ import annotations

import subprocess
import sys

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO
from torch.distributions import Independent, StudentT
from torch.distributions.transforms import SigmoidTransform

import flows
from flows.bijections.base import Bijection
from flows.interop.pyro import PyroFlowDistribution, distribution
from flows.metrics import effective_sample_size

PRIOR_COV = torch.tensor([[1.0, 0.8], [0.8, 1.0]])
DATA = torch.tensor([[1.0, 0.5], [0.3, 0.8], [1.2, 1.1], [0.6, 0.2], [0.9, 1.0]])


def _posterior(prior_mean: torch.Tensor, prior_cov: torch.Tensor, x: torch.Tensor, sigma: float = 1.0):
    """Exact posterior of w ~ N(m0, S0), x_i ~ N(w, sigma^2 I)."""
    precision = torch.linalg.inv(prior_cov) + x.shape[0] / sigma**2 * torch.eye(2)
    cov = torch.linalg.inv(precision)
    return cov @ (torch.linalg.solve(prior_cov, prior_mean) + x.sum(0) / sigma**2), cov


def _gaussian_likelihood(w: torch.Tensor, x: torch.Tensor, sigma: float = 1.0) -> None:
    with pyro.plate("data", x.shape[0]):
        pyro.sample("x", dist.Normal(w, sigma).to_event(1), obs=x)


def _nuts(model, *args, samples: int = 200, warmup: int = 100) -> torch.Tensor:
    pyro.set_rng_seed(1)
    mcmc = MCMC(NUTS(model), num_samples=samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*args)
    return mcmc.get_samples()["w"]


def _within_mc_error(w: torch.Tensor, mean: torch.Tensor, sd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|sample mean - exact mean| and four Monte-Carlo standard errors (from the bulk ESS)."""
    ess = effective_sample_size(w.double().unsqueeze(1))  # (draws, chains=1, 2)
    return (w.mean(0) - mean).abs(), 4 * sd / ess.sqrt().float()


def test_import_flows_does_not_import_pyro() -> None:
    code = "import sys, flows, flows.interop; print('pyro' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_flow_guide_reaches_the_exact_gaussian_posterior_and_predictive_works() -> None:
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    mean, cov = _posterior(torch.zeros(2), PRIOR_COV, DATA)
    flow = flows.IAF(2, transforms=1, hidden=(8,))

    def model(x):
        _gaussian_likelihood(pyro.sample("w", dist.MultivariateNormal(torch.zeros(2), PRIOR_COV)), x)

    def guide(x):
        pyro.module("flow", flow)
        pyro.sample("w", distribution(flow))

    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.05, "lrd": 0.99}), Trace_ELBO())
    losses = [svi.step(DATA) for _ in range(300)]
    assert sum(losses[-20:]) < sum(losses[:20])
    assert set(pyro.get_param_store()) == {f"flow$$${name}" for name, _ in flow.named_parameters()}
    with torch.no_grad():
        w, log_q = flow.sample_and_log_prob((4000,))
        kl = (log_q - dist.MultivariateNormal(mean, cov).log_prob(w)).mean()
    sd = cov.diag().sqrt()
    assert ((w.mean(0) - mean).abs() / sd).max() < 0.3
    assert kl < 0.1

    predictive = Predictive(model, guide=guide, num_samples=50, return_sites=("w", "x"))(DATA)
    assert predictive["w"].shape == (50, 1, 2) and predictive["x"].shape == (50, *DATA.shape)
    assert torch.isfinite(predictive["x"]).all()


def test_a_flow_prior_under_nuts_and_a_conditional_flow_likelihood_match_the_exact_posterior() -> None:
    """Prior w ~ flow (an inverted Affine: N(m0, diag(s0^2))); likelihood x_i | w ~ flow(w), a shift by w."""

    class Shift(Bijection):  # z = x - c: the conditional flow flow(c) is N(c, I)
        context_features = 2

        def forward_and_log_det(self, x, context=None):
            return x - context, x.new_zeros(self.batch_shape(x))

        def inverse_and_log_det(self, z, context=None):
            return z + context, z.new_zeros(self.batch_shape(z))

    m0, s0 = torch.tensor([0.5, -0.5]), torch.tensor([1.0, 0.6])
    sampling = flows.Affine(2, shift=m0, log_scale=s0.log())  # z -> m0 + s0 z, the sampling direction
    prior = flows.Flow(flows.Inverse(sampling), flows.StandardNormal(2)).requires_grad_(False)
    likelihood = flows.Flow(Shift(2), flows.StandardNormal(2), context=2)

    def model(x):
        w = pyro.sample("w", distribution(prior))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("x", distribution(likelihood, w.expand(x.shape[0], 2)), obs=x)

    trace = pyro.poutine.trace(model).get_trace(DATA)
    w = trace.nodes["w"]["value"]
    exact = dist.Normal(m0, s0).log_prob(w).sum() + dist.Normal(w, 1.0).log_prob(DATA).sum()
    assert torch.allclose(trace.log_prob_sum(), exact, atol=1e-5)

    samples = _nuts(model, DATA)
    mean, cov = _posterior(m0, torch.diag(s0**2), DATA)
    error, tolerance = _within_mc_error(samples, mean, cov.diag().sqrt())
    assert (error < tolerance).all(), (error, tolerance)
    assert ((samples.std(0) / cov.diag().sqrt() - 1).abs() < 0.35).all()


def test_the_bounded_readme_flow_as_a_nuts_prior_gives_the_exact_posterior() -> None:
    """The README's ``heavy`` flow lives on (0, 1)^2; NUTS must sample inside (its support is declared)."""
    torch.manual_seed(0)
    heavy = flows.Flow(
        flows.TorchTransform(SigmoidTransform().inv, 2),
        Independent(StudentT(torch.full((2,), 3.0), torch.zeros(2), torch.ones(2)), 1),
    )
    x, sigma = torch.tensor([[1.1, -0.1], [0.9, 0.2], [1.2, 0.0]]), 0.3
    assert heavy().support.check(torch.tensor([[-0.3, 0.5], [0.5, 0.5]])).tolist() == [False, True]

    def model(x):
        _gaussian_likelihood(pyro.sample("w", distribution(heavy)), x, sigma)

    # exact posterior moments on a midpoint grid of the unit square
    n = 400
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    grid = torch.stack(torch.meshgrid(u, u, indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        log_post = heavy.double().log_prob(grid) + dist.Normal(grid[:, None], sigma).log_prob(x.double()).sum((1, 2))
    heavy.float()
    weight = torch.softmax(log_post, 0)[:, None]
    mean = (weight * grid).sum(0)
    sd = (weight * (grid - mean) ** 2).sum(0).sqrt()

    samples = _nuts(model, x)
    assert ((samples > 0) & (samples < 1)).all()
    error, tolerance = _within_mc_error(samples, mean.float(), sd.float())
    assert (error < tolerance).all(), (samples.mean(0), mean, tolerance)


def test_the_pyro_distribution_has_the_flows_shapes_support_and_sampling() -> None:
    flow = flows.MAF(2, context=3, transforms=1, hidden=(8,))
    d = distribution(flow, torch.randn(4, 3))
    assert isinstance(d, PyroFlowDistribution) and d.has_rsample
    assert d.batch_shape == (4,) and d.event_shape == (2,)
    assert d.sample((5,)).shape == (5, 4, 2) and d.rsample().requires_grad
    x = torch.randn(5, 4, 2)
    assert torch.equal(d.log_prob(x), flow(d.context).log_prob(x))
    assert d.support.check(x).shape == (5, 4)
    expanded = d.expand((2, 4))
    assert isinstance(expanded, PyroFlowDistribution) and expanded.batch_shape == (2, 4)
    assert d.to_event(1).event_shape == (4, 2)  # Pyro's mixin
    with pyro.plate("rows", 4):
        assert pyro.sample("y", distribution(flow, torch.randn(4, 3))).shape == (4, 2)


def test_pyro_refuses_nothing_silently_for_a_wrong_event() -> None:
    d = distribution(flows.MAF(2, transforms=1, hidden=(8,)))
    with pytest.raises(ValueError, match=r"expected"):
        d.log_prob(torch.randn(5, 3))


def test_nuts_with_jit_compile_runs_on_a_flows_prior_and_agrees_with_the_eager_chain() -> None:
    """``NUTS(jit_compile=True)`` traces the model: MADE's in-place ReLU once made the trace fail."""
    flow = flows.MAF(2, transforms=2, hidden=(8,))
    flow.requires_grad_(False)  # a traced model may not hold parameters that need gradients

    def model(y):
        w = pyro.sample("w", distribution(flow))
        pyro.sample("y", dist.Normal(w.sum(), 1.0), obs=y)

    chains = {}
    for jit in (False, True):
        pyro.set_rng_seed(0)
        kernel = NUTS(model, jit_compile=jit, ignore_jit_warnings=True)
        mcmc = MCMC(kernel, num_samples=40, warmup_steps=40, disable_progbar=True)
        mcmc.run(torch.tensor(0.5))
        chains[jit] = mcmc.get_samples()["w"]
    assert chains[True].shape == (40, 2) and torch.isfinite(chains[True]).all()
    torch.testing.assert_close(chains[True], chains[False], rtol=1e-4, atol=1e-4)  # the same chain, traced
