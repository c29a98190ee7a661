"""Flows for dependent data: i.i.d. reduction, the matrix-normal density, and an unbiased mini-batch estimator."""

from __future__ import annotations

import itertools

import pytest
import torch

from flows import RealNVP
from flows.architectures.dependent import DependentFlow, MatrixNormal
from flows.testing import perturb_parameters


def _relationship(n: int, groups: int, seed: int = 0) -> torch.Tensor:
    """Block-diagonal repeated-measures K (unit diagonal) plus a random PSD perturbation."""
    g = torch.Generator().manual_seed(seed)
    label = torch.arange(n) % groups
    k = (label[:, None] == label[None, :]).double() * 0.6
    k.fill_diagonal_(1.0)
    a = torch.randn(n, 2, generator=g, dtype=torch.float64) * 0.2
    return k + a @ a.T


def test_identity_relationship_reduces_exactly_to_iid() -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(RealNVP(3, transforms=2, hidden=(8,)).double())
    model = DependentFlow(flow, torch.eye(7, dtype=torch.float64), lam=0.3)
    x = torch.randn(7, 3, dtype=torch.float64)
    iid = flow.log_prob(x)
    torch.testing.assert_close(model.log_prob_full(x), iid.sum(), atol=1e-10, rtol=1e-12)
    torch.testing.assert_close(
        model.log_prob_batch(x[[1, 4, 6]], torch.tensor([1, 4, 6])), iid[[1, 4, 6]], atol=1e-10, rtol=1e-12
    )


def test_full_batch_matches_multivariate_normal_on_stacked_latents() -> None:
    n, p = 6, 2
    k = _relationship(n, 3)
    base = MatrixNormal(p, k, lam=0.35).double()
    z = torch.randn(n, p, dtype=torch.float64)
    sigma = 0.35 * torch.eye(n, dtype=torch.float64) + 0.65 * k
    mvn = torch.distributions.MultivariateNormal(
        torch.zeros(n * p, dtype=torch.float64), torch.kron(sigma, torch.eye(p, dtype=torch.float64))
    )
    torch.testing.assert_close(base.log_prob_full(z), mvn.log_prob(z.reshape(-1)), atol=1e-10, rtol=1e-12)


@pytest.mark.parametrize("b", [2, 3, 5])
def test_mini_batch_estimator_is_unbiased_over_all_batches(b: int) -> None:
    n, p = 6, 2
    base = MatrixNormal(p, _relationship(n, 2, seed=1), lam=0.6).double()
    z = torch.randn(n, p, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    estimates = [base.log_prob_batch(z[list(s)], torch.tensor(s)).mean() for s in itertools.combinations(range(n), b)]
    torch.testing.assert_close(torch.stack(estimates).mean(), base.log_prob_full(z) / n, atol=1e-12, rtol=1e-12)
    # and the estimate does vary across batches (it is not trivially constant)
    assert torch.stack(estimates).std() > 1e-3


def test_gradient_of_lambda_is_unbiased_too() -> None:
    n, p, b = 5, 2, 3
    base = MatrixNormal(p, _relationship(n, 2), lam=0.4).double()
    z = torch.randn(n, p, dtype=torch.float64)
    grads = []
    for s in itertools.combinations(range(n), b):
        base.zero_grad()
        base.log_prob_batch(z[list(s)], torch.tensor(s)).mean().backward()
        grads.append(base.lam_logit.grad.clone())
    base.zero_grad()
    (base.log_prob_full(z) / n).backward()
    torch.testing.assert_close(torch.stack(grads).mean(), base.lam_logit.grad, atol=1e-12, rtol=1e-10)


def test_full_batch_lambda_update_recovers_the_truth() -> None:
    n, p, lam = 400, 3, 0.3
    label = torch.arange(n) // 4  # 100 individuals, 4 measurements each
    k = (label[:, None] == label[None, :]).double()
    sigma = lam * torch.eye(n, dtype=torch.float64) + (1 - lam) * k
    z = torch.linalg.cholesky(sigma) @ torch.randn(
        n, p, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    base = MatrixNormal(p, k, lam=0.8).double()
    estimate = base.update_lambda(z)
    assert abs(estimate - lam) < 0.06
    assert abs(float(base.lam.detach()) - estimate) < 1e-9
    # the update maximises the full-batch likelihood
    best = base.log_prob_full(z)
    for other in (estimate - 0.02, estimate + 0.02):
        probe = MatrixNormal(p, k, lam=other).double()
        assert probe.log_prob_full(z) < best


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"square \(n, n\) relationship"):
        MatrixNormal(2, torch.ones(3, 2))
    with pytest.raises(ValueError, match="symmetric"):
        MatrixNormal(2, torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive semi-definite"):
        MatrixNormal(2, torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="0 < lam < 1"):
        MatrixNormal(2, torch.eye(2), lam=1.0)
    base = MatrixNormal(2, torch.eye(4))
    with pytest.raises(ValueError, match="at least 2 samples"):
        base.log_prob_batch(torch.zeros(1, 2), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"indices in \[0, 4\)"):
        base.log_prob_batch(torch.zeros(2, 2), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"latents of shape \(4, 2\)"):
        base.log_prob_full(torch.zeros(3, 2))
