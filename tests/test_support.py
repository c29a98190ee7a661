"""Supports, foreign parameters and torch transforms both ways (issue 30, part A).

* a flow's ``support`` is its data-side layer's domain and ``log_prob`` is ``-inf`` outside it;
* ``TorchTransform`` owns what the wrapped transform computes with (zuko hyper-networks, Pyro
  ``TransformModule``s, ``nn.Parameter``s) or refuses it; so does a torch base;
* ``Bijection.as_torch_transform()`` puts any layer into torch's and Pyro's ``TransformedDistribution``;
* composite bases (``MixtureSameFamily``, ``TransformedDistribution``, a flow's ``flow()``).
"""

from __future__ import annotations

import copy

import pyro.distributions as pdist
import pyro.distributions.transforms as pyro_transforms
import pytest
import torch
import torch.distributions as td
import zuko
from torch import nn
from torch.distributions import constraints
from torch.distributions import transforms as T

import flows

HEAVY_BASE = td.Independent(td.StudentT(torch.full((2,), 3.0), torch.zeros(2), torch.ones(2)), 1)


def _heavy() -> flows.Flow:
    return flows.Flow(flows.TorchTransform(T.SigmoidTransform().inv, 2), HEAVY_BASE)


# -- 1. bounded support -------------------------------------------------------------------------


def test_the_readme_bounded_flow_declares_its_support_and_is_minus_inf_outside() -> None:
    heavy = _heavy()
    x = torch.tensor([[-0.3, 0.5], [0.5, 0.5], [0.2, 1.4]])
    log_p = heavy().log_prob(x)
    assert log_p[0] == -torch.inf and log_p[2] == -torch.inf  # was 71.0 (torch's Sigmoid inverse clamps)
    u = torch.logit(x[1])
    manual = HEAVY_BASE.log_prob(u) - (x[1].log() + (-x[1]).log1p()).sum()
    assert torch.allclose(log_p[1], manual)
    assert heavy().support.check(x).tolist() == [False, True, False]
    assert heavy.support.check(torch.rand(4, 3, 2)).shape == (4, 3)


def test_minus_inf_outside_keeps_batches_and_finite_gradients() -> None:
    heavy = _heavy()
    x = torch.rand(3, 4, 2)
    x[1, 2, 0] = 1.5
    x.requires_grad_(True)
    log_p = heavy.log_prob(x)
    assert log_p.shape == (3, 4) and log_p[1, 2] == -torch.inf and torch.isfinite(log_p[0]).all()
    log_p[torch.isfinite(log_p)].sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[1, 2] == 0).all()
    assert heavy.log_prob(torch.empty(0, 2)).shape == (0,)  # torch's Independent(StudentT) crashed on it
    assert heavy.log_prob(torch.empty(3, 0, 2)).shape == (3, 0)


def test_maximum_likelihood_refuses_training_data_outside_the_support() -> None:
    from flows.train import MaximumLikelihood

    heavy = _heavy()
    assert torch.isfinite(MaximumLikelihood()(heavy, (torch.rand(4, 2),)))
    with pytest.raises(ValueError, match=r"MaximumLikelihood: expected data inside the model's support .* row 2"):
        MaximumLikelihood()(heavy, (torch.tensor([[0.5, 0.5], [0.2, 0.3], [1.5, 0.5]]),))


def test_the_layer_itself_refuses_inputs_outside_its_domain() -> None:
    layer = flows.TorchTransform(T.SigmoidTransform().inv, 2)
    with pytest.raises(ValueError, match=r"expected inputs in its .*Interval.*batch index \(1,\)"):
        layer(torch.tensor([[0.5, 0.5], [-0.3, 0.5]]))
    sigmoid = flows.TorchTransform(T.SigmoidTransform(), 2)  # R -> (0, 1): the inverse checks its latent input
    with pytest.raises(ValueError, match=r"expected latent inputs in its"):
        sigmoid.inverse(torch.tensor([[2.0, 0.5]]))


