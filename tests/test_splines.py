"""Rational-quadratic splines: knots, tails, the stable inverse, hand-written gradients, edge inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flows import Coupling, Elementwise, RationalQuadraticSpline
from flows.testing import check_bijection, perturb_parameters

B = 3.0


def _reference(x: torch.Tensor, params: torch.Tensor, spline: RationalQuadraticSpline):
    """Straightforward pure-autograd forward map (softmax, cumsum, per-bin formula), for comparison."""
    k, m_w, m_h, m_d = spline.bins, spline.min_bin_width, spline.min_bin_height, spline.min_derivative
    widths = m_w + (1 - k * m_w) * torch.softmax(params[..., :k], -1)
    heights = m_h + (1 - k * m_h) * torch.softmax(params[..., k : 2 * k], -1)
    knots_x = F.pad(torch.cumsum(widths, -1), (1, 0)) * 2 * B - B
    knots_y = F.pad(torch.cumsum(heights, -1), (1, 0)) * 2 * B - B
    shift = math.log(math.expm1(1 - m_d))
    d = m_d + F.softplus(F.pad(params[..., 2 * k :], (1, 1)) + shift)
    inside = (x >= -B) & (x <= B)
    xc = x.clamp(-B, B)
    idx = ((xc.unsqueeze(-1) >= knots_x[..., 1:-1]).sum(-1, keepdim=True)).clamp(0, k - 1)

    def g(t, i):
        return t.gather(-1, i).squeeze(-1)

    x0, x1, y0, y1 = g(knots_x, idx), g(knots_x, idx + 1), g(knots_y, idx), g(knots_y, idx + 1)
    d0, d1 = g(d, idx), g(d, idx + 1)
    w, h = x1 - x0, y1 - y0
    s = h / w
    xi = (xc - x0) / w
    den = s + (d1 + d0 - 2 * s) * xi * (1 - xi)
    y = y0 + h * (s * xi**2 + d0 * xi * (1 - xi)) / den
    deriv = s**2 * (d1 * xi**2 + 2 * s * xi * (1 - xi) + d0 * (1 - xi) ** 2) / den**2
    return torch.where(inside, y, x), torch.where(inside, deriv.log(), torch.zeros_like(x)), knots_x, knots_y, d


def _setup(n: int = 64, bins: int = 5, scale: float = 1.5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    spline = RationalQuadraticSpline(bins, bound=B).double()
    params = scale * torch.randn(n, spline.params_per_dim, generator=gen, dtype=torch.float64)
    return spline, params, gen


def test_identity_at_zero_parameters() -> None:
    spline = RationalQuadraticSpline(6, bound=B).double()
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    params = spline.identity_params().double().expand(101, -1)
    for fn in (spline.forward_and_log_det, spline.inverse_and_log_det):
        y, ladj = fn(x, params)
        torch.testing.assert_close(y, x, atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj, torch.zeros_like(x), atol=1e-12, rtol=0)


def test_matches_the_reference_formula_values_and_gradients() -> None:
    spline, params, gen = _setup()
    x = 4 * torch.rand(64, generator=gen, dtype=torch.float64) - 2
    x[:4] = torch.tensor([-1e4, 1e4, -B, B], dtype=torch.float64)
    p1, p2 = params.clone().requires_grad_(), params.clone().requires_grad_()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, ladj = spline.forward_and_log_det(x1, p1)
    y_ref, ladj_ref, *_ = _reference(x2, p2, spline)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ladj, ladj_ref)
    weights = torch.randn(2, 64, generator=gen, dtype=torch.float64)
    (weights[0] * y + weights[1] * ladj).sum().backward()
    (weights[0] * y_ref + weights[1] * ladj_ref).sum().backward()
    torch.testing.assert_close(p1.grad, p2.grad)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_passes_through_the_knots_with_the_knot_derivatives() -> None:
    spline, params, _ = _setup(n=8)
    _, _, knots_x, knots_y, d = _reference(torch.zeros(8, dtype=torch.float64), params, spline)
    # (the reference's knots may differ from ours by an ulp, which moves the log-derivative by ~1e-9)
    for j in range(spline.bins + 1):
        y, ladj = spline.forward_and_log_det(knots_x[:, j].contiguous(), params)
        torch.testing.assert_close(y, knots_y[:, j], atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj, d[:, j].log(), atol=1e-8, rtol=0)
        x, ladj_inv = spline.inverse_and_log_det(knots_y[:, j].contiguous(), params)
        torch.testing.assert_close(x, knots_x[:, j], atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj_inv, -d[:, j].log(), atol=1e-8, rtol=0)
    # the ends are exactly the bounds and the boundary derivatives are 1 (continuous identity tails)
    assert torch.equal(knots_x[:, 0], torch.full((8,), -B, dtype=torch.float64))
    y, ladj = spline.forward_and_log_det(torch.full((8,), B, dtype=torch.float64), params)
    torch.testing.assert_close(y, torch.full((8,), B, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(ladj, torch.zeros(8, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_log_derivative_matches_autograd_everywhere(direction: str) -> None:
    spline, params, gen = _setup(n=200)
    v = 8 * torch.rand(200, generator=gen, dtype=torch.float64) - 4
    v[:6] = torch.tensor([-1e4, 1e4, -B, B, 0.0, -B + 1e-12], dtype=torch.float64)
    v.requires_grad_(True)
    fn = spline.forward_and_log_det if direction == "forward" else spline.inverse_and_log_det
    y, ladj = fn(v, params)
    (grad,) = torch.autograd.grad(y.sum(), v)
    torch.testing.assert_close(ladj, grad.log(), atol=1e-9, rtol=1e-9)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()


def test_tails_are_the_identity() -> None:
    spline, params, _ = _setup(n=6)
    v = torch.tensor([-1e4, -50.0, -B - 1e-9, B + 1e-9, 7.0, 1e4], dtype=torch.float64)
    for fn in (spline.forward_and_log_det, spline.inverse_and_log_det):
        y, ladj = fn(v, params)
        assert torch.equal(y, v) and torch.equal(ladj, torch.zeros_like(v))


def test_round_trip_and_edge_inputs_are_finite_with_finite_gradients() -> None:
    spline, params, gen = _setup(n=12, scale=3.0)
    _, _, knots_x, knots_y, _ = _reference(torch.zeros(12, dtype=torch.float64), params, spline)
    for knots, fn in ((knots_x, spline.forward_and_log_det), (knots_y, spline.inverse_and_log_det)):
        edge = torch.cat([knots[:, :3].reshape(-1), torch.tensor([-1e4, 1e4, -B, B], dtype=torch.float64)])
        p = params.repeat(3, 1)[: edge.numel() - 4]
        p = torch.cat([p, params[:4]]).requires_grad_(True)
        v = edge.clone().requires_grad_(True)
        y, ladj = fn(v, p)
        (y.sum() + ladj.sum()).backward()
        for t in (y, ladj, v.grad, p.grad):
            assert torch.isfinite(t).all()
    x = 8 * torch.rand(12, generator=gen, dtype=torch.float64) - 4
    z, ladj = spline.forward_and_log_det(x, params)
    x_back, ladj_back = spline.inverse_and_log_det(z, params)
    torch.testing.assert_close(x_back, x, atol=1e-9, rtol=0)
    torch.testing.assert_close(ladj_back, -ladj, atol=1e-9, rtol=0)


def test_gradcheck_both_directions() -> None:
    spline, params, gen = _setup(n=10, bins=4)
    x = (6 * torch.rand(10, generator=gen, dtype=torch.float64) - 3).requires_grad_(True)
    params = params.requires_grad_(True)
    assert torch.autograd.gradcheck(spline.forward_and_log_det, (x, params))
    assert torch.autograd.gradcheck(spline.inverse_and_log_det, (x, params))


def test_input_gradient_can_be_differentiated_with_respect_to_parameters() -> None:
    """Second order through x (scores, force matching) works and agrees with the reference."""
    spline, params, gen = _setup(n=16)
    x = 4 * torch.rand(16, generator=gen, dtype=torch.float64) - 2
    results = []
    for use_reference in (False, True):
        p = params.clone().requires_grad_(True)
        v = x.clone().requires_grad_(True)
        y, ladj = _reference(v, p, spline)[:2] if use_reference else spline.forward_and_log_det(v, p)
        (score,) = torch.autograd.grad((ladj - 0.5 * y**2).sum(), v, create_graph=True)
        (grad_p,) = torch.autograd.grad(score.square().sum(), p)
        results.append(grad_p)
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("layout", ["feature-major", "parameter-major", "broadcast"])
def test_hand_written_forward_backward_matches_autograd_of_the_formula(layout: str) -> None:
    """The fused forward's backward equals autograd through the differentiable formulation, tails included."""
    spline, params, gen = _setup(n=96, bins=6, scale=2.0)
    x = 8 * torch.rand(96, generator=gen, dtype=torch.float64) - 4
    x[:6] = torch.tensor([-1e4, 1e4, -B, B, 0.0, B - 1e-12], dtype=torch.float64)
    x, params = x.view(8, 12), params.view(8, 12, -1)
    if layout == "parameter-major":
        params = params.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "broadcast":
        params = params[0]
    weights = torch.randn(2, 8, 12, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (spline.forward_and_log_det, spline._forward_autograd):
        p, v = params.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y, ladj = fn(v, p) if fn is spline.forward_and_log_det else fn(v, p.expand(8, 12, -1))
        (weights[0] * y + weights[1] * ladj).sum().backward()
        grads.append((y.detach(), ladj.detach(), v.grad, p.grad))
    for fused, autograd in zip(*grads, strict=True):
        torch.testing.assert_close(fused, autograd, atol=1e-9, rtol=1e-9)  # O(1) values, float64 rounding
    if layout != "broadcast":
        assert not grads[0][3][0, :2].any()  # the tails (x = ±1e4) do not depend on the parameters
    torch.testing.assert_close(grads[0][2][0, :2], weights[0, 0, :2], atol=0, rtol=0)  # identity tails: dy/dx = 1


def test_first_derivatives_agree_with_and_without_create_graph() -> None:
    spline, params, gen = _setup(n=32)
    x = 6 * torch.rand(32, generator=gen, dtype=torch.float64) - 3
    results = []
    for create_graph in (False, True):
        p, v = params.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y, ladj = spline.forward_and_log_det(v, p)
        results.append(torch.autograd.grad((y * ladj).sum(), (v, p), create_graph=create_graph))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b.detach(), atol=1e-12, rtol=1e-10)


