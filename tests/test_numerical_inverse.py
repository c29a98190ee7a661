"""The numerical inverses: round trips, implicit gradients against finite differences, the non-convergence error."""

from __future__ import annotations

import pytest
import torch

from flows.bijections.numerical_inverse import NumericalInverseError, fixed_point_inverse, monotone_inverse


def _scalar_map(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """``f(x) = e^a x + softplus(b) tanh(c x)``: increasing, with a derivative between e^a and e^a + |c| softplus(b)."""

    def fn(x):
        scale, amp = a.exp(), torch.nn.functional.softplus(b)
        t = torch.tanh(c * x)
        return scale * x + amp * t, scale + amp * c * (1 - t * t)

    return fn


def _params(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = (0.5 * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_()
    b = torch.randn(n, generator=g, dtype=torch.float64).requires_grad_()
    c = (3 * torch.rand(n, generator=g, dtype=torch.float64)).requires_grad_()
    return a, b, c


def test_monotone_round_trip_float64_far_and_near() -> None:
    a, b, c = _params(7)
    y = torch.tensor([-1e4, -30.0, -1.0, 0.0, 1e-9, 2.5, 5e3], dtype=torch.float64)
    x = monotone_inverse(_scalar_map(a, b, c), y)
    back = _scalar_map(a, b, c)(x)[0]
    assert (back - y).abs().max() <= 1e-8 * (1 + y.abs()).max()
    # and the other way round: x -> f(x) -> x
    x0 = torch.linspace(-50, 50, 7, dtype=torch.float64)
    x1 = monotone_inverse(_scalar_map(a, b, c), _scalar_map(a, b, c)(x0)[0])
    assert (x1 - x0).abs().max() <= 1e-8


def test_monotone_gradients_are_the_implicit_ones() -> None:
    a, b, c = _params(4, seed=1)
    y = torch.tensor([-3.0, -0.2, 0.7, 4.0], dtype=torch.float64, requires_grad=True)

    def inverse(y, a, b, c):
        return monotone_inverse(_scalar_map(a, b, c), y)

    assert torch.autograd.gradcheck(inverse, (y, a, b, c))


def test_monotone_gradient_matches_the_inverse_function_rule() -> None:
    """dx/dy = 1/f'(x) exactly (not an unrolled-iteration approximation)."""
    a, b, c = _params(5, seed=2)
    y = torch.linspace(-2, 2, 5, dtype=torch.float64, requires_grad=True)
    x = monotone_inverse(_scalar_map(a, b, c), y)
    (dx,) = torch.autograd.grad(x.sum(), y)
    slope = _scalar_map(a, b, c)(x.detach())[1]
    torch.testing.assert_close(dx, 1 / slope, atol=1e-12, rtol=1e-12)


def test_monotone_float32() -> None:
    a, b, c = (p.detach().float() for p in _params(6, seed=3))
    y = torch.linspace(-10, 10, 6)
    x = monotone_inverse(_scalar_map(a, b, c), y)
    assert x.dtype == torch.float32
    torch.testing.assert_close(_scalar_map(a, b, c)(x)[0], y, atol=1e-4, rtol=1e-4)


def test_monotone_non_finite_entries_stay_put() -> None:
    a, b, c = (p.detach() for p in _params(3))
    y = torch.tensor([1.0, float("nan"), -2.0], dtype=torch.float64)
    x = monotone_inverse(_scalar_map(a, b, c), y)
    assert torch.isnan(x[1]) and torch.isfinite(x[[0, 2]]).all()
    clean = monotone_inverse(_scalar_map(a[[0, 2]], b[[0, 2]], c[[0, 2]]), y[[0, 2]])
    torch.testing.assert_close(x[[0, 2]], clean)


def test_monotone_non_convergence_is_a_named_error() -> None:
    a, b, c = (p.detach() for p in _params(3))
    y = torch.tensor([5.0, -7.0, 0.3], dtype=torch.float64)
    with pytest.raises(NumericalInverseError, match=r"residual <= 1e-12.*within 1 iterations.*worst residual"):
        monotone_inverse(_scalar_map(a, b, c), y, max_iter=1)


def test_monotone_bounded_range_has_no_bracket() -> None:
    """y outside the range of f (here a sigmoid, range (0, 1)) cannot be bracketed: a clear error."""
    y = torch.tensor([0.5, 2.0], dtype=torch.float64)

    def fn(x):
        s = torch.sigmoid(x)
        return s, s * (1 - s)

    with pytest.raises(NumericalInverseError, match="no bracket"):
        monotone_inverse(fn, y, max_expand=20)
    assert isinstance(NumericalInverseError("x"), FloatingPointError)


def _branch(weight: torch.Tensor, bias: torch.Tensor):
    """A contractive branch g(x) = 0.6 tanh(W x + b) / ||W||_2 (Lipschitz 0.6)."""

    def g(x):
        w = 0.6 * weight / torch.linalg.matrix_norm(weight, ord=2)
        return torch.tanh(x @ w.T + bias)

    return g


def test_fixed_point_round_trip_and_implicit_gradients() -> None:
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = x + _branch(weight, bias)(x)
    x_back = fixed_point_inverse(_branch(weight, bias), y)
    assert (x_back - x).abs().max() <= 1e-8

    def inverse(y, weight, bias):
        return fixed_point_inverse(_branch(weight, bias), y)

    assert torch.autograd.gradcheck(inverse, (y.detach().requires_grad_(), weight, bias))


def test_fixed_point_non_finite_rows_do_not_spread() -> None:
    g = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(3, 3, generator=g, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    y = torch.randn(4, 3, generator=g, dtype=torch.float64)
    y[2, 1] = float("nan")
    x = fixed_point_inverse(_branch(weight, bias), y)
    assert torch.isnan(x[2]).all() and torch.isfinite(x[[0, 1, 3]]).all()


def test_fixed_point_non_convergence_is_a_named_error() -> None:
    """A branch with Lipschitz constant 2 (not a contraction) diverges: the error names tolerance and iterations."""
    y = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(NumericalInverseError, match=r"expected a residual <= 1e-12.*within 50 iterations"):
        fixed_point_inverse(lambda x: 2 * x, y, max_iter=50)
