"""The Glow builder: exact density bookkeeping, Glow's conditional split prior, sampling, options and errors."""

from __future__ import annotations

import copy

import pytest
import torch

import flows
import flows.data
import flows.metrics
from flows.bijections.auxiliary import AuxiliaryLosses
from flows.testing import perturb_parameters


def _trained_like(seed: int = 0, **options) -> flows.Glow:
    """A float64 Glow on 8×8 images with ActNorm initialised and parameters away from the identity."""
    torch.manual_seed(seed)
    options = {"scales": 2, "steps": 2, "hidden": (8, 8), **options}
    context = options.pop("context", 0)
    g = flows.Glow((1, 8, 8), context, **options).double()
    c = torch.randn(32, context, dtype=torch.float64) if context else None
    g.log_prob(torch.rand(32, 1, 8, 8, dtype=torch.float64), c)  # train mode: data-dependent init
    return perturb_parameters(g, 0.05).eval()


@pytest.mark.parametrize("options", [{}, {"split": "eiw", "mixer": "lu"}, {"coupling": "additive", "scales": 1}])
def test_sample_and_log_prob_agree_with_log_prob(options: dict) -> None:
    g = _trained_like(**options)
    x, log_p = g.sample_and_log_prob((5,))
    assert x.shape == (5, 1, 8, 8) and log_p.shape == (5,)
    torch.testing.assert_close(g.log_prob(x), log_p, atol=1e-8, rtol=1e-10)
    assert g.transform.event_shape_out == (64,)


def test_the_split_prior_is_glows_conditional_gaussian() -> None:
    """log p(x) = [log-dets up to the split] + log N(z_o; μ(h_k), σ(h_k)) + [inner level's log-density]."""
    g = _trained_like(scales=2, steps=1)
    logit, level = g.transform
    pre, prior, split = flows.Chain(logit, *level[:-2]), level[-2], level[-1]
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    h, ladj_pre = pre.forward_and_log_det(x)
    keep = split.keep
    h_k, z_o = h[:, :keep], h[:, keep:]
    raw = prior.conditioner(h_k).unflatten(1, (2, h.shape[1] - keep))  # Coupling's layout: shifts, log-scales
    shift, log_scale = raw[:, 0], 3.0 * torch.tanh(raw[:, 1] / 3.0)  # ε = z_o e^s + t
    mu, sigma = -shift * torch.exp(-log_scale), torch.exp(-log_scale)
    log_prior = torch.distributions.Normal(mu, sigma).log_prob(z_o).sum((1, 2, 3))
    z_inner, ladj_inner = split.transform.forward_and_log_det(h_k)
    log_inner = torch.distributions.Normal(0.0, 1.0).log_prob(z_inner).sum(-1)
    torch.testing.assert_close(g.log_prob(x), ladj_pre + log_prior + ladj_inner + log_inner)
    assert log_scale.abs().max() > 1e-3  # the prior is not the standard normal here


def test_temperature_scales_the_base_sample() -> None:
    g = _trained_like()
    torch.manual_seed(5)
    x = g.sample((3,), temperature=0.5)
    torch.manual_seed(5)
    z = g.base.sample((3,))
    torch.testing.assert_close(x, g.transform.inverse(0.5 * z))
    torch.manual_seed(5)
    torch.testing.assert_close(g.sample((3,), temperature=1.0), g.transform.inverse(z))
    for bad in (0.0, -1.0, float("inf"), float("nan")):  # inf gave NaN images
        with pytest.raises(ValueError, match="Glow: expected temperature to be a finite number > 0"):
            g.sample((3,), temperature=bad)
    with pytest.raises(TypeError, match="Glow: expected temperature to be a real number, got str"):
        g.sample((3,), temperature="0.7")


def test_class_conditional_glow() -> None:
    g = _trained_like(context=3)
    c = torch.eye(3, dtype=torch.float64)
    x, log_p = g.sample_and_log_prob((2,), c)
    assert x.shape == (2, 3, 1, 8, 8)
    torch.testing.assert_close(g.log_prob(x, c.expand(2, 3, 3)), log_p, atol=1e-8, rtol=1e-10)
    assert not torch.allclose(g.log_prob(x[0], c), g.log_prob(x[0], c.roll(1, 0)))  # the context matters
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 3\)"):
        g.log_prob(x[0])


