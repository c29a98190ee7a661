"""Molecular evaluation and energy fine-tuning: histogram KL, state ΔF with calibrated errors, pulled-back targets."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows.metrics import histogram_kl, state_free_energy, torsion_periodic_distance
from flows.targets import Gaussian, TransformedTarget
from flows.train import ReverseKL
from flows.train.energy import linlog_energy, reverse_kl_loss

# -- histogram KL (FAB's convention) ------------------------------------------------------------


def test_histogram_kl_of_a_point_mass_against_uniform_is_log_bins():
    ref = torch.full((1000,), 0.01)  # one bin
    uniform = torch.linspace(-math.pi, math.pi, 200 * 50 + 1)[:-1] + math.pi / (200 * 50)  # 50 per bin
    kl = histogram_kl(ref, uniform)
    # p = δ + ε, q = 1/200 + ε: KL = (1 + ε) log((1 + ε)/(1/200 + ε)) + 199 ε log(ε/(1/200 + ε))
    eps = 1e-10
    exact = (1 + eps) * math.log((1 + eps) / (1 / 200 + eps)) + 199 * eps * math.log(eps / (1 / 200 + eps))
    assert abs(kl - exact) < 1e-9
    assert histogram_kl(uniform, uniform) < 1e-12


def test_histogram_kl_reweighting_and_reference_weights_recover_the_target():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20000, generator=gen) * 2 * math.pi - math.pi  # uniform proposal on the circle
    log_w = torch.cos(x)  # target ∝ exp(cos x): von Mises
    exact = torch.distributions.VonMises(torch.tensor(0.0), torch.tensor(1.0)).sample((200000,))
    raw, rew = histogram_kl(exact, x, bins=50), histogram_kl(exact, x, log_w=log_w, bins=50)
    assert rew < 0.01 < raw
    # weights on the reference side: the weighted uniform reference against exact samples
    assert histogram_kl(x, exact, reference_log_w=log_w, bins=50) < 0.01


def test_ramachandran_kl_is_two_dimensional_and_sees_correlation():
    gen = torch.Generator().manual_seed(1)
    a = torch.rand(50000, generator=gen) * 2 - 1
    together = torch.stack([a, a], -1)
    crossed = torch.stack([a, -a], -1)  # the same marginals, another joint
    assert histogram_kl(together[:, 0], crossed[:, 0], bins=64) < 1e-2
    assert histogram_kl(together, crossed, bins=64) > 5
    assert histogram_kl(together, together, bins=64) < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reference": torch.zeros(5, 3), "samples": torch.zeros(5, 3)}, ValueError, r"shape \(N,\) or \(N, 2\)"),
        ({"reference": torch.zeros(5), "samples": torch.zeros(5, 2)}, ValueError, "same layout"),
        ({"reference": torch.zeros(5), "samples": torch.zeros(5), "log_w": torch.zeros(4)}, ValueError, r"\(5,\)"),
        ({"reference": torch.zeros(5), "samples": torch.zeros(5), "range": (1.0, 0.0)}, ValueError, "low < high"),
        ({"reference": torch.zeros(5), "samples": torch.zeros(5), "bins": 0}, ValueError, "bins"),
        ({"reference": torch.tensor([math.nan]), "samples": torch.zeros(5)}, ValueError, "NaN"),
        ({"reference": [0.0], "samples": torch.zeros(5)}, TypeError, "Tensor"),
    ],
)
def test_histogram_kl_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        histogram_kl(**kwargs)


def test_torsion_periodic_distance_wraps():
    d = torsion_periodic_distance(torch.tensor([3.0, 0.5, -3.1]), torch.tensor([-3.0, 0.2, 3.1]))
    torch.testing.assert_close(d, torch.tensor([6.0 - 2 * math.pi, 0.3, 2 * math.pi - 6.2]))


# -- state free energies with standard errors ---------------------------------------------------

# target π = 0.1 N(2, 1) + 0.9 N(-2, 1); B = {x > 0}: p_B = 0.1 Φ(2) + 0.9 (1 - Φ(2)) exactly
_PHI2 = 0.5 * (1 + math.erf(2 / math.sqrt(2)))
P_B = 0.1 * _PHI2 + 0.9 * (1 - _PHI2)
DELTA_F = -math.log(P_B / (1 - P_B))


def _mixture_weights(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of the proposal N(0, 3²) and their exact log weights towards the two-state mixture."""
    x = 3 * torch.randn(n, generator=gen, dtype=torch.float64)
    normal = lambda m, s: torch.distributions.Normal(m, s).log_prob(x)  # noqa: E731
    log_pi = torch.logaddexp(math.log(0.1) + normal(2.0, 1.0), math.log(0.9) + normal(-2.0, 1.0))
    return x, log_pi - normal(0.0, 3.0)


