"""Monotone transformers: quadrature exactness, identity at zero parameters, monotone round trips, clear errors."""

from __future__ import annotations

import pytest
import torch

from flows.bijections.monotone import (
    BernsteinTransformer,
    DeepSigmoidTransformer,
    SOSPolynomialTransformer,
    UMNNTransformer,
    clenshaw_curtis,
)
from flows.bijections.numerical_inverse import NumericalInverseError


def _transformers():
    torch.manual_seed(0)
    umnn = UMNNTransformer(2, (8,), nodes=16).double()
    with torch.no_grad():  # leave the identity initialisation: a non-trivial integrand
        for p in umnn.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return {
        "deep-sigmoid": DeepSigmoidTransformer(4, layers=2),
        "umnn": umnn,
        "sos": SOSPolynomialTransformer(2, 3),
        "bernstein": BernsteinTransformer(6, bound=3.0),
    }


@pytest.mark.parametrize("nodes", [2, 8, 16])
def test_clenshaw_curtis_integrates_polynomials_exactly(nodes: int) -> None:
    s, w = clenshaw_curtis(nodes)
    for degree in range(nodes + 1):
        exact = 0.0 if degree % 2 else 2 / (degree + 1)
        assert float((w * s**degree).sum()) == pytest.approx(exact, abs=1e-13)


def test_clenshaw_curtis_refuses_odd_nodes() -> None:
    with pytest.raises(ValueError, match="expected an even number of nodes >= 2, got 5"):
        clenshaw_curtis(5)


@pytest.mark.parametrize("name", ["deep-sigmoid", "sos", "bernstein"])
def test_identity_at_zero_parameters(name: str) -> None:
    tau = _transformers()[name]
    x = torch.linspace(-8, 8, 17, dtype=torch.float64)
    z, ladj = tau.forward_and_log_det(x, torch.zeros(17, tau.params_per_dim, dtype=torch.float64))
    torch.testing.assert_close(z, x)
    torch.testing.assert_close(ladj, torch.zeros_like(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["deep-sigmoid", "umnn", "sos", "bernstein"])
def test_increasing_and_round_trip_far_into_the_tails(name: str) -> None:
    tau = _transformers()[name]
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-20, 20, 201, dtype=torch.float64)
    params = (0.7 * torch.randn(tau.params_per_dim, generator=g, dtype=torch.float64)).expand(201, -1)
    z, ladj = tau.forward_and_log_det(x, params)
    assert (z.diff() > 0).all() and torch.isfinite(ladj).all()
    x_back, ladj_inv = tau.inverse_and_log_det(z, params)
    assert (x_back - x).abs().max() <= 1e-8
    torch.testing.assert_close(ladj_inv, -ladj)


def test_umnn_log_derivative_converges_to_the_derivative_of_the_quadrature() -> None:
    """log f(x) (the exact derivative) vs the autograd derivative of the computed integral: spectral convergence."""
    base = _transformers()["umnn"]
    x = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
    params = torch.randn(13, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    errors = []
    for nodes in (4, 8, 16, 32):
        tau = UMNNTransformer(2, (8,), nodes=nodes).double()
        tau.load_state_dict(base.state_dict())  # the same integrand network
        z, ladj = tau.forward_and_log_det(x, params)
        (dz,) = torch.autograd.grad(z.sum(), x)
        errors.append(float((dz.log() - ladj).abs().max().detach()))
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] <= 1e-10, errors


def test_inverse_that_does_not_converge_is_a_named_error() -> None:
    tau = DeepSigmoidTransformer(4, max_iter=1)
    params = torch.randn(3, 12, dtype=torch.float64)
    with pytest.raises(NumericalInverseError, match=r"DeepSigmoidTransformer: .*within 1 iterations"):
        tau.inverse_and_log_det(torch.tensor([4.0, -3.0, 0.5], dtype=torch.float64), params)


