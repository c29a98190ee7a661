"""MCMC diagnostics against processes with known answers (AR(1), iid draws, stuck chains) and plots."""

from __future__ import annotations

import math

import pytest
import torch

from flows.mcmc import IMH, MALA, GlobalLocal, sample
from flows.metrics import (
    acceptance_rate,
    effective_sample_size,
    integrated_autocorr_time,
    mode_weight_error,
    mode_weights,
    sliced_wasserstein,
    split_rhat,
)
from flows.plot import plot_chain_pairs, plot_trace
from tests.mcmc_support import correlated_gaussian, imperfect_flow


def _ar1(phi: float, draws: int, chains: int, dims: int = 1, seed: int = 0) -> torch.Tensor:
    """Stationary AR(1) chains x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t: tau = (1 + phi) / (1 - phi)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(draws, chains, dims, generator=gen, dtype=torch.float64)
    x = torch.empty_like(noise)
    x[0] = noise[0]
    scale = (1 - phi**2) ** 0.5
    for t in range(1, draws):
        x[t] = phi * x[t - 1] + scale * noise[t]
    return x


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9, -0.3])
def test_integrated_autocorrelation_time_of_ar1(phi: float) -> None:
    x = _ar1(phi, 4000, 8, dims=2)
    tau = integrated_autocorr_time(x)
    exact = (1 + phi) / (1 - phi)
    assert tau.shape == (2,)
    assert ((tau - exact).abs() < 0.12 * exact).all(), (tau, exact)
    torch.testing.assert_close(effective_sample_size(x, method="mean"), 32000 / tau)  # split chains, raw draws
    bulk = effective_sample_size(x)  # ranks: for a Gaussian process close to the ESS of the mean
    assert ((bulk - 32000 / exact).abs() < 0.15 * 32000 / exact).all(), (bulk, 32000 / exact)


def test_ess_counts_chains_stuck_in_different_modes_as_few_samples() -> None:
    x = _ar1(0.0, 1000, 4)
    stuck = x + torch.tensor([0.0, 0.0, 5.0, 5.0], dtype=torch.float64)[None, :, None]
    assert float(effective_sample_size(x)) > 3000
    assert float(effective_sample_size(stuck)) < 50


def test_split_rhat_detects_drift_and_separated_chains() -> None:
    x = _ar1(0.5, 2000, 4)
    assert abs(float(split_rhat(x)) - 1.0) < 0.01
    drift = x + torch.linspace(0, 3, 2000, dtype=torch.float64)[:, None, None]  # each half has its own mean
    assert float(split_rhat(drift)) > 1.1
    assert split_rhat(torch.randn(10, 3, 2, 5)).shape == (2, 5)


def test_mode_weights_and_error() -> None:
    means = torch.tensor([[4.0, 4.0], [-4.0, -4.0], [4.0, -4.0], [-4.0, 4.0]])
    gen = torch.Generator().manual_seed(0)
    exact = means[torch.randint(4, (20000,), generator=gen)] + torch.randn(20000, 2, generator=gen)
    assert mode_weight_error(exact, means) < 0.02
    one_mode = means[0] + torch.randn(500, 2, generator=gen)
    assert mode_weight_error(one_mode, means) == pytest.approx(0.75)
    skewed = torch.tensor([0.7, 0.1, 0.1, 0.1])
    assert mode_weight_error(one_mode, means, weights=skewed) == pytest.approx(0.3)
    torch.testing.assert_close(mode_weights(exact.reshape(100, 200, 2), means).sum(), torch.tensor(1.0))


def test_sliced_wasserstein_matches_the_shift_formula_and_is_zero_on_identical_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 5, generator=gen, dtype=torch.float64)
    shift = torch.tensor([1.0, -2.0, 0.5, 0.0, 2.0], dtype=torch.float64)
    assert sliced_wasserstein(x, x) == 0.0
    expected = float(shift.norm() / 5**0.5)
    value = sliced_wasserstein(x, x + shift, projections=1000, generator=torch.Generator().manual_seed(1))
    assert value == pytest.approx(expected, rel=0.03)
    other = torch.randn(1000, 5, generator=gen, dtype=torch.float64)  # unequal sizes: quantile grid
    assert sliced_wasserstein(x, other, generator=torch.Generator().manual_seed(1)) < 0.12
    assert sliced_wasserstein(x, other + shift, generator=torch.Generator().manual_seed(1)) > 0.8 * expected


def test_acceptance_rate_per_chain() -> None:
    accepted = torch.tensor([[True, False, True], [False, False, True]])
    assert acceptance_rate(accepted).tolist() == [0.5, 0.0, 1.0]


def test_metric_input_errors() -> None:
    with pytest.raises(ValueError, match=r"expected samples of shape \(draws, chains, \*event\), got \(5,\)"):
        split_rhat(torch.randn(5))
    with pytest.raises(ValueError, match="expected at least 4 draws, got 2"):
        effective_sample_size(torch.randn(2, 3))
    with pytest.raises(TypeError, match=r"expected samples to be a torch\.Tensor"):
        integrated_autocorr_time([[0.0]])
    with pytest.raises(ValueError, match=r"expected samples of shape \(\*batch, 2\), got \(10, 3\)"):
        mode_weights(torch.randn(10, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"expected weights of shape \(4,\)"):
        mode_weight_error(torch.randn(10, 2), torch.zeros(4, 2), weights=torch.ones(3) / 3)
    with pytest.raises(ValueError, match="expected samples with the same event shape"):
        sliced_wasserstein(torch.randn(10, 3), torch.randn(10, 2))
    with pytest.raises(ValueError, match=r"expected accepted of shape \(steps, chains\)"):
        acceptance_rate(torch.ones(3))


def test_plots_of_a_global_local_trace(tmp_path) -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    kernel = GlobalLocal(IMH(target, imperfect_flow(target)), MALA(target), local_steps=2)
    trace = sample(kernel, target.sample(6), 20)
    fig = plot_trace(trace, tmp_path / "trace.png", dims=[0, 2], title="trace")
    assert len(fig.axes) == 3  # two coordinates and the acceptance panel
    assert {line.get_label() for line in fig.axes[-1].get_lines()} >= {"accept prob.", "local accept prob"}
    fig = plot_chain_pairs(trace, target.sample(100), tmp_path / "pairs.png")
    assert len(fig.axes) == 3
    assert (tmp_path / "trace.png").stat().st_size > 1000 and (tmp_path / "pairs.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="expected at least two coordinates"):
        plot_chain_pairs(trace, dims=[0])


def test_chain_plots_name_the_shown_coordinates() -> None:
    chains = torch.randn(30, 4, 5)
    trace_axes = plot_trace(chains, dims=[3, 1]).axes
    assert [ax.get_ylabel() for ax in trace_axes] == ["x3", "x1"]
    assert [ax.get_ylabel() for ax in plot_trace(chains, max_dims=2, labels=["a", "b"]).axes] == ["a", "b"]
    pair_axes = plot_chain_pairs(chains, dims=[4, 0, 2]).axes  # lower triangle: (x0|x4), (x2|x4), (x2|x0)
    assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in pair_axes] == [("", "x0"), ("x4", "x2"), ("x0", "")]
    pair_axes = plot_chain_pairs(chains, max_dims=2, labels=["a", "b"]).axes
    assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in pair_axes] == [("a", "b")]


def test_metric_inputs_share_one_check() -> None:
    """Empty inputs, zero chains and empty events are refused; bool and integer inputs are promoted."""
    for bad in (torch.randn(10, 0), torch.randn(10, 0, 2), torch.randn(10, 3, 0)):
        for diagnostic in (effective_sample_size, split_rhat, integrated_autocorr_time):
            with pytest.raises(ValueError, match="expected non-empty samples"):
                diagnostic(bad)
    ints = torch.randint(0, 3, (40, 3), generator=torch.Generator().manual_seed(0))
    assert torch.equal(effective_sample_size(ints), effective_sample_size(ints.double()))
    assert torch.equal(split_rhat(ints.bool()), split_rhat(ints.bool().double()))
    with pytest.raises(TypeError, match="expected split to be True or False"):
        effective_sample_size(ints, split="yes")


def test_acceptance_rate_refuses_values_outside_the_unit_interval() -> None:
    with pytest.raises(ValueError, match=r"expected acceptances or probabilities in \[0, 1\], got 1.5"):
        acceptance_rate(torch.tensor([[0.5, 1.5]]))
    with pytest.raises(ValueError, match="expected non-empty accepted"):
        acceptance_rate(torch.zeros(0, 3))
    rate = acceptance_rate(torch.tensor([[0.5, float("nan")], [1.0, 1.0]]))
    assert rate[0].item() == 0.75 and torch.isnan(rate[1])


def test_mode_weights_of_a_nan_sample_are_nan() -> None:
    means = torch.tensor([[-5.0], [5.0]])
    for bad in (float("nan"), float("inf")):
        weights = mode_weights(torch.tensor([[-4.0], [bad], [4.0]]), means)
        assert weights.shape == (2,) and bool(torch.isnan(weights).all())
        assert math.isnan(mode_weight_error(torch.tensor([[-4.0], [bad]]), means))
    assert mode_weights(torch.tensor([[-4], [6], [5]]), means).tolist() == pytest.approx([1 / 3, 2 / 3])
    with pytest.raises(ValueError, match="expected means without NaN"):
        mode_weights(torch.zeros(3, 1), torch.tensor([[0.0], [math.nan]]))
    with pytest.raises(ValueError, match="expected non-negative weights summing to one"):
        mode_weight_error(torch.zeros(3, 1), means, weights=torch.tensor([0.7, 0.7]))


def test_sliced_wasserstein_order_and_projections_are_checked() -> None:
    x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
    for p in (math.inf, math.nan, 0.5, True):
        with pytest.raises(ValueError, match="expected a finite order p >= 1"):
            sliced_wasserstein(x, x, p=p)
    with pytest.raises(ValueError, match=r"expected projections to be an int in \[1, 1000000\]"):
        sliced_wasserstein(x, x, projections=10**12)
    nan = x.clone()
    nan[3, 1] = math.nan
    assert math.isnan(sliced_wasserstein(nan, x))
    same = sliced_wasserstein(x, x + 1, generator=torch.Generator().manual_seed(1))
    ints = sliced_wasserstein(x.round().long(), x.round() + 1, generator=torch.Generator().manual_seed(1))
    assert ints == pytest.approx(same, rel=0.1)  # integers are promoted, not truncated