def test_backward_releases_what_it_saved() -> None:
    """Intermediates are saved with save_for_backward (freed after the backward), not kept on the graph."""
    spline, params, gen = _setup(n=16)
    p, v = params.clone().requires_grad_(True), (4 * torch.rand(16, generator=gen, dtype=torch.float64) - 2)
    y, ladj = spline.forward_and_log_det(v.requires_grad_(True), p)
    (y.sum() + ladj.sum()).backward(retain_graph=False)
    with pytest.raises(RuntimeError, match="second time"):
        (y.sum() + ladj.sum()).backward()
    z, ladj_inv = spline.inverse_and_log_det(y.detach(), p)
    (z.sum() + ladj_inv.sum()).backward()
    with pytest.raises(RuntimeError, match="second time"):
        (z.sum() + ladj_inv.sum()).backward()


def test_second_derivative_in_the_parameters_raises_clearly() -> None:
    spline, params, _ = _setup(n=4)
    p = params.clone().requires_grad_(True)
    y, _ = spline.forward_and_log_det(torch.zeros(4, dtype=torch.float64), p)
    (g,) = torch.autograd.grad(y.sum(), p, create_graph=True)
    with pytest.raises(RuntimeError, match=r"once_differentiable|differentiate twice"):
        g.sum().backward()


