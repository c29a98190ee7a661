"""The samplers agree on names: HMC(leapfrog_steps=) as HMCBlock, GlobalLocal(local_steps=); the old names are gone."""

from __future__ import annotations

import pytest

from flows import RealNVP
from flows.mcmc import HMC, IMH, MALA, GlobalLocal, RandomWalk
from flows.targets import Gaussian


def test_hmc_takes_leapfrog_steps_as_hmcblock() -> None:
    target = Gaussian(2)
    kernel = HMC(target, 0.3, leapfrog_steps=4)
    assert kernel.leapfrog_steps == 4 and "leapfrog_steps=4" in repr(kernel)
    with pytest.raises(ValueError, match="HMC: expected leapfrog_steps to be an int >= 1, got 0"):
        HMC(target, leapfrog_steps=0)
    with pytest.raises(TypeError, match="n_leapfrog"):  # the old name was removed, not kept as an alias
        HMC(target, 0.3, n_leapfrog=4)
    assert not hasattr(kernel, "n_leapfrog")


def test_global_local_takes_local_steps() -> None:
    target = Gaussian(2)

    def kernel(**options):
        return GlobalLocal(IMH(target, RealNVP(2, transforms=1, hidden=(4,))), MALA(target), **options)

    assert kernel(local_steps=2).local_steps == 2
    with pytest.raises(TypeError, match="n_local"):
        kernel(n_local=2)
    assert not hasattr(kernel(), "n_local")


def test_the_kernels_keep_their_default_step_sizes() -> None:
    target = Gaussian(2)
    assert [float(k(target).step_size) for k in (RandomWalk, MALA, HMC)] == [0.5, 0.1, 0.1]
    assert float(MALA(target, 0.3).step_size) == 0.3
