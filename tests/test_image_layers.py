"""Dedicated oracles for the image layers: squeeze, split, flatten, 1×1 convolutions and the conditioners."""

from __future__ import annotations

import math

import pytest
import torch

import flows
from flows.bijections import half_mask
from flows.nn import ConvNet, PooledMLP
from flows.testing import autograd_log_det, check_bijection, perturb_parameters

# -- Squeeze ---------------------------------------------------------------------------------------


def test_squeeze_moves_each_block_into_channels() -> None:
    x = torch.arange(2 * 4 * 6, dtype=torch.float64).reshape(2, 4, 6)
    z = flows.Squeeze(2)(x)
    assert z.shape == (8, 2, 3)
    for c in range(2):
        for i in range(2):
            for j in range(2):
                torch.testing.assert_close(z[4 * c + 2 * i + j], x[c, i::2, j::2])


def test_squeeze_round_trip_any_batch_and_factor() -> None:
    t = flows.Squeeze(3, factor=3)
    x = torch.randn(2, 5, 3, 6, 9)
    z, ladj = t.forward_and_log_det(x)
    assert z.shape == (2, 5, 27, 2, 3) and ladj.shape == (2, 5) and not ladj.any()
    assert torch.equal(t.inverse(z), x)


def test_squeeze_rejects_indivisible_sizes_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"expected height and width divisible by 2, got 5×4"):
        flows.Squeeze(1)(torch.randn(3, 1, 5, 4))
    with pytest.raises(ValueError, match="expected input of shape"):
        flows.Squeeze(2)(torch.randn(3, 1, 4, 4))
    with pytest.raises(ValueError, match="expected channels to be an int >= 1"):
        flows.Squeeze(0)
    with pytest.raises(ValueError, match="expected factor to be an int >= 1"):
        flows.Squeeze(1, factor=0)


# -- Flatten and Split -----------------------------------------------------------------------------


def test_flatten_round_trip_and_errors() -> None:
    t = flows.Flatten((2, 3, 4))
    x = torch.randn(5, 2, 3, 4)
    assert torch.equal(t.inverse(t(x)), x) and t(x).shape == (5, 24)
    with pytest.raises(ValueError, match="expected a concrete event shape"):
        flows.Flatten((2, None, None))


def test_split_factors_out_the_last_channels_and_nests() -> None:
    inner = flows.Chain(flows.Affine((1, 2, 2), shift=1.0, log_scale=0.5), flows.Flatten((1, 2, 2)))
    t = flows.Split((3, 2, 2), inner, keep=1)
    x = torch.randn(4, 3, 2, 2)
    z, ladj = t.forward_and_log_det(x)
    assert z.shape == (4, 12)
    torch.testing.assert_close(z[:, :8], x[:, 1:].reshape(4, 8))  # factored-out channels, untouched
    torch.testing.assert_close(z[:, 8:], (x[:, :1] * math.exp(0.5) + 1).reshape(4, 4))
    torch.testing.assert_close(ladj, torch.full((4,), 4 * 0.5))
    torch.testing.assert_close(t.inverse(z), x)


def test_split_rejects_mismatched_inner_transforms() -> None:
    with pytest.raises(ValueError, match=r"expected keep in 1\.\.3"):
        flows.Split((4, 2, 2), flows.Flatten((4, 2, 2)), keep=4)
    with pytest.raises(ValueError, match=r"the transform expects events of shape \(3, 2, 2\)"):
        flows.Split((4, 2, 2), flows.Flatten((3, 2, 2)))
    with pytest.raises(ValueError, match="end it with Flatten"):
        flows.Split((4, 2, 2), flows.ActNorm2d(2))
    with pytest.raises(ValueError, match="expected a concrete image shape"):
        flows.Split((4, None, None), flows.Flatten((2, 2, 2)))
    with pytest.raises(TypeError, match="expected a Bijection"):
        flows.Split((4, 2, 2), torch.nn.Identity())


# -- Invertible 1×1 convolution --------------------------------------------------------------------


