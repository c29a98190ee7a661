"""Residual blocks: the Russian-roulette log-det is unbiased (value and Neumann gradient), the Lipschitz bound holds."""

from __future__ import annotations

import pytest
import torch

import flows
from flows.bijections.residual import LipSwish, roulette_log_det, structured_roulette_log_det


def _block(features: int = 4, **options) -> flows.ResidualBlock:
    torch.manual_seed(0)
    block = flows.ResidualBlock(features, hidden=(16,), coefficient=0.9, **options).double()
    with torch.no_grad():
        for layer in block.layers:
            layer.weight.mul_(3.0)  # well above the bound: the normalisation is active
    return block


def _estimates(block, x: torch.Tensor, calls: int) -> torch.Tensor:
    """``calls`` independent estimates (one draw of N per call, the mean over the batch's probes)."""
    out = []
    for _ in range(calls):
        out.append(block.forward_and_log_det(x)[1].detach().mean())
    return torch.stack(out)


def test_roulette_estimator_is_unbiased_against_the_exact_log_det() -> None:
    block = _block(log_det="roulette")
    x = torch.randn(1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).expand(64, 4)
    block.eval()
    exact = block.forward_and_log_det(x[:1])[1].item()
    block.train()
    torch.manual_seed(2)
    draws = _estimates(block, x, 300)
    mean, se = draws.mean().item(), draws.std().item() / 300**0.5
    assert abs(mean - exact) <= 3 * se, (mean, exact, se)
    assert draws.std() > 0  # it is an estimator (random), not the exact value in disguise
    single = block.forward_and_log_det(x)[1].detach()
    print(f"exact {exact:.5f}, mean {mean:.5f} +- {se:.5f}; variance of one draw ~ {single.var().item():.4g}")


def test_neumann_gradient_is_unbiased() -> None:
    block = _block(log_det="roulette")
    x = torch.randn(1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).expand(64, 4)
    weight = block.layers[0].weight
    block.eval()
    (exact,) = torch.autograd.grad(block.forward_and_log_det(x[:1])[1].sum(), weight)
    block.train()
    torch.manual_seed(4)
    grads = []
    for _ in range(200):
        (g,) = torch.autograd.grad(block.forward_and_log_det(x)[1].mean(), weight)
        grads.append(g)
    grads = torch.stack(grads)
    mean, se = grads.mean(0), grads.std(0) / 200**0.5
    assert ((mean - exact).abs() <= 3 * se + 1e-12).float().mean() >= 0.95  # per-entry 3-SE band (~99.7%)


def test_eval_mode_uses_the_exact_log_det_even_with_the_estimator() -> None:
    block = _block(log_det="roulette").eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    first, second = block.forward_and_log_det(x)[1], block.forward_and_log_det(x)[1]
    assert torch.equal(first, second)
    flows.check_bijection(block, x)


def test_every_layer_respects_the_spectral_bound() -> None:
    """In evaluation the power iteration runs to convergence: the bound holds to rounding."""
    block = _block().eval()
    for layer in block.layers:
        sigma = torch.linalg.matrix_norm(layer.normalized_weight().detach(), ord=2).item()
        assert sigma <= 0.9 * (1 + 1e-9)
        assert sigma == pytest.approx(0.9, rel=1e-6)  # weights were scaled up: normalised to the bound


def test_lipswish_is_one_lipschitz() -> None:
    act = LipSwish().double()
    x = torch.linspace(-10, 10, 2001, dtype=torch.float64, requires_grad=True)
    for raw_beta in (-3.0, 0.0, 2.0, 8.0):
        with torch.no_grad():
            act.raw_beta.fill_(raw_beta)
        (dx,) = torch.autograd.grad(act(x).sum(), x)
        assert dx.abs().max() <= 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"coefficient": 1.0}, r"expected 0 < coefficient < 1 \(a contraction\), got 1.0"),
        ({"log_det": "series"}, "expected log_det to be one of"),
        ({"hidden": 8}, "expected hidden to be a sequence of positive ints, got 8"),
    ],
)
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        flows.ResidualBlock(3, **options)


