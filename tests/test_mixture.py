"""Mixture: the exact density, component counts drawn with the weights, stratified importance sampling, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from flows import MAF, DiagNormal
from flows.distributions.mixture import Mixture
from flows.metrics import kish_ess


def _normal_log_pdf(x: torch.Tensor, loc: float, scale: float) -> torch.Tensor:
    return -0.5 * ((x - loc) / scale) ** 2 - math.log(scale) - 0.5 * math.log(2 * math.pi)


def test_log_prob_is_the_analytic_mixture_density() -> None:
    a = DiagNormal(1, loc=-1.0, scale=0.5).double()
    b = DiagNormal(1, loc=2.0, scale=1.5).double()
    r = Mixture([a, b], weights=[1.0, 3.0])  # normalised to 0.25 / 0.75
    x = torch.linspace(-6, 8, 57, dtype=torch.float64)[:, None]
    sa, sb = float(a.log_scale.exp()), float(b.log_scale.exp())  # 0.5 and 1.5 as stored (built in float32)
    expected = torch.logaddexp(
        math.log(0.25) + _normal_log_pdf(x[:, 0], -1.0, sa), math.log(0.75) + _normal_log_pdf(x[:, 0], 2.0, sb)
    )
    torch.testing.assert_close(r.log_prob(x), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(r.weights, torch.tensor([0.25, 0.75], dtype=torch.float64))
    responsibilities = r.responsibilities(x)
    torch.testing.assert_close(responsibilities.sum(-1), torch.ones(57, dtype=torch.float64))


def test_samples_follow_the_weights_and_carry_their_exact_log_density() -> None:
    torch.manual_seed(0)
    r = Mixture([DiagNormal(2, loc=-10.0), DiagNormal(2, loc=10.0)], weights=[0.2, 0.8])
    x, log_r = r.sample_and_log_prob((4000,), generator=torch.Generator().manual_seed(1))
    assert x.shape == (4000, 2) and log_r.shape == (4000,)
    torch.testing.assert_close(log_r, r.log_prob(x))
    share = float((x[:, 0] > 0).double().mean())
    assert abs(share - 0.8) < 4 * math.sqrt(0.8 * 0.2 / 4000)
    assert 0.0 < float((x[:2000, 0] > 0).double().mean()) < 1.0  # the rows are shuffled, not blocked by component
    again = r.sample((4000,), generator=torch.Generator().manual_seed(1))
    assert again.shape == (4000, 2)
    assert r.sample((0,)).shape == (0, 2)
    assert r.sample((3, 5)).shape == (3, 5, 2)


def test_stratified_importance_sampling_weighs_an_oversampled_rare_mode_correctly() -> None:
    """A target with 1 % of its mass in a far mode: a mixture proposal that draws that mode 30 % of the time."""
    torch.manual_seed(0)
    proposal = Mixture([DiagNormal(1, loc=-5.0).double(), DiagNormal(1, loc=5.0).double()], weights=[0.7, 0.3])
    x, log_r = proposal.sample_and_log_prob((20_000,))
    log_p = torch.logaddexp(
        math.log(0.99) + _normal_log_pdf(x[:, 0], -5, 1), math.log(0.01) + _normal_log_pdf(x[:, 0], 5, 1)
    )
    log_w = log_p - log_r
    w = torch.softmax(log_w, 0)
    p_far = float(w[x[:, 0] > 0].sum())
    assert abs(p_far - 0.01) < 1e-3  # the weights are exact: only the mode counts vary
    assert float(kish_ess(log_w)) < 0.75  # half the budget on 1 % of the mass costs ESS, as it should
    single = DiagNormal(1, loc=-5.0).double()  # the rare mode is invisible to a proposal without it
    y = single.sample((20_000,))
    assert int((y > 0).sum()) == 0


def test_flows_as_components() -> None:
    torch.manual_seed(0)
    r = Mixture([MAF(3, transforms=1, hidden=(8,)), MAF(3, transforms=1, hidden=(8,))])
    x, log_r = r.sample_and_log_prob((7,))
    assert x.shape == (7, 3)
    torch.testing.assert_close(log_r, r.log_prob(x))
    assert "weights=[0.5, 0.5]" in repr(r)


@pytest.mark.parametrize(
    ("components", "weights", "error", "match"),
    [
        ([], None, ValueError, "number of components"),
        ([DiagNormal(1)], [0.5, 0.5], ValueError, "expected 1 weights"),
        ([DiagNormal(1), DiagNormal(1)], [1.0, -1.0], ValueError, "finite positive"),
        ([DiagNormal(1), DiagNormal(1)], [1.0, float("nan")], ValueError, "finite positive"),
        ([DiagNormal(1), DiagNormal(1)], "ab", ValueError, "expected 2 weights"),
        ([DiagNormal(1), DiagNormal(1)], [[1.0, 2.0]], ValueError, "expected 2 weights"),
        ([DiagNormal(1), DiagNormal(2)], None, ValueError, "one event shape"),
        ([DiagNormal(1), torch.nn.Linear(1, 1)], None, TypeError, "log_prob"),
        ([DiagNormal(1), lambda x: x], None, TypeError, "log_prob"),
    ],
)
def test_bad_input_is_refused(components, weights, error, match) -> None:
    with pytest.raises(error, match=match):
        Mixture(components, weights)
