"""The samplers agree on names: HMC(leapfrog_steps=) as HMCBlock, GlobalLocal(local_steps=); old names still work."""

from __future__ import annotations

import warnings

import pytest
import torch

from flows import RealNVP
from flows.mcmc import HMC, IMH, MALA, GlobalLocal, RandomWalk, sample
from flows.targets import Gaussian


def _gaussian_chains(kernel, seed: int = 3):
    torch.manual_seed(seed)
    return sample(kernel, torch.zeros(4, 2), 5, warmup=3).samples


def test_hmc_n_leapfrog_is_leapfrog_steps() -> None:
    target = Gaussian(2)
    with pytest.warns(DeprecationWarning, match=r"HMC: n_leapfrog= is deprecated, use leapfrog_steps="):
        old = HMC(target, 0.3, n_leapfrog=4)
    new = HMC(target, 0.3, leapfrog_steps=4)
    assert new.leapfrog_steps == old.leapfrog_steps == 4 and "leapfrog_steps=4" in repr(new)
    with pytest.warns(DeprecationWarning, match=r"HMC.n_leapfrog is deprecated, use .leapfrog_steps"):
        assert new.n_leapfrog == 4
    torch.testing.assert_close(_gaussian_chains(old), _gaussian_chains(new), rtol=0, atol=0)
    with pytest.raises(ValueError, match="HMC: expected leapfrog_steps to be a positive int, got 0"):
        HMC(target, leapfrog_steps=0)


def test_global_local_n_local_is_local_steps() -> None:
    target = Gaussian(2)

    def kernel(**options):
        torch.manual_seed(0)
        return GlobalLocal(IMH(target, RealNVP(2, transforms=1, hidden=(4,))), MALA(target), **options)

    with pytest.warns(DeprecationWarning, match=r"GlobalLocal: n_local= is deprecated, use local_steps="):
        old = kernel(n_local=2)
    new = kernel(local_steps=2)
    assert old.local_steps == 2
    with pytest.warns(DeprecationWarning, match="GlobalLocal.n_local is deprecated"):
        assert new.n_local == 2
    torch.testing.assert_close(_gaussian_chains(old), _gaussian_chains(new), rtol=0, atol=0)


def test_the_kernels_keep_their_default_step_sizes() -> None:
    target = Gaussian(2)
    assert [float(k(target).step_size) for k in (RandomWalk, MALA, HMC)] == [0.5, 0.1, 0.1]
    assert float(MALA(target, 0.3).step_size) == 0.3


def test_new_spellings_do_not_warn() -> None:
    target = Gaussian(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        HMC(target, leapfrog_steps=2)
        GlobalLocal(IMH(target, RealNVP(2, transforms=1, hidden=(4,))), MALA(target), local_steps=1)