def test_wrong_parameter_width_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected raw parameters of shape \(\*, 7\)"):
        BernsteinTransformer(6).forward_and_log_det(torch.zeros(3), torch.zeros(3, 5))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DeepSigmoidTransformer(0), "expected sigmoids to be an int >= 1, got 0"),
        (lambda: SOSPolynomialTransformer(2, 0), "expected squares to be an int >= 1, got 0"),
        (lambda: BernsteinTransformer(3, bound=-1.0), "expected bound to be a finite number > 0"),
        (lambda: UMNNTransformer(2, nodes=7), "expected an even number of nodes"),
    ],
)
def test_bad_constructor_arguments(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("NAF", {"sigmoids": 3}),
        ("UNAF", {"embedding": 2, "integrand": (8,), "nodes": 8}),
        ("SOSPF", {"degree": 1, "squares": 2}),
        ("BPF", {"degree": 4, "bound": 3.0}),
        ("BNAF", {}),
    ],
)
def test_builders_sample_with_the_density_of_their_samples(name: str, options: dict) -> None:
    """sample_and_log_prob (numerical inverse) agrees with log_prob (closed-form forward) on the samples."""
    import flows

    torch.manual_seed(0)
    flow = getattr(flows, name)(3, 2, transforms=2, hidden=(8,), **options).double()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    context = torch.randn(5, 2, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob((4,), context=context)  # 4 samples per context row
    assert x.shape == (4, 5, 3)
    torch.testing.assert_close(log_p, flow.log_prob(x, context=context), atol=1e-8, rtol=1e-8)


def test_builders_refuse_bad_options_by_name() -> None:
    import flows

    with pytest.raises(ValueError, match="NAF: expected sigmoids to be an int >= 1, got 0"):
        flows.NAF(2, sigmoids=0)
    with pytest.raises(ValueError, match="SOSPF: expected squares to be an int >= 1, got 0"):
        flows.SOSPF(2, squares=0)
    with pytest.raises(TypeError, match=r"UNAF \(integrand\): expected hidden"):
        flows.UNAF(2, integrand=8)


def test_block_autoregressive_jacobian_is_lower_triangular() -> None:
    import flows

    torch.manual_seed(3)
    t = flows.BlockAutoregressive(4, hidden=(3, 3)).double()
    x = torch.randn(4, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(t, x)
    assert torch.equal(torch.triu(jac, 1), torch.zeros_like(jac))
    assert (torch.diagonal(jac) > 0).all()


def test_the_bounded_sos_polynomial_is_the_scaled_plain_one_inside_and_straight_outside() -> None:
    """τ_B(x) = c + εx + B·∫₀^{x/B} Σ p_k(u)² du on [-B, B], then lines with the end slopes."""
    from flows.bijections.monotone import SOSPolynomialTransformer

    gen = torch.Generator().manual_seed(0)
    b = 4.0
    x = torch.cat([torch.linspace(-b, b, 41, dtype=torch.float64), torch.tensor([-1e6, -9.0, 7.5, 1e6])])
    plain, bounded = SOSPolynomialTransformer(3, 2), SOSPolynomialTransformer(3, 2, bound=b)
    params = 0.5 * torch.randn(len(x), plain.params_per_dim, generator=gen, dtype=torch.float64)
    no_shift = params.clone()
    no_shift[:, 0] = 0
    inside = x.clamp(-b, b)
    z_plain, ladj_plain = plain.forward_and_log_det(inside / b, no_shift)  # ε u + ∫₀^u Σ p², log(ε + Σ p(u)²)
    z, ladj = bounded.forward_and_log_det(x, params)
    slope = ladj_plain.exp()
    expected = params[:, 0] + plain.floor * inside + b * (z_plain - plain.floor * inside / b)
    expected = expected + (x - inside) * (slope - plain.floor) + plain.floor * (x - inside)
    torch.testing.assert_close(z, expected, atol=1e-9, rtol=1e-12)
    torch.testing.assert_close(ladj, ladj_plain, atol=1e-12, rtol=0)  # the end slope carries on outside
    line = x.sort().values
    along, _ = bounded.forward_and_log_det(line, params[:1].expand(len(line), -1))
    assert torch.isfinite(along).all() and (along.diff() > 0).all()  # one map: increasing across ±B
    back, _ = bounded.inverse_and_log_det(z[-4:], params[-4:])  # a bijection of the line: far-out values invert
    torch.testing.assert_close(back, x[-4:], atol=1e-6, rtol=1e-9)
    identity = bounded.forward_and_log_det(x, torch.zeros_like(params))[0]
    torch.testing.assert_close(identity, x, atol=1e-9, rtol=1e-12)  # zero parameters: still the identity
    with pytest.raises(ValueError, match="bound"):
        SOSPolynomialTransformer(3, 2, bound=0.0)


def test_sospf_puts_soft_clips_onto_the_real_line_after_each_layer() -> None:
    import flows

    flow = flows.SOSPF(3, transforms=3, hidden=(8,), bound=4.0)
    layers = flow.transform.transforms
    kinds = [type(m).__name__ for m in layers]
    assert kinds == ["MaskedAutoregressive", "SoftClip"] * 3  # the last layer's output is clipped too
    assert all((m.bound, m.slope) == (pytest.approx(4.4), 0.001) for m in layers[1::2])
    # a last layer that extrapolates far out (here: a large shift) reaches the base density squeezed
    torch.nn.init.constant_(layers[-2].conditioner.layers[-1].bias, 1e3)
    x = torch.zeros(1, 3)
    h = layers[-2](layers[-3](layers[-4](layers[-5](layers[-6](x)))))
    z = flow.transform(x)
    assert (h.abs() > 100).all()
    assert (z.abs() < 4.4 + 0.001 * h.abs()).all()
    plain = flows.SOSPF(3, transforms=3, hidden=(8,), bound=None).transform.transforms
    assert all(isinstance(m, flows.MaskedAutoregressive) for m in plain)


def test_sospf_knee_leaves_the_bulk_to_the_polynomials_and_squeezes_beyond() -> None:
    import flows

    torch.manual_seed(0)
    flow = flows.SOSPF(2, transforms=2, hidden=(8,), knee=3.0).double()
    clip = flow.transform.transforms[1]
    assert (clip.bound, clip.knee) == (pytest.approx(11.0), 3.0)
    x = torch.tensor([[-2.9, 0.5], [1.0, 2.99], [30.0, -200.0]], dtype=torch.float64)
    z, ladj = clip.forward_and_log_det(x)
    torch.testing.assert_close(z[:2], x[:2])  # the identity on [-3, 3]
    torch.testing.assert_close(ladj[:2], torch.zeros(2, dtype=torch.float64))
    assert bool((z[2].abs() < x[2].abs() / 2).all())  # squeezed beyond the knee
    y = flow.sample((5,))
    torch.testing.assert_close(flow.transform.inverse(flow.transform(y)), y)
    for bad, match in (({"knee": 11.0}, "knee in"), ({"knee": -1.0}, "knee"), ({"knee": 1.0, "bound": None}, "knee")):
        with pytest.raises(ValueError, match=f"SOSPF: .*{match}"):
            flows.SOSPF(2, **bad)


def test_a_soft_clip_with_a_slope_squeezes_far_values_and_inverts_everywhere() -> None:
    import flows

    clip = flows.SoftClip(1, bound=2.0, slope=0.01).double()
    x = torch.tensor([[-1e8], [-200.0], [-1.5], [0.0], [1e-6], [2.0], [1e3]], dtype=torch.float64)
    z, ladj = clip.forward_and_log_det(x)
    torch.testing.assert_close(z, 0.99 * x / (1 + x.abs() / 2) + 0.01 * x)
    torch.testing.assert_close(ladj, torch.log(0.99 / (1 + x.abs() / 2) ** 2 + 0.01).squeeze(-1))
    assert z[1].item() == pytest.approx(-0.99 * 200 / 101 - 2.0)  # 200 reaches about 2 B, not 200
    x_back, ladj_back = clip.inverse_and_log_det(z)
    torch.testing.assert_close(x_back, x, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ladj_back, -ladj)
    assert clip.codomain.check(torch.tensor([[1e9]])).all()  # onto the real line
    bounded = flows.SoftClip(1, bound=2.0)
    assert not bounded.codomain.check(torch.tensor([[2.5]])).any()
    with pytest.raises(ValueError, match="SoftClip"):
        bounded.inverse(torch.tensor([[2.5]]))  # outside (-B, B): no preimage without a slope
    for bad in ({"slope": 1.0}, {"slope": -0.1}, {"bound": 0.0}):
        with pytest.raises(ValueError, match="SoftClip: expected"):
            flows.SoftClip(1, **{"bound": 2.0, **bad})


def test_a_soft_clip_knee_is_the_identity_inside_and_c1_at_the_knee() -> None:
    import flows

    clip = flows.SoftClip(1, bound=3.0, slope=0.02, knee=1.0).double()
    inside = torch.linspace(-1.0, 1.0, 9, dtype=torch.float64)[:, None]
    z, ladj = clip.forward_and_log_det(inside)
    torch.testing.assert_close(z, inside)
    torch.testing.assert_close(ladj, torch.zeros(9, dtype=torch.float64))
    x = torch.tensor([[1.0 + 1e-7], [-1.0 - 1e-7]], dtype=torch.float64)
    assert clip.forward_and_log_det(x)[1].abs().max() < 1e-6  # slope 1 on both sides of the knee
    far = torch.tensor([[-1e6], [-4.0], [2.5], [1e4]], dtype=torch.float64)
    z, ladj = clip.forward_and_log_det(far)
    expected = torch.sign(far) * (1 + 0.98 * 2 * (far.abs() - 1) / (far.abs() + 1) + 0.02 * (far.abs() - 1))
    torch.testing.assert_close(z, expected)
    x_back, ladj_back = clip.inverse_and_log_det(z)
    torch.testing.assert_close(x_back, far, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ladj_back, -ladj)
    with pytest.raises(ValueError, match=r"knee in \[0, bound\)"):
        flows.SoftClip(1, bound=3.0, knee=3.0)