def test_domains_compose_from_the_data_side() -> None:
    logit = flows.Logit(3, alpha=0.05)
    a = 0.05 / 0.9
    assert logit.domain.check(torch.tensor([[-a / 2, 0.5, 1 + a / 2], [-2 * a, 0.5, 0.5]])).tolist() == [True, False]
    assert flows.Sigmoid(3).codomain.check(torch.tensor([[0.1, 0.2, 1.1]])).tolist() == [False]
    assert flows.Sigmoid(3).inv.domain.check(torch.tensor([[0.1, 0.2, 0.3]])).tolist() == [True]
    chain = flows.Chain(flows.Logit(3), flows.Affine(3))
    assert chain.domain.check(torch.tensor([[0.5, 0.5, 1.5]])).tolist() == [False]
    assert flows.Chain(flows.Affine(3), flows.Sigmoid(3)).domain.check(torch.full((1, 3), 9.0)).tolist() == [True]
    flow = flows.RealNVP(4, transforms=2, hidden=(8,))
    assert flow.support.check(torch.full((2, 4), 1e6)).tolist() == [True, True]
    bounded = flows.Flow(flows.Chain(flows.Logit(4), flow.transform), flows.StandardNormal(4))
    log_p = bounded().log_prob(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, -0.5, 0.5]]))
    assert torch.isfinite(log_p[0]) and log_p[1] == -torch.inf


def test_glow_declares_its_logit_data_range() -> None:
    glow = flows.Glow((1, 4, 4), scales=1, steps=1, hidden=(4, 4))
    support = glow().support
    assert support.event_dim == 3
    inside, outside = torch.rand(2, 1, 4, 4), torch.rand(1, 1, 4, 4) + 1.0
    assert support.check(inside).tolist() == [True, True] and support.check(outside).tolist() == [False]


# -- 2, 3. parameters that live elsewhere, Pyro TransformModules ---------------------------------


def _fit(flow: nn.Module, x: torch.Tensor, steps: int = 30) -> tuple[float, float]:
    optimizer = torch.optim.Adam(flow.parameters(), lr=0.02)
    before = -flow.log_prob(x).mean().item()
    for _ in range(steps):
        optimizer.zero_grad()
        (-flow.log_prob(x).mean()).backward()
        optimizer.step()
    return before, -flow.log_prob(x).mean().item()


def test_a_zuko_transform_is_adopted_trains_and_is_saved() -> None:
    torch.manual_seed(0)
    z = zuko.flows.MAF(2, transforms=1, hidden_features=(8,))
    flow = flows.Flow(flows.TorchTransform(z.transform(), 2), flows.StandardNormal(2))
    assert {id(p) for p in flow.parameters()} == {id(p) for p in z.parameters()}  # was: 0 of 4
    x = torch.randn(256, 2) * torch.tensor([2.0, 0.5]) + 1.0
    assert torch.allclose(flow.log_prob(x), z().log_prob(x), atol=1e-5)
    before, after = _fit(flow, x)
    assert after < before - 0.2
    assert torch.allclose(flow.log_prob(x), z().log_prob(x), atol=1e-5)  # zuko's own flow trained with it
    state = flow.state_dict()
    assert sum(v.numel() for v in state.values()) >= sum(p.numel() for p in z.parameters())
    twin = copy.deepcopy(flow)
    twin.load_state_dict(state)
    assert torch.allclose(twin.log_prob(x), flow.log_prob(x))


def test_a_pyro_transform_module_is_accepted_and_its_parameters_train() -> None:
    torch.manual_seed(0)
    pyro_layer = pyro_transforms.affine_autoregressive(2, hidden_dims=[8])
    layer = flows.TorchTransform(pyro_layer, 2)  # was: "with_cache is not implemented"
    flow = flows.Flow(layer, flows.StandardNormal(2))
    assert {id(p) for p in flow.parameters()} == {id(p) for p in pyro_layer.parameters()} != set()
    x = torch.randn(64, 2) * 2.0
    base = pdist.Normal(torch.zeros(2), torch.ones(2)).to_event(1)
    assert torch.allclose(
        flow.log_prob(x), pdist.TransformedDistribution(base, [pyro_layer.inv]).log_prob(x), atol=1e-5
    )
    before, after = _fit(flow, x)
    assert after < before - 0.2
    assert flow.sample((3,)).shape == (3, 2)
    assert len(list(flows.TorchTransform(pyro_transforms.Spline(2), 2).parameters())) == 4
    conditional = pyro_transforms.conditional_affine_autoregressive(2, 3, hidden_dims=[8])
    fixed = flows.TorchTransform(conditional.condition(torch.randn(3)), 2)  # its network sits in a partial
    assert {id(p) for p in fixed.parameters()} == {id(p) for p in conditional.parameters()}


