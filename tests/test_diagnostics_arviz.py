"""ESS and R̂ agree with ArviZ (Vehtari et al. 2021) on the same chains, to 1e-6.

ArviZ is a test-only dependency (the ``test`` extra); it takes chains as ``(chain, draw)`` arrays,
flows as ``(draws, chains, *event)`` tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flows.metrics import effective_sample_size, integrated_autocorr_time, split_rhat
from flows.metrics.mcmc import ESS_METHODS, RHAT_METHODS

az = pytest.importorskip("arviz", reason="arviz is in the test extra: pip install '.[test]'")


def _ar1(draws: int, chains: int, phi: float, rng: np.random.Generator) -> np.ndarray:
    x = np.zeros((draws, chains))
    x[0] = rng.standard_normal(chains)
    for t in range(1, draws):
        x[t] = phi * x[t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(chains)
    return x


def _metropolis(draws: int, chains: int, rng: np.random.Generator) -> np.ndarray:
    """Random-walk Metropolis on N(0, 1) with a large step: many rejections, so many tied draws."""
    x = np.zeros((draws, chains))
    state = rng.standard_normal(chains)
    for t in range(draws):
        proposal = state + 4.0 * rng.standard_normal(chains)
        accept = np.log(rng.uniform(size=chains)) < 0.5 * (state**2 - proposal**2)
        state = np.where(accept, proposal, state)
        x[t] = state
    return x


def _cases() -> dict[str, np.ndarray]:
    """``(draws, chains)`` arrays that exercise every branch: autocorrelation, ties, odd lengths, modes."""
    rng = np.random.default_rng(0)
    return {
        "iid": rng.standard_normal((200, 4)),
        "ar1_strong": _ar1(300, 3, 0.95, rng),
        "ar1_negative": _ar1(120, 2, -0.6, rng),  # negative lag-1 correlation: ESS above n m
        "odd_length": _ar1(101, 3, 0.5, rng),
        "single_chain": _ar1(150, 1, 0.7, rng),
        "metropolis_ties": _metropolis(250, 4, rng),
        "cauchy": rng.standard_cauchy((200, 4)),
        "separated_modes": rng.standard_normal((100, 4)) + np.array([0.0, 0.0, 3.0, 3.0]),
        "different_scales": rng.standard_normal((100, 4)) * np.array([1.0, 1.0, 1.0, 5.0]),
        "drifting": rng.standard_normal((100, 2)) + np.linspace(0, 3, 100)[:, None],
        "integers": rng.integers(0, 3, (60, 3)).astype(float),
        "four_draws": rng.standard_normal((4, 3)),
        "five_draws": rng.standard_normal((5, 2)),
        "seven_draws": _ar1(7, 2, 0.3, rng),
    }


CASES = _cases()


def _close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= 1e-6 * max(1.0, abs(theirs))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("method", ESS_METHODS)
def test_ess_matches_arviz(name: str, method: str) -> None:
    chains = CASES[name]
    prob = 0.3 if method == "quantile" else None
    ours = float(effective_sample_size(torch.from_numpy(chains), method=method, prob=prob))
    theirs = float(az.ess(chains.T, method=method, prob=prob))
    assert _close(ours, theirs), (ours, theirs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_unsplit_ess_matches_arviz_identity_and_unsplit_ranks(name: str) -> None:
    """``split=False``: ArviZ's ``"identity"`` for the mean; its estimator on unsplit ranks for the bulk."""
    from arviz.stats.diagnostics import _ess, _z_scale

    chains = CASES[name]
    x = torch.from_numpy(chains)
    assert _close(
        float(effective_sample_size(x, method="mean", split=False)), float(az.ess(chains.T, method="identity"))
    )
    assert _close(float(effective_sample_size(x, method="bulk", split=False)), float(_ess(_z_scale(chains.T))))
    tau = float(integrated_autocorr_time(x, split=False))
    assert _close(tau, chains.size / float(az.ess(chains.T, method="identity")))


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n].shape[1] > 1))
@pytest.mark.parametrize("method", RHAT_METHODS)
def test_rhat_matches_arviz(name: str, method: str) -> None:
    chains = CASES[name]
    ours = float(split_rhat(torch.from_numpy(chains), method=method))
    theirs = float(az.rhat(chains.T, method=method))
    assert _close(ours, theirs), (ours, theirs)


