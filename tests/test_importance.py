"""Importance-sampling metrics: Kish ESS, log Z with a calibrated standard error, reweighting, free energies."""

from __future__ import annotations

import math

import pytest
import torch

from flows.metrics import (
    free_energy_profile,
    kish_ess,
    log_importance_weights,
    log_z_estimate,
    reweighted_mean,
)


def _proposal_and_weights(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """q = N(0, 1.5²), target u(x) = ½((x − 0.5)/1.2)² + 3, so Z = 1.2·√(2π)·e^{−3}."""
    x = 1.5 * torch.randn(n, generator=generator, dtype=torch.float64)
    log_q = torch.distributions.Normal(0.0, 1.5).log_prob(x)
    energy = 0.5 * ((x - 0.5) / 1.2).square() + 3.0
    return x, log_importance_weights(energy, log_q)


LOG_Z = math.log(1.2 * math.sqrt(2 * math.pi)) - 3.0


def test_kish_ess_values() -> None:
    assert kish_ess(torch.zeros(7)).item() == pytest.approx(1.0)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    expected = w.sum() ** 2 / (4 * w.square().sum())
    assert kish_ess(w.log()).item() == pytest.approx(expected.item())
    # shift invariant and overflow-free in log space
    assert kish_ess(w.log() + 1000.0).item() == pytest.approx(expected.item())
    assert kish_ess(torch.tensor([0.0, -math.inf, -math.inf])).item() == pytest.approx(1 / 3)


def test_log_z_estimate_and_calibrated_standard_error() -> None:
    gen = torch.Generator().manual_seed(0)
    z_scores = []
    for _ in range(200):
        _, log_w = _proposal_and_weights(2000, gen)
        log_z, se = log_z_estimate(log_w)
        z_scores.append((log_z.item() - LOG_Z) / se.item())
    z = torch.tensor(z_scores)
    assert abs(z.mean().item()) < 0.3  # unbiased to well within the error bars
    assert 0.8 < z.std().item() < 1.2  # the standard error is calibrated
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        log_z_estimate(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="without NaN"):
        log_z_estimate(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="every weight is zero"):
        log_z_estimate(torch.full((3,), -math.inf))


def test_reweighted_mean_recovers_target_moments() -> None:
    x, log_w = _proposal_and_weights(200_000, torch.Generator().manual_seed(1))
    moments = reweighted_mean(torch.stack((x, (x - 0.5).square()), -1), log_w)
    assert moments.shape == (2,)
    assert abs(moments[0].item() - 0.5) < 0.02
    assert abs(moments[1].item() - 1.44) < 0.03
    with pytest.raises(ValueError, match="expected values of shape"):
        reweighted_mean(torch.zeros(5), torch.zeros(4))
    with pytest.raises(ValueError, match="same shape"):
        log_importance_weights(torch.zeros(3), torch.zeros(4))


def test_free_energy_profile_against_the_exact_one() -> None:
    x, log_w = _proposal_and_weights(200_000, torch.Generator().manual_seed(2))
    profile = free_energy_profile(x, log_w, bins=20, range=(-2.0, 3.0))
    exact = 0.5 * ((profile.centres - 0.5) / 1.2).square() + math.log(1.2 * math.sqrt(2 * math.pi))
    # bin averages differ from the centre values by O(width²·F''), well under 0.01 here
    z = (profile.free_energy - exact) / profile.stderr.clamp_min(1e-3)
    assert z.abs().max() < 5
    assert (profile.stderr < 0.05).all()
    # unweighted: the proposal's own profile
    plain = free_energy_profile(x, bins=20, range=(-2.0, 3.0))
    exact_q = 0.5 * (plain.centres / 1.5).square() + math.log(1.5 * math.sqrt(2 * math.pi))
    assert (plain.free_energy - exact_q).abs().max() < 0.05
    # empty bins are infinite, with infinite error bars; the density integrates to the mass in range
    sparse = free_energy_profile(torch.tensor([0.1, 0.2, 0.9]), bins=4, range=(0.0, 1.0))
    assert torch.isinf(sparse.free_energy[2]) and torch.isinf(sparse.stderr[2])
    assert (sparse.density * 0.25).sum().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="low < high"):
        free_energy_profile(x, range=(1.0, 1.0))
    with pytest.raises(ValueError, match="coordinate of shape"):
        free_energy_profile(x.reshape(-1, 2))
    with pytest.raises(ValueError, match=r"expected coordinate without (NaN|infinite) values"):
        free_energy_profile(torch.tensor([0.0, math.inf]))


def test_reweighted_mean_of_integer_values_keeps_the_weights() -> None:
    """Integer values are promoted, never the weights cast to int (which returned 0 where 2.5 is right)."""
    log_w = torch.tensor([0.0, math.log(3.0)])
    out = reweighted_mean(torch.tensor([1, 3]), log_w)
    assert out.is_floating_point() and out.item() == pytest.approx(2.5)
    assert reweighted_mean(torch.tensor([True, False]), log_w).item() == pytest.approx(0.25)


def test_reweighted_mean_leaves_out_values_of_zero_weight() -> None:
    log_w = torch.tensor([0.0, -math.inf, 0.0], dtype=torch.float64)
    for bad in (math.inf, -math.inf, math.nan):
        values = torch.tensor([[1.0, 2.0], [bad, bad], [3.0, 4.0]], dtype=torch.float64)
        assert reweighted_mean(values, log_w).tolist() == [2.0, 3.0]
    values = torch.tensor([1.0, math.nan, 3.0], dtype=torch.float64)  # NaN of positive weight: NaN
    assert torch.isnan(reweighted_mean(values, torch.zeros(3, dtype=torch.float64)))


def test_free_energy_profile_refuses_what_it_cannot_bin() -> None:
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    for bad in ((-math.inf, 1.0), (0.0, math.inf), (math.nan, 1.0)):
        with pytest.raises(ValueError, match="expected a finite range"):
            free_energy_profile(x, range=bad)
    with pytest.raises(ValueError, match=r"expected bins to be an int in \[1, 10000000\], got 1000000000000"):
        free_energy_profile(x, bins=10**12)
    with pytest.raises(TypeError, match=r"expected bins to be an int in \[1, 10000000\], got 2\.5"):
        free_energy_profile(x, bins=2.5)
    with pytest.raises(ValueError, match="expected non-empty coordinate"):
        free_energy_profile(x[:0])
    profile = free_energy_profile(torch.arange(4), bins=2)  # integer coordinates are promoted
    assert profile.density.tolist() == pytest.approx([1 / 3, 1 / 3])  # half the mass per bin of width 1.5


@pytest.mark.parametrize("function", [kish_ess, log_z_estimate])
def test_log_weight_functions_check_their_input(function) -> None:
    with pytest.raises(ValueError, match="expected non-empty log weights"):
        function(torch.zeros(0))
    with pytest.raises(ValueError, match="expected log weights without NaN values, got 1"):
        function(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match=r"expected log weights of shape \(N,\)"):
        function(torch.zeros(2, 2))
    assert function(torch.zeros(4, dtype=torch.int64)) is not None  # integer log weights are promoted