def test_state_free_energy_of_a_known_two_state_mixture_with_calibrated_errors():
    gen = torch.Generator().manual_seed(2)
    z, ratio = [], []
    for _ in range(150):
        x, log_w = _mixture_weights(2000, gen)
        r = state_free_energy(x > 0, log_w)
        z.append((r.delta_f - DELTA_F) / r.stderr)
        ratio.append(r.stderr)
    z = torch.tensor(z)
    assert abs(float(z.mean())) < 0.25  # unbiased to well within a standard error
    assert 0.8 < float(z.std()) < 1.2  # the delta-method error is calibrated
    x, log_w = _mixture_weights(50_000, gen)
    big = state_free_energy(x > 0, log_w, bootstrap=100, generator=gen)
    assert abs(big.delta_f - DELTA_F) < 4 * big.stderr and big.stderr < 0.04
    assert abs(big.p_b - P_B) < 4 * big.p_b_stderr
    assert 0.8 < big.bootstrap_stderr / big.stderr < 1.25  # bootstrap and delta method agree
    assert 0 < big.ess_b <= big.n_b


def test_state_free_energy_unweighted_is_the_binomial_estimate():
    in_b = torch.arange(1000) < 100
    r = state_free_energy(in_b)
    assert r.p_b == pytest.approx(0.1) and r.delta_f == pytest.approx(math.log(9))
    assert r.stderr == pytest.approx(math.sqrt(0.1 * 0.9 / 1000) / (0.1 * 0.9), rel=1e-12)
    assert r.ess_b == pytest.approx(100) and r.bootstrap_stderr is None
    none = state_free_energy(torch.zeros(10, dtype=torch.bool))
    assert none.delta_f == math.inf and none.stderr == math.inf and none.ess_b == 0


def test_state_free_energy_bad_input():
    with pytest.raises(TypeError, match="bool tensor in_b"):
        state_free_energy(torch.zeros(5))
    with pytest.raises(ValueError, match=r"in_b of shape \(N,\)"):
        state_free_energy(torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"log_w of shape \(5,\)"):
        state_free_energy(torch.zeros(5, dtype=torch.bool), torch.zeros(4))
    with pytest.raises(ValueError, match="expected bootstrap to be an int in"):
        state_free_energy(torch.zeros(5, dtype=torch.bool), bootstrap=-1)


# -- energy fine-tuning: the pulled-back target and the linlog cut -----------------------------


def test_transformed_target_is_the_density_of_the_new_coordinates():
    torch.manual_seed(0)
    f = flows.Affine(2)
    with torch.no_grad():
        for p in f.parameters():
            p.normal_()
    target = Gaussian(2)
    pulled = TransformedTarget(target, f)
    z = torch.randn(6, 2)
    x, ladj = f.inverse_and_log_det(z)
    torch.testing.assert_close(pulled.energy(z), target.energy(x) - ladj)
    # normalised: log Z of the pull-back equals log Z of the target (quadrature on a grid)
    g = torch.linspace(-12, 12, 801)
    grid = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        log_z = torch.logsumexp(-pulled.energy(grid), 0) + 2 * math.log(float(g[1] - g[0]))
    assert abs(float(log_z) - target.log_Z) < 1e-3
    nan = pulled.energy(torch.tensor([[math.nan, 0.0]]))
    assert torch.isnan(nan).all()


def test_transformed_target_bad_input():
    with pytest.raises(TypeError, match="expected an EnergyTarget"):
        TransformedTarget(object(), flows.Affine(2))
    with pytest.raises(TypeError, match="expected a Bijection"):
        TransformedTarget(Gaussian(2), object())
    with pytest.raises(ValueError, match=r"event shape \(3,\)"):
        TransformedTarget(Gaussian(3), flows.Affine(2))


def test_linlog_energy_is_exact_below_the_cut_and_finite_gradient_above():
    u = torch.tensor([1.0, 11.0, 1e35, math.inf], requires_grad=True)
    v = linlog_energy(u, 10.0)
    values = v.detach().tolist()
    assert values[0] == 1.0 and values[1] == pytest.approx(10 + math.log(2))
    assert values[3] == pytest.approx(10 + math.log1p(1e30))  # capped: one clash cannot make the loss infinite
    v.sum().backward()
    assert u.grad.tolist()[:2] == [1.0, pytest.approx(0.5)] and u.grad.tolist()[3] == 0.0


def test_reverse_kl_energy_cut_changes_the_loss_not_the_weights():
    flow = flows.Flow(flows.Affine(2), flows.StandardNormal(2))
    target = Gaussian(2, loc=3.0)
    torch.manual_seed(0)
    loss, log_w = reverse_kl_loss(flow, target, 256)
    torch.manual_seed(0)
    cut_loss, cut_log_w = reverse_kl_loss(flow, target, 256, energy_cut=2.0)
    torch.testing.assert_close(log_w, cut_log_w)
    assert cut_loss < loss
    with pytest.raises(ValueError, match="finite energy_cut"):
        ReverseKL(target, energy_cut=math.inf)