def test_event_dimensions_match_arviz_per_coordinate() -> None:
    """``(draws, chains, *event)`` gives one value per coordinate, each equal to ArviZ's on that coordinate."""
    rng = np.random.default_rng(1)
    chains = np.stack([_ar1(80, 3, phi, rng) for phi in (0.0, 0.5, 0.9, -0.3, 0.8, 0.2)], axis=-1).reshape(80, 3, 2, 3)
    x = torch.from_numpy(chains)
    ess, tail, rhat = effective_sample_size(x), effective_sample_size(x, method="tail"), split_rhat(x)
    assert ess.shape == tail.shape == rhat.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            column = chains[:, :, i, j].T
            assert _close(float(ess[i, j]), float(az.ess(column)))
            assert _close(float(tail[i, j]), float(az.ess(column, method="tail")))
            assert _close(float(rhat[i, j]), float(az.rhat(column)))


def test_float32_chains_are_diagnosed_in_float64() -> None:
    chains = CASES["ar1_strong"]
    x = torch.from_numpy(chains).float()
    expected = float(az.ess(x.double().numpy().T))
    assert effective_sample_size(x).dtype == torch.float64
    assert _close(float(effective_sample_size(x)), expected)


def test_rank_rhat_sees_a_scale_difference_that_classic_split_rhat_misses() -> None:
    """The folded half of rank-R̂ (Vehtari et al. 2021, fig. 3): same mean, one chain 5x wider."""
    x = torch.from_numpy(CASES["different_scales"])
    assert float(split_rhat(x, method="split")) < 1.05
    assert float(split_rhat(x)) > 1.1


def test_unknown_methods_and_levels_are_rejected() -> None:
    x = torch.randn(20, 2)
    with pytest.raises(ValueError, match="expected method in"):
        effective_sample_size(x, method="median")
    with pytest.raises(ValueError, match="expected method in"):
        split_rhat(x, method="bulk")
    with pytest.raises(ValueError, match="expected a quantile level"):
        effective_sample_size(x, method="quantile")
    with pytest.raises(ValueError, match="expected quantile levels in"):
        effective_sample_size(x, method="tail", prob=1.5)
    with pytest.raises(ValueError, match="expected at least 2 chains"):
        split_rhat(torch.randn(20, 1), method="identity")


def _poisoned(value: float) -> np.ndarray:
    chains = np.stack([CASES["iid"], CASES["iid"][::-1]], axis=-1).copy()  # (200, 4, 2)
    chains[5, 1, 0] = value  # one draw of coordinate 0
    return chains


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("diagnostic", [f"ess-{m}" for m in ESS_METHODS] + [f"rhat-{m}" for m in RHAT_METHODS])
def test_non_finite_draws_match_arviz(diagnostic: str, value: float) -> None:
    """A NaN draw makes its coordinate's diagnostics NaN, as in ArviZ (before, rank methods reported a
    finite, converged-looking value); an infinite draw gives what ArviZ gives (finite for rank-based
    methods, which only see its rank, NaN for the raw ones). The clean coordinate is unchanged."""
    chains = _poisoned(value)
    kind, method = diagnostic.split("-", 1)
    prob = 0.3 if method == "quantile" else None
    x = torch.from_numpy(chains)
    if kind == "ess":
        ours = effective_sample_size(x, method=method, prob=prob)
        theirs = [float(az.ess(chains[:, :, k].T, method=method, prob=prob)) for k in range(2)]
    else:
        ours = split_rhat(x, method=method)
        theirs = [float(az.rhat(chains[:, :, k].T, method=method)) for k in range(2)]
    for k in range(2):
        if np.isnan(theirs[k]):
            assert torch.isnan(ours[k]), (k, float(ours[k]))
        else:
            assert _close(float(ours[k]), theirs[k]), (k, float(ours[k]), theirs[k])
    assert np.isnan(value) <= bool(torch.isnan(ours[0]))  # the NaN case really is NaN
    assert bool(torch.isfinite(ours[1]))


def test_nan_draw_gives_nan_autocorrelation_time() -> None:
    tau = integrated_autocorr_time(torch.from_numpy(_poisoned(np.nan)))
    assert torch.isnan(tau[0]) and torch.isfinite(tau[1])
