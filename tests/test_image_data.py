"""MNIST from the data directory, and variational dequantization."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.data import MNIST_LEVELS, VariationalDequantizer, load_dataset, load_mnist
from flows.metrics import bits_per_dim
from flows.testing import perturb_parameters


def test_missing_mnist_names_the_expected_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"expected the data file 'mnist\.npz'.*download\('mnist\.npz'\)"):
        load_mnist(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'mnist\.npz'"):
        load_dataset("mnist", data_dir=tmp_path)


def test_a_corrupt_mnist_file_is_rejected(tmp_path: Path) -> None:
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((2, 28, 28), np.uint8), x_test=np.zeros((1, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_mnist(tmp_path)
    train, test = load_mnist(tmp_path, verify=False, image=False)  # unverified reads still check the arrays
    assert train.shape == (2, 784) and test.shape == (1, 784)
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((2, 28, 28), np.float32), x_test=np.zeros((1, 28, 28)))
    with pytest.raises(ValueError, match=r"expected x_train of shape \(N, 28, 28\) and dtype uint8"):
        load_mnist(tmp_path, verify=False)
    np.savez(tmp_path / "mnist.npz", images=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="missing"):
        load_mnist(tmp_path, verify=False)


def test_real_mnist_when_the_data_directory_is_set() -> None:
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not (Path(directory) / "mnist.npz").is_file():
        pytest.skip("FLOWS_DATA_DIR with mnist.npz is not set (CI sets it)")
    train, test = load_mnist()
    assert train.shape == (60000, 1, 28, 28) and test.shape == (10000, 1, 28, 28)
    assert train.dtype == torch.uint8 and int(train.max()) == MNIST_LEVELS - 1
    assert abs(float(train.float().mean()) / 255 - 0.13066) < 1e-4  # the documented pixel mean
    data = load_dataset("mnist", val_fraction=0.1)
    assert (len(data.train), len(data.val), len(data.test)) == (54000, 6000, 10000)
    assert data.levels == 256 and data.event_shape == (784,) and data.image_shape == (28, 28)


def _dequantizer(seed: int = 0) -> VariationalDequantizer:
    torch.manual_seed(seed)
    return perturb_parameters(VariationalDequantizer((1, 4, 4), 17, steps=3, hidden=(8, 8)).double(), 0.05)


def test_variational_noise_stays_in_its_cell_and_log_q_is_exact() -> None:
    deq = _dequantizer()
    v = torch.randint(0, 17, (64, 1, 4, 4))
    x, log_q = deq(v, generator=torch.Generator().manual_seed(1))
    u = x * 17 - v
    assert ((u > 0) & (u < 1)).all() and log_q.shape == (64,)
    torch.testing.assert_close(deq.log_prob(v, x), log_q)  # the density of the drawn noise, recomputed forwards
    # log q(u|v) against the autograd Jacobian of u -> ε for one sample
    context = deq._context(v[:1], torch.float64)
    jac = torch.autograd.functional.jacobian(lambda w: deq.transform(w.reshape(1, 1, 4, 4), context).reshape(-1), u[:1])
    eps = deq.transform(u[:1], context)
    want = deq.base.log_prob(eps) + torch.linalg.slogdet(jac.reshape(16, 16)).logabsdet
    torch.testing.assert_close(log_q[:1], want)


def test_noise_entropy_is_at_most_that_of_the_uniform() -> None:
    """Any density on the unit cube has E[-log q] <= 0 (the uniform's entropy); a wrong log q would break it."""
    deq = _dequantizer(2)
    v = torch.randint(0, 17, (4000, 1, 4, 4))
    _, log_q = deq(v, generator=torch.Generator().manual_seed(3))
    entropy = -log_q.mean()
    assert entropy < 3 * log_q.std() / math.sqrt(len(log_q))  # <= 0 up to Monte-Carlo error
    assert entropy > -50  # and finite, not degenerate


def test_variational_bits_per_dim_bound_and_gradients() -> None:
    deq = _dequantizer()
    v = torch.randint(0, 17, (8, 1, 4, 4))
    x, log_q = deq(v)
    log_p = torch.zeros(8, dtype=torch.float64)  # the uniform density on the cube
    bpd = bits_per_dim(log_p - log_q, 16, 17)
    assert torch.all(bpd.mean() >= 0)
    (log_q.sum() + x.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in deq.parameters())


def test_dequantizer_errors() -> None:
    with pytest.raises(ValueError, match="with even H and W"):
        VariationalDequantizer((1, 5, 4), 17)
    with pytest.raises(ValueError, match="expected levels to be an int >= 2"):
        VariationalDequantizer((1, 4, 4), 1)
    deq = VariationalDequantizer((1, 4, 4), 17, steps=1, hidden=(4, 4))
    with pytest.raises(ValueError, match=r"expected levels_data of shape \(\*batch, 1, 4, 4\)"):
        deq(torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected x in \(\(v \+ 0\)/K, \(v \+ 1\)/K\)"):
        deq.log_prob(torch.zeros(1, 1, 4, 4, dtype=torch.long), torch.full((1, 1, 4, 4), 0.5))