def test_reverse_kl_through_internal_coordinates_on_aldp():
    pytest.importorskip("openmm")
    from flows.targets import AlanineDipeptide
    from tests.test_molecules_internal import aldp_frames

    target = AlanineDipeptide(temperature=1000.0)
    frames = aldp_frames(64, seed=5, noise=0.01)
    ic = target.internal_coordinates(reference=frames, linear_torsions=1.0)
    pulled = TransformedTarget(target, ic)
    z, ladj = ic.forward_and_log_det(frames[:4])
    # u_z(q(x)) = u(x) + log|det ∂q/∂x|: the weights of a flow on q equal those of its image on x
    torch.testing.assert_close(pulled.energy(z), target.energy(frames[:4]) + ladj, rtol=1e-10, atol=1e-8)
    flow = flows.NCSF(60, transforms=2, hidden=(8,), circular=ic.circular, lower=ic.lower, upper=ic.upper).double()
    objective = ReverseKL(pulled, batch_size=8, energy_cut=1e4)
    loss, metrics = objective(flow, None)
    loss.backward()
    grads = [p.grad for p in flow.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and 0 < metrics["ess"] <= 1


# -- stiff torsions cut open -------------------------------------------------------------------


def test_linear_torsions_cut_stiff_torsions_open_with_the_exact_log_det():
    from flows.targets.alanine import Z_MATRIX
    from tests.test_molecules_internal import aldp_frames

    reference = aldp_frames(64, seed=3, noise=0.01)
    ic0 = flows.InternalCoordinates(Z_MATRIX, reference=reference, chirality={10: -1})
    ic = flows.InternalCoordinates(Z_MATRIX, reference=reference, chirality={10: -1}, linear_torsions=1.0)
    cut = ic0.circular & ~ic.circular
    assert int(cut.sum()) > 5  # noise 0.01 nm keeps every torsion of the rigid structure stiff
    x = aldp_frames(5, seed=4, noise=0.01)
    (z0, ladj0), (z, ladj) = ic0.forward_and_log_det(x), ic.forward_and_log_det(x)
    torch.testing.assert_close(ladj, ladj0 - ic.scale[cut].log().sum(), rtol=0, atol=1e-10)
    torch.testing.assert_close(z[:, cut], z0[:, cut] / ic.scale[cut], rtol=0, atol=1e-12)
    torch.testing.assert_close(ic.lower[cut], -math.pi / ic.scale[cut])
    assert (ic.scale[ic.circular] == 1).all()
    back, inverse_ladj = ic.inverse_and_log_det(z)
    assert (ic(back) - z).abs().max() < 1e-10
    torch.testing.assert_close(inverse_ladj, -ladj, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="reference configurations with linear_torsions"):
        flows.InternalCoordinates(Z_MATRIX, linear_torsions=1.0)
    with pytest.raises(ValueError, match=r"linear_torsions in \(0, π\)"):
        flows.InternalCoordinates(Z_MATRIX, reference=reference, linear_torsions=4.0)


def test_a_cut_torsion_whose_data_straddles_pi_is_wrapped_before_scaling():
    # 4-atom chain with torsions around π (values on both sides of ±π): the cut is at the mean + π = 0
    gen = torch.Generator().manual_seed(6)
    t = math.pi + 0.1 * torch.randn(200, generator=gen, dtype=torch.float64)
    zero = torch.zeros_like(t)
    pos = torch.stack(
        [
            torch.stack([zero + 1, zero + 1, zero], -1),
            torch.stack([zero + 1, zero, zero], -1),
            torch.stack([zero, zero, zero], -1),
            torch.stack([zero, t.cos(), t.sin()], -1),
        ],
        -2,
    ).flatten(-2)
    ic = flows.InternalCoordinates([(2,), (1, 2), (0, 1, 2), (3, 2, 1, 0)], reference=pos, linear_torsions=1.0)
    assert not ic.circular[-1] and abs(float(ic.scale[-1]) - 0.1) < 0.02
    z = ic(pos)
    assert z[:, -1].abs().max() < 5 and abs(float(z[:, -1].std()) - 1) < 1e-6


# -- the Ramachandran plot ---------------------------------------------------------------------


def test_plot_ramachandran_writes_three_panels(tmp_path):
    pytest.importorskip("matplotlib")
    from flows.plot import plot_ramachandran

    a = torch.rand(300, 2) * 6 - 3
    fig = plot_ramachandran(
        [("reference", a, None), ("flow", a, None), ("reweighted", a, torch.randn(300))], tmp_path / "r.png"
    )
    assert [ax.get_title() for ax in fig.axes[:3]] == ["reference", "flow", "reweighted"]
    assert (tmp_path / "r.png").stat().st_size > 1000
    with pytest.raises(ValueError, match=r"angles \(N, 2\)"):
        plot_ramachandran([("bad", torch.zeros(3), None)])
    with pytest.raises(ValueError, match=r"log_w of shape \(300,\)"):
        plot_ramachandran([("bad", a, torch.zeros(3))])
    with pytest.raises(ValueError, match="at least one"):
        plot_ramachandran([])