def test_residual_flow_samples_with_the_density_of_its_samples() -> None:
    torch.manual_seed(0)
    flow = flows.ResidualFlow(3, 2, transforms=2, hidden=(8,)).double().eval()
    context = torch.randn(4, 2, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob((2,), context=context)
    torch.testing.assert_close(log_p, flow.log_prob(x, context=context), atol=1e-8, rtol=1e-8)


def test_residual_flow_trains_with_the_estimator_in_high_dimension() -> None:
    """D = 20 > 16: "auto" trains with the roulette estimator; a step runs and moves the parameters."""
    torch.manual_seed(1)
    flow = flows.ResidualFlow(20, transforms=1, hidden=(16,), actnorm=False)
    assert flow.transform[0]._use_estimator()
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in flow.parameters()]
    loss = -flow.log_prob(torch.randn(32, 20)).mean()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(b, p) for b, p in zip(before, flow.parameters(), strict=True))


def _pair(block, x: torch.Tensor, event_ndim: int, seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The autograd-loop and the structured estimator from the same draws: values and gradients."""
    weights = [layer.normalized_weight() for layer in block.layers]
    inputs = [x, *block.parameters()]
    out = []
    for structured in (False, True):
        torch.manual_seed(seed)
        if structured:
            gx, ladj = structured_roulette_log_det(block.layers, block.activations, weights, x, None, event_ndim)
        else:
            gx, ladj = roulette_log_det(lambda v: block._branch(v, None, weights), x, event_ndim)
        grads = torch.autograd.grad(ladj.sum() + gx.sum(), inputs, retain_graph=True, allow_unused=True)
        out.append((ladj, grads))
    return out


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: flows.ResidualBlock(6, hidden=(16, 16), coefficient=0.9), (5, 6)),
        (lambda: flows.ConvResidualBlock((2, 4, 4), hidden=(4, 4), coefficient=0.9), (3, 2, 4, 4)),
    ],
)
def test_the_structured_estimator_is_the_autograd_estimator(make, shape) -> None:
    """Same draws of N and v: the structured evaluation gives the same estimate and Neumann gradient."""
    torch.manual_seed(0)
    block = make().double().train()
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    for seed in range(3):
        (ladj_loop, grads_loop), (ladj_fast, grads_fast) = _pair(block, x, len(block.event_shape), seed)
        torch.testing.assert_close(ladj_fast, ladj_loop, atol=1e-12, rtol=1e-12)
        for a, b in zip(grads_loop, grads_fast, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12)


def test_conv_block_respects_the_operator_norm_bound() -> None:
    """The bound is on the convolution operator of the grid (its matrix's largest singular value)."""
    torch.manual_seed(0)
    block = flows.ConvResidualBlock((1, 3, 3), hidden=(3,), coefficient=0.8, max_iter=5000).double().eval()
    with torch.no_grad():
        for layer in block.layers:
            layer.weight.mul_(4.0)
            layer._power_iteration(5000, store=True)
    for layer in block.layers:
        w = layer.normalized_weight().detach()
        basis = torch.eye(layer.v.numel(), dtype=torch.float64).reshape(-1, *layer.v.shape)
        matrix = layer.tangent(basis, w).reshape(layer.v.numel(), -1)
        assert torch.linalg.matrix_norm(matrix, ord=2).item() == pytest.approx(0.8, rel=1e-6)


def test_image_residual_flow_log_prob_is_exact_and_samples_invert() -> None:
    torch.manual_seed(0)
    flow = flows.ResidualFlow((1, 4, 4), transforms=2, hidden=(4,)).double().eval()
    x = torch.rand(3, 1, 4, 4, dtype=torch.float64)
    log_p = flow.log_prob(x)
    jac = torch.autograd.functional.jacobian(lambda v: flow.transform(v.reshape(1, 1, 4, 4))[0], x[0].reshape(-1))
    expected = flow.base.log_prob(flow.transform(x[:1]))[0] + torch.linalg.slogdet(jac).logabsdet
    torch.testing.assert_close(log_p[0], expected, atol=1e-8, rtol=1e-8)
    samples, log_q = flow.sample_and_log_prob((2,))
    assert samples.shape == (2, 1, 4, 4)
    torch.testing.assert_close(log_q, flow.log_prob(samples), atol=1e-7, rtol=1e-7)


def test_multiscale_image_residual_flow_log_prob_is_exact_and_samples_invert() -> None:
    torch.manual_seed(2)
    flow = flows.ResidualFlow((1, 4, 4), transforms=1, hidden=(4,), scales=2).double().eval()
    splits = [m for m in flow.modules() if isinstance(m, flows.Split)]
    assert len(splits) == 1 and splits[0].event_shape == (4, 2, 2) and splits[0].keep == 2
    blocks = [m for m in flow.modules() if isinstance(m, flows.ConvResidualBlock)]
    assert [b.event_shape for b in blocks] == [(4, 2, 2), (8, 1, 1)]  # the kept half squeezed again
    for p in flow.parameters():  # away from the identity start, so the Jacobian is not trivial
        p.data += 0.1 * torch.randn_like(p)
    x = torch.rand(3, 1, 4, 4, dtype=torch.float64)
    log_p = flow.log_prob(x)
    for i in range(3):
        jac = torch.autograd.functional.jacobian(lambda v: flow.transform(v.reshape(1, 1, 4, 4))[0], x[i].reshape(-1))
        expected = flow.base.log_prob(flow.transform(x[i : i + 1]))[0] + torch.linalg.slogdet(jac).logabsdet
        torch.testing.assert_close(log_p[i], expected, atol=1e-8, rtol=1e-8)
    z = flow.transform(x)
    torch.testing.assert_close(flow.transform.inverse(z), x, atol=1e-9, rtol=1e-9)
    samples, log_q = flow.sample_and_log_prob((2,))
    assert samples.shape == (2, 1, 4, 4)
    torch.testing.assert_close(log_q, flow.log_prob(samples), atol=1e-7, rtol=1e-7)


def test_multiscale_image_residual_flow_without_the_first_squeeze() -> None:
    flow = flows.ResidualFlow((2, 4, 4), transforms=1, hidden=(4,), scales=3, squeeze=False)
    splits = [m.event_shape for m in flow.modules() if isinstance(m, flows.Split)]
    assert splits == [(2, 4, 4), (4, 2, 2)]
    assert flow.log_prob(torch.rand(2, 2, 4, 4)).shape == (2,)
    assert flow.sample((2,)).shape == (2, 2, 4, 4)


def test_image_residual_flow_trains_with_the_estimator() -> None:
    torch.manual_seed(1)
    flow = flows.ResidualFlow((1, 8, 8), transforms=1, hidden=(8,))
    block = next(m for m in flow.modules() if isinstance(m, flows.ConvResidualBlock))
    assert block._use_estimator()  # 4 x 4 x 4 = 64 > 16
    loss = -flow.log_prob(torch.rand(16, 1, 8, 8)).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in block.parameters())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: flows.ResidualFlow((1, 4, 4), 2),
            r"^ResidualFlow: image residual blocks take no context, got context=2",
        ),
        (
            lambda: flows.ResidualFlow((1, 5, 4)),
            r"^ResidualFlow: squeeze=True needs a height and width divisible by 2, got 5×4",
        ),
        (lambda: flows.ResidualFlow((1, 4)), r"^ResidualFlow: expected features to be an int or an image shape"),
        (lambda: flows.ResidualFlow(3, squeeze=True), r"^ResidualFlow: squeeze is an image option"),
        (lambda: flows.ResidualFlow(3, scales=2), r"^ResidualFlow: scales is an image option"),
        (
            lambda: flows.ResidualFlow((1, 4, 6), scales=2),
            r"^ResidualFlow: scales=2 needs a height and width divisible by 4, got 4×6",
        ),
        (
            lambda: flows.ResidualFlow((1, 4, 4), scales=2, squeeze=False),
            r"^ResidualFlow: scales=2 needs at least 2 channels to split, got 1 with squeeze=False",
        ),
        (lambda: flows.ResidualFlow((1, 4, 4), scales=0), r"^ResidualFlow: expected scales to be an int >= 1"),
        (lambda: flows.ResidualFlow(3, kernel_sizes=(3, 3)), r"^ResidualFlow: kernel_sizes is an image option"),
        (lambda: flows.ResidualFlow((1, 4, 4), hidden=(4, 0)), r"^ResidualFlow: expected hidden to be positive int"),
        (lambda: flows.ResidualFlow((1, 4, 4), transforms=0), r"^ResidualFlow: expected transforms to be an int >= 1"),
        (
            lambda: flows.ResidualFlow((1, 4, 4), hidden=(4,), kernel_sizes=(3, 2)),
            r"^ConvResidualBlock: expected kernel_sizes to be 2 odd positive ints",
        ),
        (
            lambda: flows.ConvResidualBlock((1, 4, 4), hidden=()),
            r"^ConvResidualBlock: expected hidden to be a non-empty",
        ),
        (lambda: flows.ConvResidualBlock((4, 4)), r"^ConvResidualBlock: expected an image shape \(C, H, W\)"),
    ],
)
def test_image_builder_arguments_name_what_was_expected(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