def test_broadcast_parameters_and_float32_round_trip() -> None:
    torch.manual_seed(0)
    spline = RationalQuadraticSpline(8, bound=4.0)
    params = 0.5 * torch.randn(3, spline.params_per_dim)
    x = 3 * torch.randn(100, 3)
    z, ladj = spline.forward_and_log_det(x, params)
    z_full, ladj_full = spline.forward_and_log_det(x, params.expand(100, 3, -1))
    assert torch.equal(z, z_full) and torch.equal(ladj, ladj_full)
    x_back, _ = spline.inverse_and_log_det(z, params)
    torch.testing.assert_close(x_back, x, atol=1e-4, rtol=0)


def test_parameter_layouts_give_identical_results() -> None:
    """Parameter-major (MADE) and feature-major (coupling) layouts of the same values agree exactly."""
    spline, params, gen = _setup(n=24)
    feature_major = params.view(4, 6, -1)
    param_major = feature_major.transpose(1, 2).contiguous().transpose(1, 2)
    x = 4 * torch.rand(4, 6, generator=gen, dtype=torch.float64) - 2
    a, b = feature_major.clone().requires_grad_(True), param_major.clone().requires_grad_(True)
    za, la = spline.forward_and_log_det(x, a)
    zb, lb = spline.forward_and_log_det(x, b)
    assert torch.equal(za, zb) and torch.equal(la, lb)
    (za.sum() + la.sum()).backward()
    (zb.sum() + lb.sum()).backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-14, rtol=0)
    assert b.grad.stride() == b.stride()  # the gradient keeps the parameters' memory layout