def test_a_transform_with_an_nn_parameter_keeps_it_trainable() -> None:
    loc = nn.Parameter(torch.zeros(2))
    layer = flows.TorchTransform(T.AffineTransform(loc, torch.ones(2)), 2)
    assert [p for p in layer.parameters()] == [loc]
    layer(torch.randn(3, 2)).sum().backward()
    assert loc.grad is not None and torch.allclose(loc.grad, torch.full((2,), 3.0))


def test_tensors_computed_from_parameters_elsewhere_are_refused() -> None:
    p = nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match=r"computed from trainable tensors .* would be frozen"):
        flows.TorchTransform(T.AffineTransform(torch.zeros(2), p * 2), 2)

    class Closure(T.Transform):  # computes with a parameter no attribute holds
        bijective = True
        domain = codomain = constraints.real

        def __init__(self):
            super().__init__()
            hidden = nn.Parameter(torch.zeros(()))
            self._shift = lambda x: x + hidden

        def _call(self, x):
            return self._shift(x)

        def _inverse(self, y):
            return y - self._shift(torch.zeros_like(y))

        def log_abs_det_jacobian(self, x, y):
            return torch.zeros_like(x)

    with pytest.raises(ValueError, match=r"computes with 1 trainable tensor\(s\) held elsewhere"):
        flows.TorchTransform(Closure(), 2)


def test_a_base_with_an_nn_parameter_keeps_it_trainable_or_is_refused() -> None:
    loc, scale = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.ones(()))
    flow = flows.Flow(flows.Affine(2), td.Normal(loc, scale))  # stored as broadcast views of the parameters
    names = dict(flow.named_parameters())
    assert names["base.loc"] is loc and names["base.scale"] is scale  # was: fixed buffers
    flow.log_prob(torch.randn(5, 2)).sum().backward()
    assert loc.grad is not None and scale.grad is not None
    logits = nn.Parameter(torch.zeros(3))
    with pytest.raises(TypeError, match=r"loc computed from trainable tensors"):
        flows.Flow(flows.Affine(2), td.Normal(loc * 2, 1.0))
    mixture = td.MixtureSameFamily(td.Categorical(logits=logits), td.Independent(td.Normal(torch.zeros(3, 1), 1.0), 1))
    with pytest.raises(TypeError, match=r"Categorical.logits, computed from trainable tensors"):  # normalised logits
        flows.Flow(flows.Affine(1), mixture)


# -- 4. a layer as a torch transform ------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: flows.MAF(3, transforms=2, hidden=(8,)),
        lambda: flows.NSF(3, transforms=1, hidden=(8,)),
        lambda: flows.RealNVP(3, transforms=2, hidden=(8,)),
    ],
    ids=["MAF", "NSF", "RealNVP"],
)
def test_a_flows_transform_in_torch_and_pyro_transformed_distributions(make) -> None:
    torch.manual_seed(0)
    flow = flows.testing.perturb_parameters(make())
    base = td.Independent(td.Normal(torch.zeros(3), torch.ones(3)), 1)
    t = flow.transform.as_torch_transform()
    assert t.bijective and t.domain.event_dim == 1 and t.codomain.event_dim == 1
    x = torch.randn(4, 5, 3)
    for d in (td.TransformedDistribution(base, t.inv), pdist.TransformedDistribution(base, [t.inv])):
        assert d.event_shape == (3,)
        assert torch.allclose(d.log_prob(x), flow.log_prob(x), atol=1e-5)
        y = d.rsample((6,))
        assert y.shape == (6, 3) and torch.allclose(d.log_prob(y), flow.log_prob(y), atol=1e-4)
    assert torch.allclose(t.log_abs_det_jacobian(x, t(x)), flow.transform.forward_and_log_det(x)[1])
    assert torch.allclose(t.inv(t(x)), x, atol=1e-5)


