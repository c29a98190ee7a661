"""Planar, radial and Sylvester flows: the invertibility constraints hold at hostile parameters; implicit gradients."""

from __future__ import annotations

import pytest
import torch

import flows
from flows.testing import check_bijection


def test_planar_stays_invertible_when_w_and_u_oppose() -> None:
    torch.manual_seed(0)
    t = flows.Planar(3).double()
    with torch.no_grad():
        t.w.copy_(torch.tensor([2.0, -1.0, 0.5]))
        t.u.copy_(-10 * t.w)  # raw wᵀu = -52.5: the unconstrained map would fold
    assert t.constrained()[1].item() > -1
    x = 3 * torch.randn(6, 3, dtype=torch.float64)
    check_bijection(t, x)


def test_radial_stays_invertible_at_the_contracting_limit() -> None:
    torch.manual_seed(1)
    t = flows.Radial(2).double()
    with torch.no_grad():
        t.raw_beta.fill_(-30.0)  # β → -α: the strongest allowed contraction towards the centre
    alpha, beta = t.alpha_beta()
    assert (beta > -alpha).item()
    check_bijection(t, torch.randn(5, 2, dtype=torch.float64), atol=1e-6, rtol=1e-6)


def test_sylvester_inverse_gradients_match_finite_differences() -> None:
    torch.manual_seed(2)
    t = flows.Sylvester(3, rank=2).double()
    z = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in t.named_parameters()]

    def inverse(z, *values):
        return torch.func.functional_call(
            t.inv, {f"transform.{n}": v for n, v in zip(names, values, strict=True)}, (z,)
        )

    assert torch.autograd.gradcheck(inverse, (z, *(p.detach().requires_grad_() for p in t.parameters())))


def test_sylvester_refuses_a_rank_outside_the_features() -> None:
    with pytest.raises(ValueError, match=r"expected rank to be an int in \[1, 3\], got 4"):
        flows.Sylvester(3, rank=4)