def test_one_bin_and_elementwise_and_coupling_use() -> None:
    one = RationalQuadraticSpline(1, bound=2.0).double()
    assert one.params_per_dim == 2
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    y, ladj = one.forward_and_log_det(x, torch.randn(13, 2, dtype=torch.float64))
    torch.testing.assert_close(y, x)  # one bin with unit end derivatives is the identity
    torch.testing.assert_close(ladj, torch.zeros_like(x))
    torch.manual_seed(0)
    layer = perturb_parameters(Coupling(4, transformer=RationalQuadraticSpline(4), hidden=(8,)).double(), 0.5)
    check_bijection(layer, torch.randn(3, 4, dtype=torch.float64))
    free = perturb_parameters(Elementwise(3, RationalQuadraticSpline(3, bound=1.0)).double(), 1.0)
    check_bijection(free, torch.randn(5, 3, dtype=torch.float64))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="expected bins to be an int >= 1, got 0"):
        RationalQuadraticSpline(0)
    with pytest.raises(ValueError, match=r"expected bound to be a finite number > 0 and <= 1e\+30, got -1"):
        RationalQuadraticSpline(4, bound=-1.0)
    for bound in (math.inf, math.nan, 1e300):  # inf gave NaN outputs
        with pytest.raises(ValueError, match="expected bound to be a finite number > 0"):
            RationalQuadraticSpline(4, bound=bound)
    with pytest.raises(TypeError, match="expected bound to be a real number, got str"):
        RationalQuadraticSpline(4, bound="5")
    with pytest.raises(ValueError, match=r"expected min_derivative to be a finite number > 0, got 0\.0"):
        RationalQuadraticSpline(4, min_derivative=0.0)  # gave a NaN log-det at a finite input
    with pytest.raises(ValueError, match=r"expected 0 <= min_bin_width < 1/bins = 0\.25, got 0\.3"):
        RationalQuadraticSpline(4, min_bin_width=0.3)
    with pytest.raises(ValueError, match=r"expected 0 < min_derivative < 1, got 1\.5"):
        RationalQuadraticSpline(4, min_derivative=1.5)
    spline = RationalQuadraticSpline(4)
    with pytest.raises(ValueError, match=r"expected raw parameters of shape \(\*, 11\) \(3 \* bins - 1 with bins=4\)"):
        spline.forward_and_log_det(torch.zeros(3), torch.zeros(3, 12))
