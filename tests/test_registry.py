"""The generic transform suite: every registry case in float64, away from its initialisation."""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil

import pytest
import torch

import flows
from flows.bijections.base import Bijection
from flows.testing import check_bijection, perturb_parameters
from tests.registry import Case, all_cases

CASES = all_cases()

# Exported Bijection subclasses that cannot have a registry case, each with the reason.
EXEMPT: dict[str, str] = {
    "Bijection": "abstract base class of the contract",
    # Stochastic blocks (SNF): random maps whose second output is the path term ΔS, not a
    # log-determinant; tested by the SNF oracles of Wu, Köhler, Noé (2020) in tests/test_stochastic.py
    # (ΔS = u(out) - u(in) for detailed-balance kernels, exact importance weights Gaussian -> Gaussian).
    "StochasticBlock": "abstract base of the stochastic blocks (random maps, not bijections)",
    "MetropolisBlock": "random map (Metropolis kernel); ladj is the path term ΔS, see tests/test_stochastic.py",
    "LangevinBlock": "random map (Langevin kernel); ladj is the path term ΔS, see tests/test_stochastic.py",
    "HMCBlock": "random map (HMC kernel); ladj is the path term ΔS, see tests/test_stochastic.py",
    "InjectiveLinear": (
        "injective R^d -> R^D: the Jacobian is D x d (not square) and the forward map is only a left inverse "
        "(a projection), so check_bijection does not apply; tests/test_injective.py checks the volume term "
        "against the autograd Jacobian, the left inverse, the projection and the on-manifold normalisation"
    ),
    "FreeFormInjective": (
        "free-form encoder/decoder: D x d Jacobian and the encoder is only approximately the decoder's left "
        "inverse (after training); tests/test_injective.py checks the exact volume term against autograd and "
        "closed forms, and the FIF surrogate oracles"
    ),
}


def _prepared(case: Case, seed: int = 0) -> Bijection:
    """Build, convert to float64, run the data-dependent warm-up if any, perturb the parameters."""
    torch.manual_seed(seed)
    t = case.make().double()
    gen = torch.Generator().manual_seed(seed + 1)
    if case.warmup:
        t.train()
        with torch.no_grad():
            t(case.inputs((16,), gen), case.contexts((16,), gen))
    perturb_parameters(t, case.perturb, generator=torch.Generator().manual_seed(seed + 2))
    return t


def _inputs(case: Case, batch, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return case.inputs(batch, gen), case.contexts(batch, gen)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_check_bijection(case: Case) -> None:
    t = _prepared(case)
    x, c = _inputs(case, (3,))
    check_bijection(t, x, c, atol=case.atol, rtol=case.atol)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_batch_shapes(case: Case) -> None:
    """Any leading batch shape works and gives the same per-sample results."""
    t = _prepared(case)
    for batch in case.batch_shapes:
        x, c = _inputs(case, batch)
        z, ladj = t.forward_and_log_det(x, c)
        assert ladj.shape == torch.Size(batch)
        assert z.shape[: len(batch)] == torch.Size(batch)
        x_back, ladj_inv = t.inverse_and_log_det(z, c)
        assert ladj_inv.shape == torch.Size(batch)
        torch.testing.assert_close(x_back, x, atol=case.atol or 1e-7, rtol=case.atol or 1e-7)
        if len(batch) == 2:  # the (2, 3) layout agrees with the flattened (6,) layout
            flat_x = x.reshape(-1, *x.shape[2:])
            flat_c = None if c is None else c.reshape(-1, c.shape[-1])
            z_flat, ladj_flat = t.forward_and_log_det(flat_x, flat_c)
            torch.testing.assert_close(z_flat.reshape(z.shape), z)
            torch.testing.assert_close(ladj_flat.reshape(ladj.shape), ladj)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_reach_every_parameter(case: Case) -> None:
    """Backpropagation through both directions reaches every parameter and the input."""
    t = _prepared(case)
    x, c = _inputs(case, (4,))
    x.requires_grad_(True)
    z, ladj = t.forward_and_log_det(x, c)
    x_back, ladj_inv = t.inverse_and_log_det(z, c)
    loss = z.square().sum() + ladj.sum() + x_back.sin().sum() + ladj_inv.sum()
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in t.named_parameters():
        assert p.grad is not None, f"no gradient reached {name}"
        assert torch.isfinite(p.grad).all(), f"non-finite gradient for {name}"
        assert p.grad.abs().sum() > 0, f"zero gradient for {name}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_state_dict_round_trip(case: Case) -> None:
    t = _prepared(case)
    fresh = _prepared(case, seed=10)  # different random state and perturbation
    fresh.load_state_dict(t.state_dict())
    t.eval()
    fresh.eval()
    x, c = _inputs(case, (4,))
    z, ladj = t.forward_and_log_det(x, c)
    z2, ladj2 = fresh.forward_and_log_det(x, c)
    assert torch.equal(z, z2) and torch.equal(ladj, ladj2)
    # and a deep copy (what checkpointing and DDP rely on) behaves identically
    z3, _ = copy.deepcopy(t).forward_and_log_det(x, c)
    assert torch.equal(z, z3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_train_eval_parity(case: Case) -> None:
    t = _prepared(case)
    x, c = _inputs(case, (4,))
    t.train()
    z_train, ladj_train = t.forward_and_log_det(x, c)
    t.eval()
    z_eval, ladj_eval = t.forward_and_log_det(x, c)
    if case.train_eval_parity:
        torch.testing.assert_close(z_train, z_eval)
        torch.testing.assert_close(ladj_train, ladj_eval)
    else:  # declared batch-dependent in train mode: eval must still be a proper bijection
        check_bijection(t, x, c, atol=case.atol, rtol=case.atol)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_float32_matches_float64(case: Case) -> None:
    t64 = _prepared(case).eval()
    t32 = copy.deepcopy(t64).float()
    x, c = _inputs(case, (4,))
    z64, ladj64 = t64.forward_and_log_det(x, c)
    z32, ladj32 = t32.forward_and_log_det(x.float(), None if c is None else c.float())
    assert z32.dtype == torch.float32 and ladj32.dtype == torch.float32
    torch.testing.assert_close(z32.double(), z64, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(ladj32.double(), ladj64, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_repr_names_the_class(case: Case) -> None:
    t = case.make()
    assert type(t).__name__ in repr(t)


def _exported_bijections() -> dict[str, type]:
    """Every Bijection subclass named in the ``__all__`` of any module of the package."""
    found: dict[str, type] = {}
    modules = [flows] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(flows.__path__, prefix="flows.")
        if not info.name.split(".")[-1].startswith("_")
    ]
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, Bijection):
                found[obj.__name__] = obj
    return found


def test_every_exported_transform_is_registered() -> None:
    covered: set[type] = set()
    for case in CASES:
        torch.manual_seed(0)
        covered.add(type(case.make()))
    missing = sorted(name for name, cls in _exported_bijections().items() if cls not in covered and name not in EXEMPT)
    assert not missing, f"exported transforms with no registry case: {missing} (add them to tests/registry/)"