def test_eiw_glow_hands_its_regulariser_to_the_trainer_and_eval_changes_nothing() -> None:
    g = _trained_like(split="eiw", scales=3, steps=1, hidden=(4, 4), logit_alpha=None)
    shuffles = [m for m in g.modules() if isinstance(m, flows.EIWShuffle)]
    assert len(shuffles) == 2 and [s.split for s in shuffles] == [2, 4]
    x = torch.randn(16, 1, 8, 8, dtype=torch.float64)
    state = copy.deepcopy(g.state_dict())
    with flows.evaluating(g), AuxiliaryLosses() as aux:
        g.log_prob(x)
    assert len(aux) == 0 and all(torch.equal(v, g.state_dict()[k]) for k, v in state.items())
    g.train()
    with AuxiliaryLosses() as aux:
        g.log_prob(x)
    assert list(aux.by_name()) == ["eiw_negentropy"] and len(aux) == 2
    assert all(s.entropy_permutation.steps.item() > 0 for s in shuffles)


def test_state_dict_restores_actnorm_and_eiw_buffers() -> None:
    g = _trained_like(split="eiw")
    fresh = flows.Glow((1, 8, 8), scales=2, steps=2, hidden=(8, 8), split="eiw").double()
    fresh.load_state_dict(g.state_dict())
    fresh.eval()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(fresh.log_prob(x), g.log_prob(x), atol=0, rtol=0)


def test_bits_per_dim_of_an_untrained_glow_is_close_to_the_uniform_density() -> None:
    """At initialisation every coupling and prior is the identity: only the logit, ActNorm and the base count."""
    g = flows.Glow((1, 8, 8), scales=2, steps=1, hidden=(4, 4), logit_alpha=0.05)
    v = torch.randint(0, 17, (256, 1, 8, 8))
    x = flows.data.uniform_dequantize(v, 17)
    with flows.evaluating(g), torch.no_grad():
        log_p = g.log_prob(x)
    # logit of a uniform variable, standard normal base: a finite, known-order density (no NaN, no blow-up)
    bpd = flows.metrics.bits_per_dim(log_p, 64, 17).mean()
    assert torch.isfinite(log_p).all() and 1.0 < float(bpd) < 8.0


def test_glow_arguments_and_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match=r"expected height and width divisible by 2\*\*scales = 8, got 28×28"):
        flows.Glow((1, 28, 28), scales=3)
    with pytest.raises(ValueError, match="expected an image shape"):
        flows.Glow((28, 28))
    with pytest.raises(ValueError, match=r"expected mixer in \['1x1', 'lu', 'circulant'\], got 'dense'"):
        flows.Glow((1, 8, 8), mixer="dense")
    with pytest.raises(ValueError, match="expected split in"):
        flows.Glow((1, 8, 8), split="random")
    with pytest.raises(ValueError, match="expected coupling in"):
        flows.Glow((1, 8, 8), coupling="spline")
    with pytest.raises(ValueError, match="Glow: expected steps to be an int >= 1, got 0"):
        flows.Glow((1, 8, 8), steps=0)
    g = flows.Glow((1, 8, 8), scales=1, steps=1, hidden=(4, 4))
    with pytest.raises(ValueError, match=r"expected inputs in \[0, 1\] \(dequantized images\)"):
        g.log_prob(torch.full((2, 1, 8, 8), 255.0))
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 1, 8, 8\)"):
        g.log_prob(torch.rand(2, 1, 4, 4))
    assert "mixer='1x1'" in repr(g)


def test_logit_domain_is_the_interval_the_logit_maps_onto_the_line() -> None:
    """With alpha > 0 the logit maps (-a, 1 + a), a = alpha/(1 - 2 alpha), onto the line, so samples may leave
    [0, 1] slightly; log_prob scores the whole domain and rejects what is outside it."""
    g = _trained_like(logit_alpha=0.05)
    margin = 0.05 / 0.9
    inside = torch.rand(4, 1, 8, 8, dtype=torch.float64) * (1 + 1.9 * margin) - 0.95 * margin
    assert inside.min() < 0 and inside.max() > 1
    log_p = g.log_prob(inside)
    torch.testing.assert_close(g.log_prob(g.transform.inverse(g.transform(inside))), log_p)
    with pytest.raises(ValueError, match="got values in"):
        g.log_prob(torch.full((1, 1, 8, 8), -1.01 * margin, dtype=torch.float64))


def test_circulant_mixer() -> None:
    g = _trained_like(mixer="circulant", circulant_factors=3)
    mixers = [m for m in g.modules() if isinstance(m, flows.CirculantDiagonal2d)]
    assert len(mixers) == 4 and all(m.bias is None for m in mixers)
    x, log_p = g.sample_and_log_prob((3,))
    torch.testing.assert_close(g.log_prob(x), log_p, atol=1e-8, rtol=1e-10)
