"""torch.distributions interop: flows as Distributions, torch Distributions as bases, KL, the zuko idiom."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import (
    Categorical,
    Independent,
    Laplace,
    MixtureSameFamily,
    MultivariateNormal,
    Normal,
    StudentT,
    kl_divergence,
)

import flows
from flows import MAF, NSF, Affine, DiagNormal, Flow, FlowDistribution, TorchDistribution, monte_carlo_kl


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


@pytest.fixture
def conditional() -> MAF:
    torch.manual_seed(0)
    return _perturbed(MAF(2, 3, transforms=2, hidden=(8,))).double()


def test_unconditional_flow_call_is_a_distribution() -> None:
    flow = _perturbed(NSF(3, transforms=1, hidden=(8,))).double()
    d = flow()
    assert isinstance(d, torch.distributions.Distribution)
    assert d.batch_shape == torch.Size(()) and d.event_shape == torch.Size((3,))
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(d.log_prob(x), flow.log_prob(x))
    assert d.sample((4, 2)).shape == (4, 2, 3)
    # the old call keeps its meaning: flow(x) is log_prob
    torch.testing.assert_close(flow(x), flow.log_prob(x))


def test_rsample_is_differentiable_and_sample_is_not() -> None:
    flow = _perturbed(NSF(2, transforms=1, hidden=(8,)))
    d = flow()
    x = d.rsample((16,))
    x.square().sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in flow.parameters())
    assert not d.sample((3,)).requires_grad


def test_conditional_flow_of_context_is_batched_over_contexts(conditional: MAF) -> None:
    c = torch.randn(4, 3, dtype=torch.float64)
    d = conditional(c)  # the zuko idiom: one tensor is the context
    assert isinstance(d, FlowDistribution)
    assert d.batch_shape == (4,) and d.event_shape == (2,)
    samples = d.sample((5,))
    assert samples.shape == (5, 4, 2)
    # log_prob broadcasts samples against the contexts and agrees with the flow's own log_prob
    expected = conditional.log_prob(samples, c.expand(5, 4, 3))
    torch.testing.assert_close(d.log_prob(samples), expected)
    # each batch entry is the distribution of its own context
    single = conditional(c[2:3])
    torch.testing.assert_close(single.log_prob(samples[:, 2:3]), expected[:, 2:3])
    # keyword form and flow(x, context) keep working
    assert conditional(context=c).batch_shape == (4,)
    torch.testing.assert_close(conditional(samples, c.expand(5, 4, 3)), expected)


def test_expand_broadcasts_context_and_batch(conditional: MAF) -> None:
    d = conditional(torch.randn(1, 3, dtype=torch.float64)).expand((6,))
    assert d.batch_shape == (6,) and d.sample((2,)).shape == (2, 6, 2)
    u = _perturbed(NSF(2, transforms=1, hidden=(8,)))().expand((2, 3))
    assert u.batch_shape == (2, 3) and u.sample((4,)).shape == (4, 2, 3, 2)
    assert u.log_prob(torch.randn(2, 3, 2)).shape == (2, 3)
    with pytest.raises(ValueError, match="expected a batch shape that"):
        conditional(torch.randn(4, 3, dtype=torch.float64)).expand((5,))


def test_independent_sums_the_batch_into_the_event() -> None:
    flow = _perturbed(NSF(2, transforms=1, hidden=(8,)))
    d = Independent(flow().expand((3,)), 1)
    assert d.event_shape == (3, 2) and d.batch_shape == ()
    x = torch.randn(5, 3, 2)
    torch.testing.assert_close(d.log_prob(x), flow.log_prob(x).sum(-1))


def test_mixture_same_family_of_contexts(conditional: MAF) -> None:
    contexts = torch.randn(3, 3, dtype=torch.float64)
    weights = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    mix = MixtureSameFamily(Categorical(weights), conditional(contexts))
    x = torch.randn(7, 2, dtype=torch.float64)
    per_component = torch.stack([conditional.log_prob(x, c.expand(7, 3)) for c in contexts], -1)
    expected = torch.logsumexp(per_component + weights.log(), -1)
    torch.testing.assert_close(mix.log_prob(x), expected)
    assert mix.sample((4,)).shape == (4, 2)


def test_kl_divergence_raises_clearly_and_monte_carlo_estimates_it() -> None:
    p = Flow(Affine(2), DiagNormal(2, loc=1.0, trainable=False)).double()()  # identity transform: p = N(1, I)
    q = Independent(Normal(torch.zeros(2, dtype=torch.float64), 1.0), 1)
    with pytest.raises(NotImplementedError, match="monte_carlo_kl"):
        kl_divergence(p, q)
    with pytest.raises(NotImplementedError, match="monte_carlo_kl"):
        kl_divergence(q, p)
    torch.manual_seed(0)
    estimate = monte_carlo_kl(p, q, samples=40000)
    assert abs(estimate.item() - 1.0) < 0.03  # exact KL(N(1, I) || N(0, I)) = |mu|^2 / 2 = 1
    with pytest.raises(ValueError, match="expected samples to be an int >= 1"):
        monte_carlo_kl(p, q, samples=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Independent(StudentT(torch.full((3,), 4.0), torch.zeros(3), torch.ones(3)), 1),
        lambda: Laplace(torch.zeros(3), torch.full((3,), 2.0)),
        lambda: MultivariateNormal(torch.zeros(3), scale_tril=torch.eye(3) + torch.tril(torch.ones(3, 3), -1)),
    ],
    ids=["studentt", "laplace", "mvn"],
)
def test_torch_distribution_as_base(make) -> None:
    torch.manual_seed(0)
    base = make()
    flow = _perturbed(NSF(3, transforms=1, hidden=(8,)))
    flow = Flow(flow.transform, base, context=0)
    x = torch.randn(6, 3)
    z, ladj = flow.transform.forward_and_log_det(x)
    # a bare Laplace(loc, scale) over 3 entries: its batch dimension becomes the event
    reference = Independent(base, len(base.batch_shape)) if base.batch_shape else base
    torch.testing.assert_close(flow.log_prob(x), reference.log_prob(z) + ladj)
    s, log_p = flow.sample_and_log_prob((5,))
    torch.testing.assert_close(log_p, flow.log_prob(s), atol=1e-4, rtol=1e-4)
    # the parameters are buffers: they follow .double() and are saved
    flow = flow.double()
    assert all(b.dtype == torch.float64 for b in flow.base.buffers())
    assert any(k.startswith("base.") for k in flow.state_dict())
    assert flow.log_prob(x.double()).dtype == torch.float64


def test_torch_distribution_rejects_non_distributions() -> None:
    with pytest.raises(TypeError, match=r"expected a torch\.distributions\.Distribution"):
        TorchDistribution(torch.zeros(3))
    with pytest.raises(TypeError, match=r"expected a flows or torch\.distributions Distribution as base"):
        Flow(Affine(2), "normal")


def test_torch_transform_follows_the_contract_and_moves_with_the_module() -> None:
    from torch.distributions import transforms as T

    t = flows.TorchTransform(T.AffineTransform(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 0.5])), 2)
    x = torch.randn(4, 2, dtype=torch.float64)
    t = t.double()
    z, ladj = t.forward_and_log_det(x)
    torch.testing.assert_close(
        z, torch.tensor([1.0, 2.0], dtype=torch.float64) + x * torch.tensor([2.0, 0.5], dtype=torch.float64)
    )
    torch.testing.assert_close(ladj, torch.full((4,), math.log(2.0 * 0.5), dtype=torch.float64))
    state = t.state_dict()
    assert set(state) == {"t_loc", "t_scale"}
    other = flows.TorchTransform(T.AffineTransform(torch.zeros(2), torch.ones(2)), 2).double()
    other.load_state_dict(state)
    torch.testing.assert_close(other(x), z)  # the loaded buffers drive the wrapped transform
    with pytest.raises(ValueError, match="expected a bijective transform"):
        flows.TorchTransform(T.AbsTransform(), 2)
    with pytest.raises(ValueError, match="keeps the event shape"):
        flows.TorchTransform(T.StickBreakingTransform(), 3)
    with pytest.raises(TypeError, match=r"expected a torch\.distributions\.transforms\.Transform"):
        flows.TorchTransform(torch.nn.Identity(), 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.distributions.Bernoulli(torch.full((2,), 0.5)),
        lambda: torch.distributions.Poisson(torch.ones(2)),
        lambda: Independent(Categorical(torch.ones(2, 3)), 1),
        lambda: torch.distributions.Dirichlet(torch.ones(2)),
        lambda: torch.distributions.Beta(torch.ones(2), torch.ones(2)),
        lambda: torch.distributions.LogNormal(torch.zeros(2), torch.ones(2)),
    ],
    ids=["bernoulli", "poisson", "categorical", "dirichlet", "beta", "lognormal"],
)
def test_a_base_without_real_support_is_refused_naming_its_support(make) -> None:
    base = make()
    name = type(base).__name__
    with pytest.raises(TypeError, match=rf"expected a base distribution with real support .* got {name}"):
        Flow(Affine(2), base)
    with pytest.raises(TypeError, match=r"with support \w+"):
        TorchDistribution(base)


def test_a_real_base_keeps_nan_visible() -> None:
    base = TorchDistribution(Independent(StudentT(torch.full((2, 3), 4.0)), 1))
    x = torch.randn(5, 2, 3)
    x[0, 1, 2] = math.nan
    log_p = base.log_prob(x)
    assert torch.isnan(log_p[0]) and bool(torch.isfinite(log_p[1:]).all())


def test_flow_distribution_says_what_has_no_closed_form() -> None:
    d = Flow(Affine(2), DiagNormal(2))()
    for get in (
        lambda: d.mean,
        lambda: d.variance,
        lambda: d.stddev,
        lambda: d.mode,
        d.entropy,
        lambda: d.cdf(torch.zeros(2)),
        lambda: d.icdf(torch.zeros(2)),
    ):
        with pytest.raises(NotImplementedError, match=r"not available: .* estimate it from samples"):
            get()


def test_flow_distribution_batch_shapes_are_checked(conditional: MAF) -> None:
    flow = Flow(Affine(2), DiagNormal(2))
    for bad in ((-2,), (2.5,), "ab"):
        with pytest.raises(ValueError, match="expected a batch shape of non-negative integers"):
            FlowDistribution(flow, batch_shape=bad)
        with pytest.raises(ValueError, match="expected a batch shape of non-negative integers"):
            flow().expand(bad)
    d = conditional(torch.randn(4, 3, dtype=torch.float64))
    for bad in ((1,), (3,), (4, 2)):  # broadcastable with (4,) but not an expansion of it
        with pytest.raises(ValueError, match=r"expected a batch shape that \(4,\) broadcasts to"):
            d.expand(bad)
    assert d.expand((2, 4)).sample().shape == (2, 4, 2)


def test_a_declared_context_that_no_layer_reads_is_refused() -> None:
    with pytest.raises(ValueError, match="never read a context"):
        Flow(Affine(2), DiagNormal(2), context=3)
    assert Flow(Affine(2), DiagNormal(2), context=0).context_features == 0
    with pytest.raises(ValueError, match="expected context to be an int >= 0, got -1"):
        Flow(Affine(2), DiagNormal(2), context=-1)


@pytest.mark.parametrize(
    "make",
    [
        lambda T: T.PowerTransform(0.0),
        lambda T: T.PowerTransform(math.inf),
        lambda T: T.AffineTransform(0.0, 0.0),
        lambda T: T.AffineTransform(torch.zeros(2), torch.tensor([1.0, 0.0])),
        lambda T: T.ComposeTransform([T.ExpTransform(), T.PowerTransform(0.0)]),
    ],
    ids=["power-0", "power-inf", "affine-0", "affine-one-zero-scale", "composed"],
)
def test_torch_transform_refuses_a_degenerate_transform(make) -> None:
    from torch.distributions import transforms as T

    with pytest.raises(ValueError, match=r"expected a bijective transform, got .* at a point of its domain"):
        flows.TorchTransform(make(T), 2)
