"""NanoFlow parameter sharing: one network, per-step embeddings and gates, exact bijections."""

from __future__ import annotations

import pytest
import torch

from flows import NICE, RealNVP
from flows.nn.sharing import StepConditioner
from flows.testing import check_bijection, perturb_parameters


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameters_grow_only_by_embeddings_and_gates() -> None:
    d, e = 6, 5
    counts = [_count(RealNVP(d, transforms=k, hidden=(32, 32), share_conditioner=True, embedding=e)) for k in (2, 4, 8)]
    per_step = e + 2 * (d // 2)  # embedding + gate over the conditioner's outputs
    assert counts[1] - counts[0] == 2 * per_step
    assert counts[2] - counts[1] == 4 * per_step
    unshared = [_count(RealNVP(d, transforms=k, hidden=(32, 32))) for k in (2, 4, 8)]
    assert unshared[2] - unshared[1] > 100 * (counts[2] - counts[1])


def test_one_network_for_all_steps_and_each_step_is_exact() -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(RealNVP(6, transforms=4, hidden=(16,), share_conditioner=True).double(), 0.2)
    couplings = [t for t in flow.transform if hasattr(t, "conditioner")]
    assert all(isinstance(c.conditioner, StepConditioner) for c in couplings)
    assert len({id(c.conditioner.shared) for c in couplings}) == 1
    x = torch.randn(3, 6, dtype=torch.float64)
    for coupling in couplings:
        check_bijection(coupling, x)
        x = coupling(x).detach()
    # steps differ through their embeddings: same input, different outputs
    probe = torch.randn(2, 6, dtype=torch.float64)
    assert not torch.allclose(couplings[0](probe), couplings[2](probe))


def test_odd_dimension_shares_per_mask_shape() -> None:
    flow = NICE(5, transforms=4, hidden=(8,), share_conditioner=True)
    couplings = [t for t in flow.transform if hasattr(t, "conditioner")]
    assert len({id(c.conditioner.shared) for c in couplings}) == 2  # kept 3 / kept 2


def test_shared_model_round_trips_through_state_dict() -> None:
    torch.manual_seed(0)
    a = perturb_parameters(RealNVP(4, transforms=3, hidden=(8,), share_conditioner=True))
    b = RealNVP(4, transforms=3, hidden=(8,), share_conditioner=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 4)
    assert torch.equal(a.log_prob(x), b.log_prob(x))


def test_bad_embedding() -> None:
    with pytest.raises(ValueError, match="embedding width >= 1, got 0"):
        RealNVP(4, share_conditioner=True, embedding=0)


def test_glow_shares_one_network_per_level_with_embedding_maps() -> None:
    from flows import Glow

    counts = [
        _count(Glow((1, 8, 8), scales=2, steps=k, hidden=(16, 16), share_conditioner=True, embedding=3)) for k in (2, 4)
    ]
    unshared = [_count(Glow((1, 8, 8), scales=2, steps=k, hidden=(16, 16))) for k in (2, 4)]
    assert counts[1] - counts[0] < (unshared[1] - unshared[0]) / 3
    glow = Glow((1, 8, 8), scales=2, steps=3, hidden=(16, 16), share_conditioner=True, embedding=3)
    steps = [m for m in glow.modules() if isinstance(m, StepConditioner)]
    assert len(steps) == 6 and len({id(s.shared) for s in steps}) == 2  # one network per level
    assert {tuple(s.embedding.shape) for s in steps} == {(3, 4, 4), (3, 2, 2)}  # maps at each level's size
    x = torch.rand(4, 1, 8, 8)
    log_p = glow.log_prob(x)
    assert log_p.shape == (4,) and torch.isfinite(log_p).all()
