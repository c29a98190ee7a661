"""Energy targets: shapes, exact log Z (quadrature), exact samplers, gradients, reference data, bad input."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from flows.targets import (
    DW4,
    LJ13,
    Banana,
    DoubleWell,
    EnergyTarget,
    Funnel,
    Gaussian,
    GaussianMixture,
    ManyWell,
    MullerBrown,
    PhiFour,
)
from flows.targets._quadrature import log_trapezoid_2d

ALL_TARGETS = {
    "double_well": DoubleWell,
    "many_well": lambda: ManyWell(6),
    "muller_brown": MullerBrown,
    "gaussian": lambda: Gaussian(3, loc=torch.tensor([0.0, 1.0, -1.0]), scale=2.0),
    "fab40": GaussianMixture.fab40,
    "four_modes": lambda: GaussianMixture.four_modes(6),
    "funnel": lambda: Funnel(4),
    "banana": lambda: Banana(4),
    "phi4_1d": lambda: PhiFour(6),
    "phi4_2d": lambda: PhiFour(4, dims=2, boundary="periodic"),
    "dw4": DW4,
    "lj13": LJ13,
}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_energy_shapes_dtypes_and_gradients(name: str) -> None:
    target = ALL_TARGETS[name]().double()
    assert isinstance(target, EnergyTarget) and type(target).__name__ in repr(target)
    for batch in ((), (5,), (2, 3)):
        x = torch.randn(*batch, *target.event_shape, generator=_gen(), dtype=torch.float64) + 0.5
        u = target.energy(x)
        assert u.shape == torch.Size(batch) and u.dtype == torch.float64
        assert torch.isfinite(u).all()
        u2, grad = target.energy_and_grad(x)
        torch.testing.assert_close(u2, u)
        assert grad.shape == x.shape and torch.isfinite(grad).all()
        torch.testing.assert_close(target.log_prob(x), -u)
        log_prob, grad_lp = target.log_prob_and_grad(x)
        torch.testing.assert_close(log_prob, -u)
        torch.testing.assert_close(grad_lp, -grad)
        assert not (log_prob.requires_grad or grad_lp.requires_grad)
    # the (2, 3) layout agrees with the flat (6,) one
    x = torch.randn(2, 3, *target.event_shape, generator=_gen(1), dtype=torch.float64)
    torch.testing.assert_close(target.energy(x).reshape(6), target.energy(x.reshape(6, *target.event_shape)))
    if target.has_exact_sampler:
        s = target.sample((2, 3), generator=_gen())
        assert s.shape == (2, 3, *target.event_shape) and s.dtype == torch.float64
        assert target.sample((), generator=_gen()).shape == target.event_shape
    else:
        with pytest.raises(NotImplementedError, match="no exact sampler"):
            target.sample(3)


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_wrong_event_shape_is_a_clear_error(name: str) -> None:
    target = ALL_TARGETS[name]()
    bad = torch.zeros(3, target.dim + 1)
    with pytest.raises(ValueError, match="expected input of shape"):
        target.energy(bad)


def test_double_well_log_z_and_gradient_match_closed_forms() -> None:
    target = DoubleWell().double()
    assert abs(target.log_Z_1d - math.log(11784.50927)) < 1e-8  # fab-torch's value
    assert abs(target.log_Z - math.log(11784.50927 * math.sqrt(2 * math.pi))) < 1e-8
    x = torch.randn(7, 2, dtype=torch.float64, generator=_gen())
    _, grad = target.energy_and_grad(x)
    x1, x2 = x[:, 0], x[:, 1]
    torch.testing.assert_close(grad, torch.stack((-0.5 - 12 * x1 + 4 * x1**3, x2), -1))
    # Z for other coefficients, against scipy's adaptive quadrature
    other = ManyWell(2, a=0.3, b=-2.0, c=0.5)
    z1, _ = integrate.quad(lambda t: math.exp(-(0.3 * t - 2.0 * t**2 + 0.5 * t**4)), -np.inf, np.inf)
    assert abs(other.log_Z_1d - math.log(z1)) < 1e-8
    many = ManyWell(32)
    assert abs(many.log_Z - 16 * (math.log(11784.50927) + 0.5 * math.log(2 * math.pi))) < 1e-6


def test_many_well_exact_sampler_matches_the_marginal() -> None:
    target = ManyWell(4).double()
    x = target.sample(50_000, generator=_gen(3))
    even, odd = x[:, 0::2].reshape(-1).numpy(), x[:, 1::2].reshape(-1).numpy()
    # even coordinates: binned counts against the exact bin probabilities (chi-square test)
    edges = np.linspace(-3, 3, 41)
    counts, _ = np.histogram(even, bins=edges)
    probs = np.array(
        [
            integrate.quad(lambda t: math.exp(-target._well.u(t) - target.log_Z_1d), a, b)[0]
            for a, b in itertools.pairwise(edges)
        ]
    )
    expected = probs * even.size
    keep = expected > 10
    chi2 = (((counts - expected) ** 2) / expected)[keep].sum()
    assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-3
    assert abs((even > 0).mean() - target.p_positive) < 4 * math.sqrt(0.15 * 0.85 / even.size)
    assert stats.kstest(odd, "norm").pvalue > 1e-3


def test_many_well_modes() -> None:
    target = ManyWell(6)
    x = torch.tensor([[1.7, 0.0, -1.7, 0.3, 1.0, 2.0]])
    assert target.well_signs(x).tolist() == [[True, False, True]]
    # the expected coverage formula against a direct simulation of sign patterns
    n = 40
    p = target.p_positive
    signs = torch.rand(4000, n, 3, generator=_gen()) < p
    codes = (signs.long() * torch.tensor([1, 2, 4])).sum(-1)
    distinct = np.mean([len(set(row.tolist())) for row in codes])
    assert abs(distinct - target.expected_modes_covered(n)) < 0.05
    assert abs(ManyWell(32).expected_modes_covered(10**16) - 2**16) < 1


def _grid_log_z(target: EnergyTarget, x_range, y_range, n: int) -> float:
    def log_f(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        pts = torch.from_numpy(np.stack((x, y), -1))
        return -target.double().energy(pts).numpy()

    return log_trapezoid_2d(log_f, x_range, y_range, n=n)


@pytest.mark.parametrize(
    ("make", "x_range", "y_range", "n"),
    [
        (GaussianMixture.fab40, (-50, 50), (-50, 50), 401),
        (lambda: GaussianMixture.four_modes(2), (-8, 8), (-8, 8), 401),
        (lambda: Gaussian(2, loc=0.5, scale=torch.tensor([1.0, 2.0])), (-12, 12), (-20, 20), 801),
        (lambda: Funnel(2, scale=1.0, b=0.5), (-7, 7), (-40, 40), 2001),
        (lambda: Banana(2, a=1.0, b=0.5), (-7, 7), (-8, 30), 2001),
    ],
)
def test_log_z_by_quadrature_in_2d(make, x_range, y_range, n: int) -> None:
    target = make()
    assert abs(_grid_log_z(target, x_range, y_range, n) - target.log_Z) < 1e-4


def test_muller_brown() -> None:
    target = MullerBrown().double()
    # minima of the potential (Müller & Brown 1979)
    for point, value in (((-0.558, 1.442), -146.70), ((0.623, 0.028), -108.17), ((-0.050, 0.467), -80.77)):
        v, grad = target.energy_and_grad(torch.tensor(point, dtype=torch.float64))
        assert abs(v.item() / target.beta - value) < 0.05
        assert grad.abs().max() < 0.05 * target.beta * 10
    # log Z is stable under a different grid
    finer = log_trapezoid_2d(
        lambda x, y: -target.energy(torch.from_numpy(np.stack((x, y), -1))).numpy(), (-3.5, 3.0), (-2.0, 4.0), n=1601
    )
    assert abs(finer - target.log_Z) < 1e-6
    with pytest.raises(ValueError, match="positive beta"):
        MullerBrown(beta=0.0)


def test_mixture_sampler_and_modes() -> None:
    target = GaussianMixture.four_modes(16).double()
    a = 0.591 * math.sqrt(2 * math.log(16))
    assert torch.allclose(target.locs.abs(), torch.full((4, 16), a, dtype=torch.float64))
    x = target.sample(20_000, generator=_gen())
    counts = torch.bincount(target.assign(x), minlength=4).double() / 20_000
    assert (counts - 0.25).abs().max() < 0.02
    torch.testing.assert_close(x.mean(0), target.locs.mean(0), atol=0.05, rtol=0)
    fab = GaussianMixture.fab40()
    assert fab.locs.shape == (40, 2) and fab.locs.abs().max() <= 40
    assert abs(fab.stds[0, 0].item() - math.log1p(math.e)) < 1e-6


def test_funnel_and_banana_latents_are_standard_normal() -> None:
    for target in (Funnel(5), Funnel(3, scale=math.sqrt(3.0)), Banana(4)):
        x = target.double().sample(20_000, generator=_gen(5))
        eps = target.latent(x)
        for i in range(target.dim):
            assert stats.kstest(eps[:, i].numpy(), "norm").pvalue > 1e-3
        # the energy is the latent's quadratic form up to the log-Jacobian (a constant for the banana)
        if isinstance(target, Banana):
            torch.testing.assert_close(target.energy(x), 0.5 * eps.square().sum(-1))


def _phi4_by_loops(phi: np.ndarray, a: float, b: float, beta: float, periodic: bool) -> float:
    n = phi.shape[0]
    field = phi if periodic else np.pad(phi, 1)
    bonds = 0.0
    idx = np.ndindex(*field.shape)
    for site in idx:
        for axis in range(phi.ndim):
            nb = list(site)
            nb[axis] += 1
            if periodic:
                nb[axis] %= n
            elif nb[axis] >= field.shape[axis]:
                continue
            bonds += (field[site] - field[tuple(nb)]) ** 2
    local = ((1 - phi**2) ** 2 / 4 + b * phi).sum()
    return beta * (0.5 * a * n * bonds + local / (a * n))


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("boundary", ["dirichlet", "periodic"])
def test_phi_four_against_explicit_loops(dims: int, boundary: str) -> None:
    target = PhiFour(5, dims=dims, a=0.2, b=0.1, beta=3.0, boundary=boundary).double()
    phi = torch.randn(*target.event_shape, generator=_gen(), dtype=torch.float64)
    expected = _phi4_by_loops(phi.numpy(), 0.2, 0.1, 3.0, boundary == "periodic")
    assert abs(target.energy(phi).item() - expected) < 1e-10
    sym = PhiFour(5, dims=dims, boundary=boundary).double()
    torch.testing.assert_close(sym.energy(phi), sym.energy(-phi))
    assert sym.magnetization(torch.ones(target.event_shape, dtype=torch.float64)).item() == 1.0


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="even dim"):
        ManyWell(3)
    with pytest.raises(ValueError, match="quartic coefficient must be positive"):
        DoubleWell(c=0.0)
    with pytest.raises(ValueError, match="positive scale"):
        Gaussian(2, scale=-1.0)
    with pytest.raises(ValueError, match="expected locs of shape"):
        GaussianMixture(torch.zeros(3))
    with pytest.raises(ValueError, match="positive weights"):
        GaussianMixture(torch.zeros(2, 2), weights=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="broadcastable"):
        GaussianMixture(torch.zeros(2, 2), stds=torch.ones(3))
    with pytest.raises(ValueError, match="even dim"):
        GaussianMixture.four_modes(5)
    with pytest.raises(ValueError, match="expected dim to be an int >= 2"):
        Funnel(1)
    with pytest.raises(ValueError, match="even dim"):
        Banana(3)
    with pytest.raises(ValueError, match="dims 1 or 2"):
        PhiFour(4, dims=3)
    with pytest.raises(ValueError, match="boundary"):
        PhiFour(4, boundary="open")
    with pytest.raises(ValueError, match="non-negative sample shape"):
        Gaussian(2).sample((-1,))
    with pytest.raises(ValueError, match="log_Z is unknown"):
        PhiFour(4).log_prob(torch.zeros(4), normalized=True)


def test_normalized_log_prob() -> None:
    target = Gaussian(2).double()
    x = torch.randn(4, 2, dtype=torch.float64)
    torch.testing.assert_close(
        target.log_prob(x, normalized=True), torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1)
    )


# -- particle systems: the reference samples of the data directory ---------------------------------

needs_data = pytest.mark.skipif(
    not os.environ.get("FLOWS_DATA_DIR"), reason="reference samples need FLOWS_DATA_DIR (CI sets it)"
)


def test_particle_geometry() -> None:
    target = DW4().double()
    x = torch.randn(3, 8, dtype=torch.float64, generator=_gen())
    shifted = x + torch.tensor([1.0, -2.0]).repeat(4)
    torch.testing.assert_close(target.energy(shifted), target.energy(x))  # translation invariant
    torch.testing.assert_close(target.centre(x).view(3, 4, 2).mean(1), torch.zeros(3, 2, dtype=torch.float64))
    d = target.distances(x)
    assert d.shape == (3, 6)
    torch.testing.assert_close(d[:, 0], (x[:, 0:2] - x[:, 2:4]).norm(dim=-1))
    lj = LJ13().double()
    y = torch.randn(2, 39, dtype=torch.float64, generator=_gen())
    rot = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=_gen(1)))[0]
    torch.testing.assert_close(lj.energy((y.view(2, 13, 3) @ rot).flatten(-2)), lj.energy(y))


@needs_data
def test_dw4_reference_energy() -> None:
    target = DW4().double()
    x = target.reference_samples("test")
    assert x.shape == (10_000, 8)
    torch.testing.assert_close(x.view(-1, 4, 2).mean(1), torch.zeros(10_000, 2, dtype=torch.float64))
    u = target.energy(x)
    assert abs(u.mean().item() - (-22.5)) < 0.1, u.mean()  # data README: ⟨E⟩ ≈ −22.5
    with pytest.raises(ValueError, match="expected split in"):
        target.reference_samples("missing")


@needs_data
def test_lj13_reference_energy_and_virial() -> None:
    target = LJ13().double()
    x = target.reference_samples("test")
    u, grad = target.energy_and_grad(x)
    assert abs(u.mean().item() - (-43.1)) < 0.3, u.mean()  # data README: ⟨E⟩ ≈ −43.1
    virial = (x * grad).sum(-1).mean().item()
    assert abs(virial - 36.0) < 2.5, virial  # = 39 − 3 degrees of freedom; standard error ≈ 0.6
    # with the Lennard-Jones sum over unordered pairs the data is not stationary: the virial is off
    x = x.clone().requires_grad_(True)
    inv6 = target.distances(x).pow(-6)
    unordered = (inv6.square() - 2 * inv6).sum(-1) + 0.5 * x.square().sum(-1)
    (grad_unordered,) = torch.autograd.grad(unordered.sum(), x)
    assert (x * grad_unordered).sum(-1).mean().item() < 36.0 - 5.0


def test_log_prob_and_grad_uses_an_analytic_energy_and_grad() -> None:
    class Analytic(EnergyTarget):
        calls = 0

        def energy(self, x: torch.Tensor) -> torch.Tensor:
            return 0.5 * x.square().sum(-1)

        def energy_and_grad(self, x, *, create_graph=False):
            Analytic.calls += 1
            return self.energy(x), 3.0 * x  # deliberately not the autograd gradient

    x = torch.randn(4, 2)
    log_prob, grad = Analytic(2).log_prob_and_grad(x)
    assert Analytic.calls == 1
    torch.testing.assert_close(log_prob, -0.5 * x.square().sum(-1))
    torch.testing.assert_close(grad, -3.0 * x)


def test_tempered_energy() -> None:
    from flows.targets import TemperedEnergy

    target = DoubleWell().double()
    tempered = TemperedEnergy(target, temperature=2.0)
    x = torch.randn(4, 2, dtype=torch.float64, generator=_gen())
    torch.testing.assert_close(tempered.energy(x), target.energy(x) / 2)
    assert tempered.log_Z is None
    tempered.temperature = 1.0
    assert tempered.log_Z == target.log_Z
    torch.testing.assert_close(tempered.energy(x), target.energy(x))
    with pytest.raises(ValueError, match="positive finite temperature"):
        tempered.temperature = 0.0
    with pytest.raises(TypeError, match=r"expected target to be an EnergyTarget or an object"):
        TemperedEnergy(lambda x: x)