def test_1x1_conv_starts_as_a_rotation_and_dense_and_lu_agree() -> None:
    torch.manual_seed(3)
    dense = flows.Invertible1x1Conv(6).double()
    torch.manual_seed(3)
    lu = flows.Invertible1x1Conv(6, lu=True).double()
    w = dense.weight().detach()
    torch.testing.assert_close(w @ w.T, torch.eye(6, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(lu.weight().detach(), w, atol=1e-6, rtol=0)
    x = torch.randn(3, 6, 2, 5, dtype=torch.float64)
    (zd, ld), (zl, ll) = dense.forward_and_log_det(x), lu.forward_and_log_det(x)
    torch.testing.assert_close(zd, zl, atol=1e-6, rtol=0)
    torch.testing.assert_close(ld, ll, atol=1e-5, rtol=0)  # both ~0: the factors were rounded to float32


@pytest.mark.parametrize("lu", [False, True])
def test_1x1_conv_is_the_matrix_at_every_pixel_with_hw_log_det(lu: bool) -> None:
    torch.manual_seed(0)
    t = perturb_parameters(flows.Invertible1x1Conv(3, lu=lu).double(), 0.3)
    w = t.weight().detach()
    x = torch.randn(2, 3, 2, 3, dtype=torch.float64)
    z, ladj = t.forward_and_log_det(x)
    torch.testing.assert_close(z, torch.einsum("ij,njhw->nihw", w, x))
    torch.testing.assert_close(ladj, (6 * torch.linalg.slogdet(w).logabsdet).expand(2))
    torch.testing.assert_close(t.inverse(z), torch.linalg.solve(w, z.flatten(2)).reshape(x.shape))
    want, _ = autograd_log_det(t, x, 3)
    torch.testing.assert_close(ladj, want)


def test_1x1_conv_parameters_and_errors() -> None:
    assert [n for n, _ in flows.Invertible1x1Conv(4).named_parameters()] == ["dense"]
    assert {n for n, _ in flows.Invertible1x1Conv(4, lu=True).named_parameters()} == {"lower", "upper", "log_diag"}
    assert "lu=True" in repr(flows.Invertible1x1Conv(4, lu=True))
    with pytest.raises(ValueError, match="expected channels to be an int >= 1"):
        flows.Invertible1x1Conv(0)
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 4, \*, \*\)"):
        flows.Invertible1x1Conv(4)(torch.randn(2, 3, 4, 4))


# -- Conditioners ----------------------------------------------------------------------------------


def test_convnet_starts_at_zero_and_takes_vector_or_map_contexts() -> None:
    net = ConvNet(2, 6, (8, 8), context=3)
    x = torch.randn(4, 5, 2, 6, 7)
    assert not net(x, torch.randn(4, 5, 3)).any()  # zero-initialised output layer
    perturb_parameters(net, 0.5)
    vector = torch.randn(4, 5, 3)
    out = net(x, vector)
    assert out.shape == (4, 5, 6, 6, 7)
    spatial = vector[..., None, None].expand(4, 5, 3, 6, 7)
    torch.testing.assert_close(net(x, spatial), out)  # a constant map is the same as the vector
    torch.testing.assert_close(net(x[1, 2], vector[1, 2]), out[1, 2])


def test_convnet_errors() -> None:
    net = ConvNet(2, 4, (8,), context=3)
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 3\) or \(\*batch, 3, 5, 5\)"):
        net(torch.randn(2, 2, 5, 5), torch.randn(2, 4))
    with pytest.raises(ValueError, match="expected a context with 3 features, got None"):
        net(torch.randn(2, 2, 5, 5))
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 2, H, W\)"):
        net(torch.randn(2, 3, 5, 5), torch.randn(2, 3))
    with pytest.raises(ValueError, match="unconditional"):
        ConvNet(2, 4)(torch.randn(2, 2, 5, 5), torch.randn(2, 1))
    with pytest.raises(ValueError, match="expected an odd integer kernel_size"):
        ConvNet(2, 4, kernel_size=2)
    with pytest.raises(ValueError, match="expected positive widths"):
        ConvNet(2, 0)


def test_pooled_mlp_sees_per_sample_channel_statistics() -> None:
    torch.manual_seed(0)
    net = perturb_parameters(PooledMLP(2, 3, (8,)), 0.5)
    x = torch.randn(4, 2, 5, 5)
    out = net(x)
    assert out.shape == (4, 3, 5, 5) and torch.equal(out, out[..., :1, :1].expand_as(out))
    torch.testing.assert_close(net(x[2]), out[2])  # no batch coupling
    shuffled = x.flatten(-2)[..., torch.randperm(25)].reshape(x.shape)  # same per-channel statistics
    torch.testing.assert_close(net(shuffled), out)
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 2, H, W\)"):
        net(torch.randn(4, 3, 5, 5))


def test_conv_coupling_is_exact_on_a_tiny_image_with_context() -> None:
    torch.manual_seed(1)
    t = flows.AffineCoupling((4, None, None), 2, mask=half_mask(4), conditioner=ConvNet(2, 4, (8,), context=2))
    t = perturb_parameters(t.double(), 0.2)
    x, c = torch.randn(2, 4, 3, 3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    check_bijection(t, x, c)
