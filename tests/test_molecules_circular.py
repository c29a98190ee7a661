"""Circular splines and NCSF: a C¹ map of the circle, periodic densities, exact normalisation on the torus."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows.bijections.circular import wrap


def perturbed(module: torch.nn.Module, scale: float = 0.5, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def test_circular_spline_is_a_c1_map_of_the_circle():
    tau = flows.CircularRationalQuadraticSpline(6)
    params = torch.randn(50, tau.params_per_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ends = torch.tensor([-math.pi, math.pi - 1e-12], dtype=torch.float64).expand(50, 2)
    z, ladj = tau.forward_and_log_det(ends, params[:, None, :])
    torch.testing.assert_close(z[:, 0], torch.full((50,), -math.pi, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(z[:, 1], torch.full((50,), math.pi, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(ladj[:, 0], ladj[:, 1], rtol=0, atol=1e-8)  # the same slope on both sides of ±π
    assert ladj.std() > 0.1  # the end derivative is learned (not pinned to 1 as in the interval spline)
    x = torch.linspace(-math.pi, math.pi, 9, dtype=torch.float64)[:-1]
    z0, l0 = tau.forward_and_log_det(x, torch.zeros(tau.params_per_dim, dtype=torch.float64))
    torch.testing.assert_close(z0, x, rtol=0, atol=1e-12)  # zero parameters: the identity
    assert l0.abs().max() < 1e-12


def test_circular_spline_round_trip_and_periodicity():
    tau = flows.CircularRationalQuadraticSpline(5)
    gen = torch.Generator().manual_seed(2)
    x = (torch.rand(2000, generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
    params = 2 * torch.randn(2000, tau.params_per_dim, generator=gen, dtype=torch.float64)
    z, ladj = tau.forward_and_log_det(x, params)
    back, inverse_ladj = tau.inverse_and_log_det(z, params)
    # raw parameters of scale 2 give slopes down to ~1e-3: the inverse loses a few digits there (measured 4e-10)
    assert wrap(back - x).abs().max() < 1e-8 and (ladj + inverse_ladj).abs().max() < 1e-8
    for k in (-2, 1, 3):
        zk, lk = tau.forward_and_log_det(x + 2 * math.pi * k, params)
        assert wrap(zk - z).abs().max() < 1e-10 and (lk - ladj).abs().max() < 1e-9


def test_ncsf_density_is_periodic_in_every_angle_and_normalised_on_the_torus():
    torch.manual_seed(0)
    flow = perturbed(flows.NCSF(2, transforms=3, hidden=(16,), bins=6).double(), scale=0.15)
    # midpoint rule on the 2-torus: O(h²) for a density with kinks at the knots (1.6e-5, 6e-6, 6e-7 at n = 200/400/800)
    n = 400
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n * 2 * math.pi - math.pi
    with torch.no_grad():
        log_q = flow.log_prob(torch.cartesian_prod(grid, grid))
    assert log_q.max() - log_q.min() > 4  # far from the uniform start
    assert abs(float(log_q.exp().sum() * (2 * math.pi / n) ** 2) - 1) < 5e-5
    flow3 = perturbed(flows.NCSF(3, transforms=2, hidden=(8,), bins=4).double(), seed=1)
    x = flow3.sample((16,))
    assert (x.abs() <= math.pi).all()
    lp = flow3.log_prob(x)
    for i in range(3):
        for k in (-1, 2):
            shift = torch.zeros(3, dtype=torch.float64)
            shift[i] = 2 * math.pi * k
            torch.testing.assert_close(flow3.log_prob(x + shift), lp, rtol=0, atol=1e-9)
    samples, log_q = flow3.sample_and_log_prob((8,))
    torch.testing.assert_close(log_q, flow3.log_prob(samples), rtol=0, atol=1e-8)


def test_ncsf_starts_uniform_and_learns_a_von_mises_pair():
    torch.manual_seed(0)
    flow = flows.NCSF(2, transforms=2, hidden=(16,), bins=8)
    x = torch.randn(64, 2)
    torch.testing.assert_close(flow.log_prob(x), torch.full((64,), -2 * math.log(2 * math.pi)))
    # a correlated pair of angles: maximum likelihood must move the density towards it
    gen = torch.Generator().manual_seed(3)
    a = torch.distributions.VonMises(0.5, 2.0).sample((2048,))
    data = wrap(torch.stack([a, a + 0.3 * torch.randn(2048, generator=gen)], -1))
    opt = torch.optim.Adam(flow.parameters(), lr=1e-2)
    start = -flow.log_prob(data).mean().item()
    for _ in range(60):
        opt.zero_grad()
        loss = -flow.log_prob(data).mean()
        loss.backward()
        opt.step()
    assert loss.item() < start - 0.5


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="expected bins to be an int >= 1"):
        flows.CircularRationalQuadraticSpline(0)
    with pytest.raises(ValueError, match="expected 0 <= min_bin_width"):
        flows.CircularRationalQuadraticSpline(4, min_bin_width=0.3)
    tau = flows.CircularRationalQuadraticSpline(4)
    with pytest.raises(ValueError, match=r"expected raw parameters of shape \(\*, 12\)"):
        tau.forward_and_log_det(torch.zeros(3), torch.zeros(3, 11))
    with pytest.raises(ValueError, match="expected"):
        flows.NCSF(1)
    with pytest.raises(ValueError, match="expected"):
        flows.NCSF(3, bins=0)


def test_mixed_domain_ncsf_lives_on_circle_times_interval_and_is_normalised():
    torch.manual_seed(1)
    circular, lower, upper = (
        torch.tensor([True, False]),
        torch.tensor([-math.inf, 0.0]),
        torch.tensor([math.inf, math.pi]),
    )
    flow = perturbed(
        flows.NCSF(2, transforms=2, hidden=(16,), bins=6, circular=circular, lower=lower, upper=upper).double(), 0.15
    )
    n = 400
    phi = (torch.arange(n, dtype=torch.float64) + 0.5) / n * 2 * math.pi - math.pi
    theta = (torch.arange(n, dtype=torch.float64) + 0.5) / n * math.pi
    with torch.no_grad():
        log_q = flow.log_prob(torch.cartesian_prod(phi, theta))
        mass = float(log_q.exp().sum() * (2 * math.pi / n) * (math.pi / n))
        x, log_s = flow.sample_and_log_prob((256,))
        shifted = flow.log_prob(x + torch.tensor([2 * math.pi, 0.0], dtype=torch.float64))
    assert abs(mass - 1) < 1e-4  # measured 3e-6, -2.5e-6, -1.8e-6 at n = 200, 400, 800
    assert ((x[:, 1] > 0) & (x[:, 1] < math.pi)).all() and (x[:, 0].abs() <= math.pi).all()
    torch.testing.assert_close(log_s, flow.log_prob(x), rtol=0, atol=1e-8)
    torch.testing.assert_close(shifted, log_s, rtol=0, atol=1e-8)
    with pytest.raises(ValueError, match="expected lower/upper only with circular"):
        flows.NCSF(2, lower=lower)


def test_interval_to_line_is_the_identity_to_first_order_at_the_middle_of_its_box():
    lower = torch.tensor([-40.0, -3.0, -math.inf], dtype=torch.float64)
    upper = torch.tensor([30.0, math.inf, 2.0], dtype=torch.float64)
    t = flows.IntervalToLine(lower, upper)
    middle = torch.tensor([-5.0, 40.0, -40.0], dtype=torch.float64)  # box midpoint, far from the one-sided bounds
    y, ladj = t.forward_and_log_det(middle)
    torch.testing.assert_close(y, middle, rtol=0, atol=1e-12)
    assert abs(float(ladj)) < 1e-12
    with pytest.raises(ValueError, match=r"expected inputs inside the domain, got 31 in entry 0"):
        t(torch.tensor([31.0, 0.0, 0.0], dtype=torch.float64))
