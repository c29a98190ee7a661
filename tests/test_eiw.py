"""Oracles for our EIW shuffle: negentropy, the entropy-informed permutation, the weighting, the regulariser."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows.bijections.auxiliary import AuxiliaryLosses
from flows.bijections.eiw import GAUSSIAN_LOGCOSH, negentropy
from flows.testing import autograd_log_det, check_bijection, perturb_parameters
from tests.registry.cases_image import _mixed_channels


def _channels(*samples: torch.Tensor) -> torch.Tensor:
    """Stack 1-D samples as the channels of a batch of 1×1 images: ``(N, C, 1, 1)``."""
    return torch.stack(samples, dim=1)[..., None, None]


def test_gaussian_logcosh_constant() -> None:
    g = torch.Generator().manual_seed(0)
    nu = torch.randn(2_000_000, generator=g, dtype=torch.float64)
    assert abs(float(torch.log(torch.cosh(nu)).mean()) - GAUSSIAN_LOGCOSH) < 2e-3


def test_negentropy_is_zero_for_gaussians_and_invariant_to_scale() -> None:
    g = torch.Generator().manual_seed(0)
    n = 20000
    gauss, uniform = torch.randn(n, generator=g), torch.rand(n, generator=g)
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((n,))
    j = negentropy(_channels(gauss, uniform, laplace))
    assert j[0] < 1e-5 and j[1] > 1e-4 and j[2] > 1e-4
    moved = _channels(3 * gauss + 1, 0.1 * uniform - 4, 7 * laplace)
    torch.testing.assert_close(negentropy(moved), j, rtol=1e-3, atol=1e-6)


def test_permutation_puts_the_most_gaussian_channels_last() -> None:
    g = torch.Generator().manual_seed(0)
    n = 4096
    gauss, uniform = torch.randn(n, generator=g), torch.rand(n, generator=g)
    t = flows.EntropyPermutation(3, split=1)
    x = _channels(gauss, uniform, gauss.sign() * gauss.square())
    z = t(x)
    assert t.permutation.tolist() == [1, 2, 0]  # the Gaussian channel goes last (it is split off)
    assert torch.equal(z[:, -1], x[:, 0])
    assert t.steps.item() == 1
    t2 = flows.EntropyPermutation(3)  # default split: 3 - 3 // 2 = 2 channels last, each group in index order
    t2(x)
    assert t2.permutation.tolist() == [2, 0, 1]


def test_hysteresis_keeps_the_split_group_until_another_is_clearly_better() -> None:
    t = flows.EntropyPermutation(2, split=1, margin=0.5, momentum=1e-12)  # the batch barely moves the estimates
    t.steps.fill_(1)
    x = torch.randn(16, 2, 2, 2)
    t.running_negentropy.copy_(torch.tensor([0.010, 0.011]))
    t(x)
    assert t.permutation.tolist() == [0, 1]  # channel 0 scores better, but not by the margin
    t.running_negentropy.copy_(torch.tensor([0.004, 0.011]))
    t(x)
    assert t.permutation.tolist() == [1, 0]  # now it clearly does: swap
    t.running_negentropy.copy_(torch.tensor([0.004, 0.003]))
    t(x)
    assert t.permutation.tolist() == [1, 0]  # and no swap back for a small difference
    t.margin = 0.0
    t(x)
    assert t.permutation.tolist() == [0, 1]  # without hysteresis, always the best group


def test_buffers_are_updated_in_train_mode_only_and_saved() -> None:
    t = flows.EntropyPermutation(4)
    x = _mixed_channels((64, 4, 3, 3), torch.Generator().manual_seed(1)).float()
    t.eval()
    t(x)
    assert t.steps.item() == 0 and not t.running_negentropy.any()  # eval: frozen
    t.train()
    t(x)
    first = t.running_negentropy.clone()
    torch.testing.assert_close(first, negentropy(x))  # first pass: taken as it is
    t(2 * x[:32] + 1)
    torch.testing.assert_close(t.running_negentropy, 0.95 * first + 0.05 * negentropy(x[:32]))
    state = t.state_dict()
    assert {"permutation", "inverse_permutation", "running_negentropy", "steps"} <= set(state)
    fresh = flows.EntropyPermutation(4)
    fresh.load_state_dict(state)
    fresh.eval()
    assert torch.equal(fresh(x), t.eval()(x))


def test_inverse_uses_the_stored_permutation_and_updates_nothing() -> None:
    t = flows.EntropyPermutation(4)
    x = _mixed_channels((32, 4, 2, 2), torch.Generator().manual_seed(2)).float()
    z = t(x)  # train mode: updates, then permutes
    before = {k: v.clone() for k, v in t.state_dict().items()}
    assert torch.equal(t.inverse(z), x)  # exact: a permutation read from the buffers
    assert all(torch.equal(v, t.state_dict()[k]) for k, v in before.items())
    assert not torch.equal(t.permutation, torch.arange(4))  # the mixed channels are reordered


def test_update_steps_freezes_the_order() -> None:
    t = flows.EntropyPermutation(4, update_steps=2)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        t(_mixed_channels((16, 4, 2, 2), gen).float())
    assert t.steps.item() == 2
    frozen = t.permutation.clone()
    t(torch.randn(16, 4, 2, 2))
    assert torch.equal(t.permutation, frozen)


def test_permutation_only_layer_has_zero_log_det_and_a_permutation_jacobian() -> None:
    t = flows.EntropyPermutation(4).double()
    x = _mixed_channels((1, 4, 2, 2), torch.Generator().manual_seed(4))
    t(_mixed_channels((64, 4, 2, 2), torch.Generator().manual_seed(5)))  # estimate an order
    t.eval()
    _, ladj = t.forward_and_log_det(x)
    assert torch.equal(ladj, torch.zeros(1, dtype=torch.float64))
    jac = torch.autograd.functional.jacobian(lambda v: t(v).reshape(-1), x).reshape(16, 16)
    assert torch.equal(jac.sum(0), torch.ones(16, dtype=torch.float64))
    assert torch.equal(jac.sum(1), torch.ones(16, dtype=torch.float64))
    assert set(jac.unique().tolist()) == {0.0, 1.0}


def _prepared_shuffle(channels: int = 4, context: int = 0, seed: int = 0) -> flows.EIWShuffle:
    torch.manual_seed(seed)
    t = perturb_parameters(flows.EIWShuffle(channels, context, hidden=(8,)).double(), 0.5)
    gen = torch.Generator().manual_seed(seed + 1)
    c = torch.randn(64, context, generator=gen, dtype=torch.float64) if context else None
    t(_mixed_channels((64, channels, 3, 3), gen), c)  # estimate an order
    return t


def test_eiw_log_det_is_hw_times_the_sum_of_log_weights() -> None:
    t = _prepared_shuffle().eval()
    x = _mixed_channels((3, 4, 3, 3), torch.Generator().manual_seed(7))
    first = t.transforms[0]
    y, ladj_b = first.forward_and_log_det(x)
    log_w_b = first.conditioner(x[:, :2])[:, 2:, 0, 0]  # raw (shifts, log-weights) of channels 2, 3
    assert not first.conditioner(x[:, :2])[:, :2].any()  # the shifts are zero: a pure weighting
    log_w_b = 2.0 * torch.tanh(log_w_b / 2.0)  # the clamp
    torch.testing.assert_close(y[:, 2:], x[:, 2:] * log_w_b.exp()[..., None, None])
    torch.testing.assert_close(ladj_b, 9 * log_w_b.sum(-1))
    _, ladj = t.forward_and_log_det(x)
    want, coupling = autograd_log_det(t, x, 3)
    torch.testing.assert_close(ladj, want)
    assert coupling == 0
    assert ladj.abs().min() > 0.01  # the weights are not trivially 1


def test_eiw_batch_independence_and_round_trip() -> None:
    t = _prepared_shuffle(5, context=2).eval()
    gen = torch.Generator().manual_seed(8)
    x = _mixed_channels((6, 5, 4, 3), gen)
    c = torch.randn(6, 2, generator=gen, dtype=torch.float64)
    z, ladj = t.forward_and_log_det(x, c)
    for i in range(6):
        zi, li = t.forward_and_log_det(x[i : i + 1], c[i : i + 1])
        torch.testing.assert_close(zi, z[i : i + 1], atol=1e-12, rtol=0)
        torch.testing.assert_close(li, ladj[i : i + 1], atol=1e-12, rtol=0)
    check_bijection(t, x, c)
    t.train()  # in train mode the forward re-estimates the order first; the inverse uses it
    z = t(x, c)
    torch.testing.assert_close(t.inverse(z, c), x, atol=1e-12, rtol=0)


def test_eiw_regulariser_is_the_weighted_negentropy_of_the_split_off_channels() -> None:
    t = _prepared_shuffle()
    t.regularization = 0.5
    x = _mixed_channels((32, 4, 3, 3), torch.Generator().manual_seed(9))
    with AuxiliaryLosses() as aux:
        z = t(x)
    (name, value), *_ = aux.terms
    assert name == "eiw_negentropy" and len(aux) == 1
    torch.testing.assert_close(value, 0.5 * negentropy(z[:, 2:]).sum())
    value.backward()  # it reaches the weight networks
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in t.parameters())
    t.eval()
    with AuxiliaryLosses() as aux:
        t(x)
    assert len(aux) == 0  # eval mode: no regulariser
    t.train()
    t.regularization = 0.0
    with AuxiliaryLosses() as aux:
        t(x)
    assert len(aux) == 0


def test_eiw_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="expected channels to be an int >= 2"):
        flows.EIWShuffle(1)
    with pytest.raises(ValueError, match=r"expected split in 0\.\.4"):
        flows.EIWShuffle(4, split=5)
    with pytest.raises(ValueError, match="expected regularization >= 0"):
        flows.EIWShuffle(4, regularization=-1.0)
    with pytest.raises(ValueError, match="expected 0 < momentum <= 1"):
        flows.EntropyPermutation(4, momentum=0.0)
    with pytest.raises(ValueError, match="expected update_steps >= 0 or None"):
        flows.EntropyPermutation(4, update_steps=-1)
    with pytest.raises(ValueError, match="expected 0 <= margin < 1"):
        flows.EntropyPermutation(4, margin=1.0)
    with pytest.raises(ValueError, match=r"^EntropyPermutation: expected split in 0\.\.4, got -1"):
        flows.EntropyPermutation(4, split=-1)
    with pytest.raises(ValueError, match=r"^EIWShuffle: expected split in 0\.\.3, got 1.5"):
        flows.EIWShuffle(3, split=1.5)
    # the default split is what Split factors out by default, C - C // 2, in both layers
    shuffle = flows.EIWShuffle(5)
    assert (shuffle.split, shuffle.entropy_permutation.split, flows.EntropyPermutation(5).split) == (3, 3, 3)
    assert math.isclose(flows.EIWShuffle(4).regularization, 0.01)
