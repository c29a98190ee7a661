"""MADE, masked autoregressive transforms and the MAF / IAF / NSF builders."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flows
from flows import IAF, MADE, MAF, NSF, MaskedAutoregressive, RationalQuadraticSpline
from flows.bijections.transformers import AffineTransformer
from flows.testing import check_bijection, perturb_parameters

MADE_VARIANTS = [
    {},
    {"order": [2, 0, 4, 1, 3]},
    {"hidden_degrees": "random"},
    {"residual": True, "hidden": (12, 12, 12)},
    {"context": 2, "order": [4, 3, 2, 1, 0]},
    {"context": 2, "residual": True, "hidden": (9, 9), "hidden_degrees": "random"},
]


def _made(features: int = 5, per_feature: int = 3, seed: int = 0, **kwargs) -> MADE:
    torch.manual_seed(seed)
    kwargs = {"hidden": (11, 10), **kwargs}
    gen = torch.Generator().manual_seed(seed)
    made = MADE(features, features * per_feature, zero_init=False, generator=gen, **kwargs).double()
    return perturb_parameters(made, 0.3)


@pytest.mark.parametrize("kwargs", MADE_VARIANTS, ids=str)
def test_made_is_autoregressive_in_its_order(kwargs) -> None:
    made, d, p = _made(**kwargs), 5, 3
    c = torch.randn(made.context_features, dtype=torch.float64) if made.context_features else None
    allowed = made.order[:, None] > made.order[None, :]  # output feature i may depend on input j
    for _ in range(3):
        x = torch.randn(d, dtype=torch.float64)
        jac = torch.autograd.functional.jacobian(lambda v: made(v, c).view(p, d), x)  # (P, D, D)
        assert jac[:, ~allowed].abs().max() == 0
    # the masks allow only autoregressive paths, and with sequential degrees every one of them
    reach = made.masks()[0][:, :d].double()
    for mask in made.masks()[1:]:
        reach = (mask.double() @ reach).clamp(max=1)
    paths = reach.view(p, d, d).amax(0) > 0
    assert not (paths & ~allowed).any()
    if kwargs.get("hidden_degrees") != "random":
        assert torch.equal(paths, allowed)
    if made.context_features and kwargs.get("hidden_degrees") != "random":  # every output sees the context
        reach_c = made.masks()[0][:, d:].double()
        for mask in made.masks()[1:]:
            reach_c = mask.double() @ reach_c
        assert (reach_c > 0).all()


@pytest.mark.parametrize("kwargs", MADE_VARIANTS, ids=str)
@pytest.mark.parametrize("grad", [False, True])
def test_made_solve_reproduces_forward(kwargs, grad: bool) -> None:
    made = _made(**kwargs)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    c = torch.randn(2, 3, made.context_features, dtype=torch.float64) if made.context_features else None
    full = made(x, c).unflatten(-1, (3, 5))
    seen: dict[int, torch.Tensor] = {}

    def step(i: int, params: torch.Tensor) -> torch.Tensor:
        seen[i] = params
        return x[..., i]

    with torch.set_grad_enabled(grad):
        solved = made.solve(step, (2, 3), c)
    assert torch.equal(solved, x)
    assert sorted(seen) == list(range(5))
    for i, params in seen.items():
        torch.testing.assert_close(params, full[..., i], atol=1e-12, rtol=0)


def test_made_solve_computes_every_hidden_unit_once() -> None:
    """No wasted recomputation: over the D steps, the activation sees each hidden unit once per sample."""

    class Counting(nn.ReLU):
        count = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Counting.count += x.numel()
            return super().forward(x)

    torch.manual_seed(0)
    made = MADE(16, 32, hidden=(40, 40), context=3, activation=Counting)
    with torch.no_grad():
        made.solve(lambda i, p: p[..., 0], (7,), torch.randn(7, 3))
    assert Counting.count == 7 * (40 + 40)


def test_made_solve_is_differentiable_like_a_naive_sequential_inverse() -> None:
    t = MaskedAutoregressive(4, 2, transformer=RationalQuadraticSpline(4), hidden=(8,))
    t = perturb_parameters(t.double(), 0.5)
    z, c = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    x, ladj = t.inverse_and_log_det(z, c)
    (x.sin().sum() + ladj.sum()).backward()
    fast = [p.grad.clone() for p in t.parameters()]
    t.zero_grad()
    # naive: D full MADE passes, feature i taken from pass i
    xs = torch.zeros_like(z)
    ladj_naive = torch.zeros(6, dtype=torch.float64)
    for i in range(4):
        params = t._params(t.conditioner(xs, c))[:, i]
        x_i, l_i = t.transformer.inverse_and_log_det(z[:, i], params)
        xs = torch.cat([xs[:, :i], x_i[:, None], xs[:, i + 1 :]], 1)
        ladj_naive = ladj_naive + l_i
    torch.testing.assert_close(xs, x)
    torch.testing.assert_close(ladj_naive, ladj)
    (xs.sin().sum() + ladj_naive.sum()).backward()
    for g, p in zip(fast, t.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_masked_autoregressive_uses_the_context() -> None:
    torch.manual_seed(0)
    t = perturb_parameters(MaskedAutoregressive(3, 2, transformer=AffineTransformer(), hidden=(8,)), 0.3)
    x = torch.randn(4, 3)
    z1, z2 = t(x, torch.zeros(4, 2)), t(x, torch.ones(4, 2))
    assert not torch.allclose(z1[:, 0], z2[:, 0])  # even the first feature depends on the context
    with pytest.raises(ValueError, match=r"MaskedAutoregressive: expected a context of shape \(\*batch, 2\), got None"):
        t(x)


def test_iaf_samples_in_one_pass_and_scores_its_own_samples() -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(IAF(4, 2, transforms=3, hidden=(16,)).double(), 0.2)
    calls = {"solve": 0}
    for layer in flow.transform:
        original = layer.transform.conditioner.solve

        def counting(*args, _original=original, **kwargs):
            calls["solve"] += 1
            return _original(*args, **kwargs)

        layer.transform.conditioner.solve = counting
    c = torch.randn(2, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob((5,), c)
    assert calls["solve"] == 0  # sampling never runs the sequential solve
    torch.testing.assert_close(flow.log_prob(x, c.expand(5, 2)), log_p)
    assert calls["solve"] == 3  # the density of arbitrary data does, once per layer


@pytest.mark.parametrize(
    "builder",
    [
        lambda: MAF(2, transforms=3, hidden=(16,)),
        lambda: MAF(2, transforms=2, hidden=(16, 16), residual=True, batch_norm=True),
        lambda: IAF(2, transforms=3, hidden=(16,)),
        lambda: NSF(2, transforms=2, hidden=(16,), bins=4, bound=4.0),
        lambda: NSF(2, transforms=2, hidden=(16,), bins=4, bound=4.0, coupling=True, lu=True),
    ],
    ids=["maf", "maf-residual-bn", "iaf", "nsf", "nsf-coupling-lu"],
)
def test_two_dimensional_density_integrates_to_one(builder) -> None:
    torch.manual_seed(1)
    flow = perturb_parameters(builder().double(), 0.2)
    flow.eval()
    if any(isinstance(m, flows.BatchNorm) for m in flow.modules()):
        for m in flow.modules():
            if isinstance(m, flows.BatchNorm):
                m.running_mean.fill_(0.3)
                m.running_var.fill_(2.0)
    grid = torch.linspace(-12, 12, 601, dtype=torch.float64)
    step = float(grid[1] - grid[0])
    xx, yy = torch.meshgrid(grid, grid, indexing="ij")
    with torch.no_grad():
        density = flow.log_prob(torch.stack([xx, yy], -1)).exp()
    assert abs(float(density.sum()) * step**2 - 1.0) < 3e-3


@pytest.mark.parametrize("coupling", [False, True])
def test_nsf_builder_is_a_bijection_with_alternating_orders(coupling: bool) -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(NSF(5, 3, transforms=3, hidden=(8,), bins=3, coupling=coupling).double(), 0.3)
    x, c = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    check_bijection(flow.transform, x, c)
    if not coupling:
        orders = [layer.conditioner.order.tolist() for layer in flow.transform]
        assert orders == [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 1, 2, 3, 4]]


def test_random_orders_are_reproducible() -> None:
    def orders(seed: int) -> list[list[int]]:
        flow = MAF(6, transforms=3, hidden=(8,), randperm=True, generator=torch.Generator().manual_seed(seed))
        return [layer.conditioner.order.tolist() for layer in flow.transform]

    assert orders(0) == orders(0) and orders(0) != orders(1)


def test_training_reduces_the_loss() -> None:
    """A few Adam steps on a correlated 2D Gaussian lower the NLL of every builder."""
    torch.manual_seed(0)
    data = torch.randn(256, 2) @ torch.tensor([[1.0, 0.9], [0.0, 0.4]]) + 1.0
    for flow in (MAF(2, transforms=2, hidden=(16,)), NSF(2, transforms=2, hidden=(16,)), IAF(2, transforms=1)):
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
        with torch.no_grad():
            before = -flow.log_prob(data).mean()
        for _ in range(30):
            loss = -flow.log_prob(data).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            after = -flow.log_prob(data).mean()
        assert after < before - 0.3


def test_dropout_acts_in_train_mode_only() -> None:
    torch.manual_seed(0)
    flow = perturb_parameters(NSF(4, transforms=2, hidden=(32,), dropout=0.5).double(), 0.3)
    x = torch.randn(6, 4, dtype=torch.float64)
    flow.train()
    assert not torch.equal(flow.log_prob(x), flow.log_prob(x))  # stochastic while training
    with flows.evaluating(flow):
        first = flow.log_prob(x)
        assert torch.equal(first, flow.log_prob(x))
        check_bijection(flow.transform, x)  # in eval mode: deterministic and exactly invertible
    with pytest.raises(ValueError, match=r"MADE: expected 0 <= dropout < 1, got 1\.0"):
        MADE(3, 6, dropout=1.0)
    with pytest.raises(ValueError, match="NSF: dropout, residual and randperm are options of the autoregressive"):
        NSF(4, coupling=True, dropout=0.1)
    with pytest.raises(ValueError, match=r"coupling=True with dropout=0\.0, residual=False, randperm=True"):
        NSF(4, coupling=True, randperm=True)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"MADE: expected out_features to be a positive multiple of in_features=3"):
        MADE(3, 7)
    with pytest.raises(ValueError, match=r"MADE: expected order to be a permutation of range\(3\), got \[0, 0, 1\]"):
        MADE(3, 6, order=[0, 0, 1])
    with pytest.raises(ValueError, match="MADE: residual=True needs equal hidden widths"):
        MADE(3, 6, hidden=(8, 4), residual=True)
    with pytest.raises(ValueError, match="MADE: expected at least one hidden layer"):
        MADE(3, 6, hidden=())
    with pytest.raises(ValueError, match=r"MADE: expected hidden degrees in \[-1, 1\]"):
        MADE(3, 6, hidden=(2,), hidden_degrees=[torch.tensor([0, 2])])
    with pytest.raises(ValueError, match="MADE: expected hidden_degrees 'sequential', 'random'"):
        MADE(3, 6, hidden_degrees="fancy")
    with pytest.raises(ValueError, match="expected a MADE conditioner with 3 inputs and 6 outputs"):
        MaskedAutoregressive(3, transformer=AffineTransformer(), conditioner=MADE(3, 9))
    with pytest.raises(ValueError, match="MAF: expected features to be an int >= 1, got 0"):
        MAF(0)
    with pytest.raises(
        ValueError, match=r"NSF: expected features to be an int >= 2 \(couplings need two parts\), got 1"
    ):
        NSF(1, coupling=True)
    with pytest.raises(ValueError, match="IAF: expected transforms to be an int >= 1, got 0"):
        IAF(3, transforms=0)
    with pytest.raises(ValueError, match="expected bins to be an int >= 1"):
        NSF(3, bins=0)
