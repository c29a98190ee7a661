"""flows.testing catches broken transforms: a wrong log-det, a missing H·W factor, batch coupling."""

from __future__ import annotations

import pytest
import torch

import flows
from flows import Bijection
from flows.testing import BijectionCheckError, autograd_log_det, check_bijection, perturb_parameters


class OffByConstant(flows.Affine):
    """An affine layer whose ladj is wrong by a constant."""

    def forward_and_log_det(self, x, context=None):
        z, ladj = super().forward_and_log_det(x, context)
        return z, ladj + 0.1

    def inverse_and_log_det(self, z, context=None):
        x, ladj = super().inverse_and_log_det(z, context)
        return x, ladj - 0.1


class PerPixelScale(Bijection):
    """Per-channel scaling of an image that forgets the H·W factor in its ladj."""

    def __init__(self, channels: int) -> None:
        super().__init__((channels, None, None))
        self.log_scale = torch.nn.Parameter(torch.full((channels, 1, 1), 0.3))

    def forward_and_log_det(self, x, context=None):
        return x * self.log_scale.exp(), self.log_scale.sum().expand(x.shape[:-3])

    def inverse_and_log_det(self, z, context=None):
        return z * torch.exp(-self.log_scale), -self.log_scale.sum().expand(z.shape[:-3])


class BatchMean(Bijection):
    """Subtracts the batch mean: a valid-looking ladj of 0, but samples depend on each other."""

    def forward_and_log_det(self, x, context=None):
        return x - 0.5 * x.mean(0, keepdim=True), x.new_zeros(x.shape[:-1])

    def inverse_and_log_det(self, z, context=None):
        return z + z.mean(0, keepdim=True), z.new_zeros(z.shape[:-1])


class BadInverse(flows.Affine):
    def inverse_and_log_det(self, z, context=None):
        x, ladj = super().inverse_and_log_det(z, context)
        return x + 1e-3, ladj


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_correct_transform_passes_with_tiny_errors() -> None:
    t = perturb_parameters(flows.AffineCoupling(4, hidden=(8,)).double())
    report = check_bijection(t, _x(3, 4))
    assert report["forward ladj vs autograd"] < 1e-12
    assert report["round trip x -> z -> x"] < 1e-12


def test_ladj_off_by_a_constant_is_caught() -> None:
    t = perturb_parameters(OffByConstant(3).double())
    with pytest.raises(
        BijectionCheckError, match=r"OffByConstant\).*ladj vs autograd: error 1.000e-01 at batch index \(0,\)"
    ):
        check_bijection(t, _x(3, 3))


def test_missing_hw_factor_is_caught() -> None:
    t = PerPixelScale(2).double()
    with pytest.raises(BijectionCheckError, match="forward ladj vs autograd"):
        check_bijection(t, _x(2, 2, 3, 3))


def test_batch_dependence_is_caught() -> None:
    with pytest.raises(BijectionCheckError, match="outputs of one sample depend on other samples"):
        check_bijection(BatchMean(2), _x(4, 2))


def test_bad_inverse_is_caught() -> None:
    with pytest.raises(BijectionCheckError, match=r"round trip x -> z -> x: error 1.000e-03"):
        check_bijection(BadInverse(2).double(), _x(3, 2))


def test_autograd_log_det_of_a_linear_map() -> None:
    a = torch.tensor([[2.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    ladj, coupling = autograd_log_det(lambda v: v @ a.T, _x(2, 3, 2), event_ndim=1)
    torch.testing.assert_close(ladj, torch.full((2, 3), torch.log(torch.tensor(6.0)).item(), dtype=torch.float64))
    assert coupling == 0
