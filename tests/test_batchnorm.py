"""BatchNorm as a bijection (the evaluation pitfalls of docs/tabular.md), and the vector ActNorm checks."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows import MAF, ActNorm, BatchNorm, InverseNotAvailable
from flows.testing import check_bijection


def _trained_batch_norm(seed: int = 0) -> BatchNorm:
    torch.manual_seed(seed)
    t = BatchNorm(3).double()
    with torch.no_grad():
        t.log_gamma.copy_(torch.tensor([0.3, -0.2, 0.1]))
        t.beta.copy_(torch.tensor([1.0, 0.0, -0.5]))
        for _ in range(5):
            t(2 + 3 * torch.randn(64, 3, dtype=torch.float64))
    return t


def test_train_mode_uses_batch_statistics_and_updates_running_averages() -> None:
    t = BatchNorm(2, momentum=0.25).double()
    assert torch.equal(t.running_var, torch.ones(2, dtype=torch.float64))  # not zeros (nflows' pitfall)
    x = torch.tensor([[1.0, 10.0], [3.0, 20.0], [5.0, 60.0]], dtype=torch.float64)
    z, ladj = t.forward_and_log_det(x)
    mean, var = x.mean(0), x.var(0, unbiased=False)
    torch.testing.assert_close(z, (x - mean) / torch.sqrt(var + t.eps))
    torch.testing.assert_close(ladj, (-0.5 * torch.log(var + t.eps)).sum().expand(3))
    torch.testing.assert_close(t.running_mean, 0.25 * mean)
    torch.testing.assert_close(t.running_var, 0.75 + 0.25 * x.var(0, unbiased=True))


def test_eval_log_prob_is_per_sample_and_leaves_running_statistics_alone() -> None:
    torch.manual_seed(0)
    flow = MAF(3, transforms=3, hidden=(16,), batch_norm=True).double()
    with torch.no_grad():
        for _ in range(3):
            flow.log_prob(1 + 2 * torch.randn(128, 3, dtype=torch.float64))  # train mode: moves running stats
    norms = [m for m in flow.modules() if isinstance(m, BatchNorm)]
    assert len(norms) == 2
    saved = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    x = torch.randn(256, 3, dtype=torch.float64)
    with flows.evaluating(flow), torch.no_grad():
        batch = flow.log_prob(x)
        single = torch.cat([flow.log_prob(x[i : i + 1]) for i in range(256)])
        halves = torch.cat([flow.log_prob(x[:100]), flow.log_prob(x[100:])])
    torch.testing.assert_close(single, batch, atol=1e-12, rtol=0)
    torch.testing.assert_close(halves, batch, atol=1e-12, rtol=0)
    for m, (mean, var) in zip(norms, saved, strict=True):
        assert torch.equal(m.running_mean, mean) and torch.equal(m.running_var, var)
    assert flow.training and all(m.training for m in norms)  # evaluating() restored the modes


def test_train_mode_scoring_depends_on_the_batch() -> None:
    """The pitfall the evaluation helpers avoid: in train mode a score depends on its batch companions."""
    t = _trained_batch_norm()
    x = torch.randn(8, 3, dtype=torch.float64)
    z_all = t(x)
    z_half = t(x[:4])
    assert not torch.allclose(z_all[:4], z_half)


def test_inverse_only_in_eval_mode() -> None:
    t = _trained_batch_norm()
    with pytest.raises(InverseNotAvailable, match=r"BatchNorm: the inverse is only available in eval mode"):
        t.inverse(torch.zeros(2, 3, dtype=torch.float64))
    t.eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    check_bijection(t, x)
    z, ladj = t.forward_and_log_det(x)
    expected = t.log_gamma - 0.5 * torch.log(t.running_var + t.eps)
    torch.testing.assert_close(ladj, expected.sum().expand(5))
    torch.testing.assert_close(z, (x - t.running_mean) * expected.exp() + t.beta)


def test_sampling_a_flow_with_batch_norm_needs_eval_mode() -> None:
    flow = MAF(3, transforms=2, hidden=(8,), batch_norm=True)
    with pytest.raises(InverseNotAvailable, match="eval mode"):
        flow.sample((4,))
    with flows.evaluating(flow):
        assert flow.sample((4,)).shape == (4, 3)


def test_untrained_model_evaluates_to_a_sane_density() -> None:
    t = BatchNorm(4).double().eval()
    _, ladj = t.forward_and_log_det(torch.randn(3, 4, dtype=torch.float64))
    torch.testing.assert_close(ladj, torch.full((3,), -2 * math.log1p(t.eps), dtype=torch.float64))


def test_state_dict_carries_running_statistics() -> None:
    t = _trained_batch_norm()
    assert {"running_mean", "running_var", "log_gamma", "beta"} <= set(t.state_dict())
    fresh = BatchNorm(3).double()
    fresh.load_state_dict(t.state_dict())
    t.eval()
    fresh.eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(t(x), fresh(x))


def test_batch_norm_errors() -> None:
    t = BatchNorm(3)
    with pytest.raises(ValueError, match=r"BatchNorm: expected at least 2 samples in train mode"):
        t(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"BatchNorm: expected 0 <= momentum <= 1, got 2"):
        BatchNorm(3, momentum=2.0)
    with pytest.raises(ValueError, match=r"BatchNorm: expected eps > 0"):
        BatchNorm(3, eps=0.0)
    with pytest.raises(ValueError, match=r"BatchNorm: expected a vector event"):
        BatchNorm((3, 4))
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 3\)"):
        t(torch.zeros(5, 4))


def test_vector_actnorm_initialises_from_the_first_training_batch_only() -> None:
    torch.manual_seed(0)
    t = ActNorm(3)
    t.eval()
    t(torch.randn(4, 3))
    assert not bool(t.initialized)  # evaluation never triggers the data-dependent initialisation
    t.train()
    x = torch.tensor([5.0, -1.0, 0.0]) + torch.tensor([3.0, 0.5, 2.0]) * torch.randn(256, 3)
    z = t(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(3), atol=1e-5, rtol=0)
    assert "initialized" in t.state_dict() and "initialized" in dict(t.named_buffers())
    state = {k: v.clone() for k, v in t.state_dict().items()}
    t(10 + torch.randn(8, 3))
    assert all(torch.equal(v, t.state_dict()[k]) for k, v in state.items())
