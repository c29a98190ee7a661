"""Orthogonal layers: Householder products are orthogonal, QR/SVD log-dets are slogdet of the weight; bad arguments."""

from __future__ import annotations

import pytest
import torch

import flows
from flows.bijections.orthogonal import householder_matrix


@pytest.mark.parametrize("k", [1, 2, 5])
def test_householder_matrix_is_orthogonal_with_determinant_sign(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    q = householder_matrix(torch.randn(k, 5, generator=g, dtype=torch.float64))
    torch.testing.assert_close(q @ q.T, torch.eye(5, dtype=torch.float64))
    assert torch.linalg.det(q).item() == pytest.approx((-1) ** k)


def test_householder_matrix_matches_the_product_of_reflections() -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(3, 4, generator=g, dtype=torch.float64)
    eye = torch.eye(4, dtype=torch.float64)
    want = eye
    for row in v:
        want = want @ (eye - 2 * torch.outer(row, row) / row.dot(row))
    torch.testing.assert_close(householder_matrix(v), want)


@pytest.mark.parametrize("cls", [flows.QRLinear, flows.SVDLinear])
def test_log_det_is_slogdet_of_the_weight(cls) -> None:
    torch.manual_seed(0)
    t = cls(4).double()
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.5 * torch.randn_like(p))
    ladj = t.forward_and_log_det(torch.zeros(1, 4, dtype=torch.float64))[1]
    torch.testing.assert_close(ladj[0], torch.linalg.slogdet(t.weight()).logabsdet)


@pytest.mark.parametrize("cls", [flows.Householder, flows.QRLinear, flows.SVDLinear])
def test_bad_arguments_are_refused(cls) -> None:
    with pytest.raises(ValueError, match="expected a vector event"):
        cls((2, 3))
    with pytest.raises(ValueError, match="expected reflections to be an int >= 1, got 0"):
        cls(3, reflections=0)