def test_the_torch_transform_caches_one_fused_pass_and_follows_parameter_updates() -> None:
    layer = flows.Affine(2)
    t = layer.as_torch_transform()
    calls = []
    layer.register_forward_pre_hook(lambda *_: calls.append(1))
    x = torch.randn(4, 2)
    z = t(x)
    t.log_abs_det_jacobian(x, z)  # the pair just computed: the fused log-det, no second pass
    assert t.log_abs_det_jacobian(x, z) is t._memo[2]
    with torch.no_grad():
        layer.params[..., 1] += 1.0  # log-scale + 1
    assert torch.allclose(t.log_abs_det_jacobian(x, t(x)), torch.full((4,), 2.0))  # cache_size 0: recomputed
    cached = layer.as_torch_transform(cache_size=1)
    assert cached.inv(cached(x)) is x and cached.with_cache(0)._cache_size == 0
    with pytest.raises(ValueError, match=r"cache_size 0 or 1"):
        layer.as_torch_transform(cache_size=2)


def test_domains_and_contexts_carry_over_to_the_torch_transform() -> None:
    heavy = _heavy()
    t = heavy.transform.as_torch_transform()
    assert t.domain.check(torch.tensor([[0.5, 1.5]])).tolist() == [False]
    d = td.TransformedDistribution(HEAVY_BASE, t.inv)
    assert isinstance(d.support, constraints.independent) and torch.allclose(
        d.log_prob(torch.tensor([0.3, 0.6])), heavy.log_prob(torch.tensor([0.3, 0.6]))
    )
    flow = flows.MAF(2, context=3, transforms=1, hidden=(8,))
    c = torch.randn(4, 3)
    conditional = td.TransformedDistribution(HEAVY_BASE, flow.transform.as_torch_transform(c).inv)
    x = torch.randn(5, 4, 2)
    expected = (
        HEAVY_BASE.log_prob(flow.transform(x, c.expand(5, 4, 3)))
        + flow.transform.forward_and_log_det(x, c.expand(5, 4, 3))[1]
    )
    assert torch.allclose(conditional.log_prob(x), expected, atol=1e-5)
    squeeze = flows.Squeeze(1).as_torch_transform()
    assert squeeze.forward_shape((7, 1, 4, 4)) == (7, 4, 2, 2) and squeeze.inverse_shape((4, 2, 2)) == (1, 4, 4)


# -- 6. bases -----------------------------------------------------------------------------------


def test_a_mixture_a_transformed_distribution_and_a_flow_are_bases() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 2)
    mixture = td.MixtureSameFamily(
        td.Categorical(torch.tensor([0.3, 0.7])), td.Independent(td.Normal(torch.randn(2, 2), torch.ones(2, 2)), 1)
    )
    transformed = td.TransformedDistribution(HEAVY_BASE, [T.AffineTransform(torch.ones(2), 2.0)])
    inner = flows.MAF(2, transforms=1, hidden=(8,))
    for base in (mixture, transformed, inner()):
        flow = flows.Flow(flows.Affine(2, shift=0.5), base)
        z, ladj = flow.transform.forward_and_log_det(x)
        assert torch.allclose(flow.log_prob(x), base.log_prob(z) + ladj, atol=1e-6)
        assert flow.sample((3,)).shape == (3, 2)
        twin = copy.deepcopy(flow).double()
        assert torch.allclose(twin.log_prob(x.double()).float(), flow.log_prob(x), atol=1e-4)
    held = flows.TorchDistribution(mixture)  # held bases validate nothing: NaN stays NaN, as for rebuilt ones
    assert torch.isnan(held.log_prob(torch.tensor([[float("nan"), 0.0]]))).all()
    flow = flows.Flow(flows.Affine(2), inner())
    assert {id(p) for p in inner.parameters()} <= {id(p) for p in flow.parameters()}  # the inner flow trains too
    with pytest.raises(TypeError, match=r"real support.*NormalizingFlow with support None"):  # zuko's declares none
        flows.Flow(flows.Affine(2), zuko.flows.MAF(2, transforms=1)())
    with pytest.raises(TypeError, match=r"real support"):  # a bounded flow is no base on R^2
        flows.Flow(flows.Affine(2), _heavy()())
