"""Transformer autoregressive flows (TarFlow): exact oracles in float64 for the network, the block and the builder."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import flows
from flows.nn import CausalTransformer
from flows.testing import perturb_parameters


def _block(tokens: int = 5, features: int = 2, context: int = 0, *, perturb: float = 0.1, seed: int = 0, **options):
    torch.manual_seed(seed)
    options = {"width": 16, "layers": 2, "heads": 2, **options}
    t = flows.TransformerAutoregressive(tokens, features, context, **options).double()
    perturb_parameters(t, perturb, generator=torch.Generator().manual_seed(seed + 1))
    return t


def _context(t, n: int, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    if t.num_classes:
        return (torch.arange(n) % (t.num_classes + 1) - 1).double()[:, None]
    if t.context_features:
        return torch.randn(n, t.context_features, generator=gen, dtype=torch.float64)
    return None


# -- the network ------------------------------------------------------------------------------------


def test_kv_cached_decoding_equals_the_full_causal_pass_and_leaves_the_cache_unchanged() -> None:
    torch.manual_seed(0)
    net = CausalTransformer(3, 4, tokens=6, width=16, layers=2, heads=4, zero_init=False).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    full = net(x, temperature=0.7)
    out, cache = [], net.empty_cache(x)
    for s in (slice(0, 1), slice(1, 4), slice(4, 6)):  # chunks of 1, 3 and 2 tokens
        y, cache = net.decode(x[:, s], cache, temperature=0.7)
        out.append(y)
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-13, rtol=0)
    # re-entrant: decoding from the same (immutable) cache twice gives the same answer
    _, half = net.decode(x[:, :3], net.empty_cache(x))
    a, _ = net.decode(x[:, 3:4], half)
    b, _ = net.decode(x[:, 3:4] + 1.0, half)
    c, _ = net.decode(x[:, 3:4], half)
    assert torch.equal(a, c) and not torch.equal(a, b)
    # causal: changing token 4 leaves outputs 0..3 unchanged and changes output 4
    x2 = x.clone()
    x2[:, 4] += 1.0
    changed = (net(x2, temperature=0.7) - full).abs().amax(dim=(0, 2))
    assert (changed[:4] == 0).all() and changed[4] > 0


def test_the_temperature_divides_the_attention_logits() -> None:
    torch.manual_seed(0)
    net = CausalTransformer(2, 2, tokens=4, width=8, layers=1, heads=1, zero_init=False).double()
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    block = net.blocks[0]
    h = net.proj_in(x) + net.position
    q, k, v = block.qkv(block.norm1(h)).chunk(3, dim=-1)
    logits = q @ k.transpose(-1, -2) / (8**0.5 * 0.5)
    logits = logits.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    h = h + block.out(logits.softmax(-1) @ v)
    expected = net.proj_out(net.norm_out(h + block.mlp(block.norm2(h))))
    torch.testing.assert_close(net(x, temperature=0.5), expected, atol=1e-13, rtol=0)


def test_the_outputs_stay_bounded_however_large_the_input() -> None:
    """The final LayerNorm: an input 10⁶ times the usual size gives outputs of the usual size.

    Without it the residual stream carries ``W_in x`` to the output, so a flow block's shift grows
    with its input and a stack of blocks compounds the growth.
    """
    torch.manual_seed(0)
    net = CausalTransformer(3, 6, tokens=5, width=16, layers=2, heads=2, zero_init=False).double()
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    bound = net.proj_out.weight.abs().sum(1) * net.norm_out.weight.abs().max() * 4 + net.proj_out.bias.abs()
    for size in (1.0, 1e3, 1e6):
        out = net(size * x)
        assert bool((out.abs() <= bound).all())  # |LN(h)| ≤ √width = 4 per entry, times the affine


def test_the_null_class_is_the_mean_of_the_class_table_or_a_learned_row() -> None:
    torch.manual_seed(0)
    net = CausalTransformer(2, 2, tokens=3, num_classes=4, width=8, heads=1).double()
    emb = net.condition(torch.tensor([-1, 2]))
    torch.testing.assert_close(emb[0, 0], net.classes.mean(0))
    torch.testing.assert_close(emb[1, 0], net.classes[2])
    learned = CausalTransformer(2, 2, tokens=3, num_classes=4, width=8, heads=1, null_class="learned")
    assert torch.equal(learned.condition(torch.tensor([-1]))[0, 0], learned.null)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"width": 10, "heads": 4}, "expected width divisible by heads, got width=10, heads=4"),
        ({"num_classes": 2, "context_features": 3}, "expected num_classes or context_features, got both"),
        ({"null_class": "zero", "num_classes": 2}, r"expected null_class in \['mean', 'learned'\], got 'zero'"),
        ({"layers": 0}, "expected positive int sizes"),
    ],
)
def test_the_network_refuses_bad_sizes(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CausalTransformer(2, 2, tokens=3, **options)


def test_the_network_refuses_too_many_positions_and_bad_class_indices() -> None:
    net = CausalTransformer(2, 2, tokens=3, num_classes=2, width=8)
    x = torch.randn(1, 4, 2)
    with pytest.raises(ValueError, match="expected at most 3 positions, got 0 cached \\+ 4 new"):
        net(x, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"expected class indices in -1..1 \(-1: null class\), got values in 0..2"):
        net(x[:, :3].expand(2, 3, 2), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="expected class indices as an integer tensor"):
        net(x[:, :3], torch.tensor([0.0]))


# -- the block ----------------------------------------------------------------------------------------


ORDERS = {"forward": [0, 1, 2, 3, 4], "reverse": [4, 3, 2, 1, 0], "perm": [2, 4, 0, 3, 1]}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("first_token", ["identity", "transform"])
def test_the_jacobian_in_the_block_order_is_block_lower_triangular_with_diagonal_blocks(
    order: str, first_token: str
) -> None:
    perm = ORDERS[order]
    t = _block(5, 3, order=perm if order == "perm" else order, first_token=first_token, scale="softplus")
    x = torch.randn(5, 3, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(t, x).reshape(5, 3, 5, 3)  # [out token, c, in token, c']
    jac = jac[perm][:, :, perm]  # both sides in the block's order
    for i in range(5):
        for j in range(5):
            block = jac[i, :, j, :]
            if j > i:
                assert (block == 0).all(), f"output token {i} depends on later input token {j}"
            elif j == i:
                assert (block - torch.diag(torch.diagonal(block)) == 0).all(), "diagonal block not diagonal"
    first = jac[0, :, 0, :]
    if first_token == "identity":
        assert torch.equal(first, torch.eye(3, dtype=torch.float64))
    else:  # an affine map of token 0 whose scale does not depend on x
        other = torch.autograd.functional.jacobian(t, x + 1.0).reshape(5, 3, 5, 3)[perm][:, :, perm]
        torch.testing.assert_close(other[0, :, 0, :], first, atol=1e-14, rtol=0)
        assert not torch.allclose(first, torch.eye(3, dtype=torch.float64))
    _, ladj = t.forward_and_log_det(x)
    torch.testing.assert_close(ladj, torch.linalg.slogdet(jac.reshape(15, 15))[1], atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"scale": "softplus", "soft_clip": 3.0, "order": "reverse"},
        {"scale": "sigmoid", "first_token": "transform", "order": [1, 3, 0, 4, 2]},
        {"num_classes": 3},
        {"context": 2, "scale": "softplus"},
    ],
    ids=["exp", "softplus", "sigmoid", "classes", "context"],
)
def test_every_inverse_agrees_to_1e_12(options: dict) -> None:
    context = options.pop("context", 0)
    t = _block(5, 2, context, **options)
    x = torch.randn(4, 5, 2, dtype=torch.float64)
    c = _context(t, 4)
    z, ladj = t.forward_and_log_det(x, c)
    with torch.no_grad():
        cached = t.inverse_sequential(z, c)
        uncached = t.inverse_sequential(z, c, cached=False)
        jacobi = t.inverse_jacobi(z, c)  # T sweeps: exact
        teacher = t.inverse_teacher_forced(z, x, c)
        x_back, ladj_back = t.inverse_and_log_det(z, c)
    for name, value in {"cached": cached, "uncached": uncached, "jacobi": jacobi, "teacher": teacher}.items():
        assert (value - x).abs().max() < 1e-12, name
    assert torch.equal(x_back, cached)
    torch.testing.assert_close(ladj_back, -ladj, atol=1e-12, rtol=0)
    for decoding in ("uncached", "jacobi"):
        other = _block(5, 2, context, decoding=decoding, seed=5, **options)
        other.load_state_dict(t.state_dict())
        with torch.no_grad():
            y, ladj_other = other.inverse_and_log_det(z, c)
        assert (y - x).abs().max() < 1e-12, decoding
        torch.testing.assert_close(ladj_other, -ladj, atol=1e-12, rtol=0)


def test_jacobi_is_exact_after_t_sweeps_but_not_before() -> None:
    t = _block(6, 2, perturb=0.2)
    x = torch.randn(3, 6, 2, dtype=torch.float64)
    z = t(x)
    with torch.no_grad():
        errors = [(t.inverse_jacobi(z, iterations=k) - x).abs().amax(dim=(0, 2)) for k in range(1, 7)]
    for k, error in enumerate(errors, start=1):
        assert (error[:k] < 1e-12).all(), f"tokens < {k} not exact after {k} sweeps"
    assert errors[1][3:].max() > 1e-6  # two sweeps do not solve tokens 3..5: the test can fail
    # tolerance: stopping early when converged gives the exact answer too
    with torch.no_grad():
        assert (t.inverse_jacobi(z, iterations=50, tol=1e-14) - x).abs().max() < 1e-12


def test_the_teacher_forced_inverse_is_differentiable_and_routes_gradients_through_z() -> None:
    t = _block(4, 2)
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    z = t(x).detach().requires_grad_(True)
    x_rec = t.inverse_teacher_forced(z, x)
    x_rec.square().sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert all(p.grad is not None for p in t.net.blocks.parameters())
    with pytest.raises(ValueError, match=r"expected x of the shape of z \(3, 4, 2\), got \(3, 4, 1\)"):
        t.inverse_teacher_forced(z, x[..., :1])


def test_a_one_token_block_is_an_affine_map_that_does_not_depend_on_the_input() -> None:
    t = _block(1, 3, first_token="transform")
    x = torch.randn(4, 1, 3, dtype=torch.float64)
    z, ladj = t.forward_and_log_det(x)
    z2, ladj2 = t.forward_and_log_det(2 * x)
    torch.testing.assert_close(z2 - z, (z - t(torch.zeros_like(x))), atol=1e-13, rtol=0)
    torch.testing.assert_close(ladj2, ladj)
    identity = _block(1, 3)
    assert torch.equal(identity(x), x)


def test_the_scales_are_bounded_as_documented() -> None:
    t = _block(4, 2, scale="sigmoid", perturb=2.0)
    x = 3 * torch.randn(200, 4, 2, dtype=torch.float64)
    _, ladj = t.forward_and_log_det(x)
    assert (ladj >= -4 * 2 * torch.log(torch.tensor(2.0))).all()  # s < 2 per coordinate
    clipped = _block(4, 2, scale="exp", soft_clip=1.5, perturb=2.0)
    _, ladj = clipped.forward_and_log_det(x)
    assert (ladj.abs() <= 3 * 2 * 1.5 + 1e-12).all()  # |log s| < 1.5 on the 3 transformed tokens


def test_class_conditioning_changes_the_density_and_checks_the_indices() -> None:
    t = _block(4, 2, num_classes=3, perturb=0.3)
    x = torch.randn(2, 4, 2, dtype=torch.float64)
    _, a = t.forward_and_log_det(x, torch.tensor([[0.0], [0.0]], dtype=torch.float64))
    _, b = t.forward_and_log_det(x, torch.tensor([[1.0], [2.0]], dtype=torch.float64))
    assert (a != b).all()
    for bad, shown in ((3.0, "3.0"), (-2.0, "-2.0"), (0.5, "0.5")):
        with pytest.raises(ValueError, match=rf"expected class indices .*0..2, or -1 for the null class.*got {shown}"):
            t(x, torch.tensor([[0.0], [bad]], dtype=torch.float64))
    nan = torch.tensor([[0.0], [float("nan")]], dtype=torch.float64)
    with pytest.raises(ValueError, match="context"):
        t(x, nan)
    with pytest.raises(ValueError, match="context"):
        t.inverse_sequential(x, nan)


def test_a_continuous_context_refuses_nan_and_a_missing_context() -> None:
    t = _block(4, 2, 3)
    x = torch.randn(2, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"finite|NaN"):
        t(x, torch.tensor([[0.0, float("nan"), 1.0]] * 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 3\), got None"):
        t.inverse_jacobi(x)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": "tanh"}, r"expected scale in \['exp', 'softplus', 'sigmoid'\], got 'tanh'"),
        ({"order": "random"}, "expected order 'forward', 'reverse' or a permutation, got 'random'"),
        ({"order": [0, 1, 1, 2]}, r"expected order to be a permutation of 0..3, got \[0, 1, 1, 2\]"),
        ({"first_token": "sos"}, r"expected first_token in \['identity', 'transform'\]"),
        ({"decoding": "fast"}, r"expected decoding in \['cached', 'uncached', 'jacobi'\]"),
        ({"soft_clip": 0.0}, r"expected soft_clip to be None or a number in \(0, 1e4\], got 0.0"),
        ({"soft_clip": 1e300}, r"expected soft_clip to be None or a number in \(0, 1e4\], got 1e\+300"),
    ],
)
def test_the_block_refuses_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^TransformerAutoregressive: {message}"):
        flows.TransformerAutoregressive(4, 2, width=8, **options)


def test_the_block_refuses_an_event_of_another_token_count() -> None:
    t = _block(4, 2)
    message = r"TransformerAutoregressive: expected input of shape \(\*batch, 4, 2\), got \(3, 5, 2\)"
    with pytest.raises(ValueError, match=message):
        t(torch.randn(3, 5, 2, dtype=torch.float64))


# -- patches ------------------------------------------------------------------------------------------


def test_patchify_is_unfold_and_refuses_a_patch_that_does_not_divide() -> None:
    x = torch.randn(3, 2, 6, 4, dtype=torch.float64)
    t = flows.Patchify((2, 6, 4), 2)
    expected = F.unfold(x, 2, stride=2).transpose(1, 2)
    assert torch.equal(t(x), expected)
    assert t.event_shape_out == (6, 8)
    with pytest.raises(ValueError, match="expected a patch that divides H and W, got patch 4 for 6x4 images"):
        flows.Patchify((2, 6, 4), 4)
    with pytest.raises(ValueError, match=r"expected a concrete image shape \(C, H, W\)"):
        flows.Patchify((6, 4), 2)


# -- the builder --------------------------------------------------------------------------------------


def _tarflow(features=(1, 4, 4), **options) -> flows.TarFlow:
    torch.manual_seed(0)
    flow = flows.TarFlow(features, **{"transforms": 2, "hidden": (16,), "patch": 2, **options}).double()
    perturb_parameters(flow, 0.1, generator=torch.Generator().manual_seed(1))
    return flow


def test_tarflow_alternates_orders_and_keeps_the_data_shape_for_images_and_vectors() -> None:
    image = _tarflow(transforms=3)
    assert [b.perm.tolist()[0] for b in image.blocks] == [0, 3, 0]  # raster, reverse, raster
    assert image.tokens == 4 and image.blocks[0].features == 4
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    z, ladj = image.transform.forward_and_log_det(x)
    assert z.shape == x.shape
    torch.testing.assert_close(image.transform.inverse(z), x, atol=1e-12, rtol=0)
    jac = torch.autograd.functional.jacobian(image.transform, x[0]).reshape(16, 16)
    torch.testing.assert_close(ladj[0], torch.linalg.slogdet(jac)[1], atol=1e-12, rtol=0)
    flat = _tarflow(16, transforms=3)  # a vector that is a flattened 4x4 image, patches of 2x2
    flat.load_state_dict(image.state_dict())
    torch.testing.assert_close(flat.log_prob(x.reshape(3, 16)), image.log_prob(x), atol=1e-12, rtol=0)
    groups = _tarflow(6, patch=None, token_features=2, transforms=3)
    assert groups.tokens == 3
    v = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(groups.transform.inverse(groups.transform(v)), v, atol=1e-12, rtol=0)


def test_tarflow_sampling_is_the_inverse_of_log_prob_and_class_conditional() -> None:
    flow = _tarflow(num_classes=3)
    y = flow.class_context([0, 1, 2, -1])
    assert y.shape == (4, 1) and y.dtype == torch.float64
    x, log_p = flow.sample_and_log_prob(context=y)
    torch.testing.assert_close(log_p, flow.log_prob(x, context=y), atol=1e-10, rtol=0)
    other = flow.log_prob(x, context=flow.class_context([1, 2, 0, 0]))
    assert (other != log_p).all()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: flows.TarFlow(10, token_features=3), "expected token_features to divide features, got 3 for 10"),
        (lambda: flows.TarFlow((1, 6, 6), patch=4), "expected a patch that divides H and W, got patch 4 for 6x6"),
        (lambda: flows.TarFlow(10, patch=2), "expected a square number of features with patch=2"),
        (lambda: flows.TarFlow((4, 4)), r"expected features to be an int or an image shape \(C, H, W\)"),
        (lambda: flows.TarFlow(4, hidden=(16, 32)), r"expected hidden to be equal widths.*got \(16, 32\)"),
        (lambda: flows.TarFlow(4, hidden=64), "expected hidden to be a sequence of layer widths"),
        (lambda: flows.TarFlow(4, transforms=0), "expected transforms to be an int >= 1, got 0"),
        (lambda: flows.TarFlow(4, 2, num_classes=3), r"expected num_classes or context, got both \(3 and 2\)"),
        (lambda: flows.TarFlow(4, context=-1), "expected context to be an int >= 0, got -1"),
        (lambda: flows.TarFlow(4, scale="relu"), "expected scale in"),
    ],
)
def test_tarflow_refuses_bad_arguments(build, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_tarflow_refuses_bad_class_labels_and_nan_contexts() -> None:
    flow = _tarflow(num_classes=3)
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expected class labels in -1..2, got values in 0..3"):
        flow.class_context([0, 3])
    with pytest.raises(ValueError, match="expected class indices"):
        flow.log_prob(x, context=torch.tensor([[0.0], [7.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"NaN|finite"):
        flow.log_prob(x, context=torch.tensor([[0.0], [float("nan")]], dtype=torch.float64))
    with pytest.raises(ValueError, match="expected a class-conditional flow"):
        _tarflow().class_context([0])


def test_save_and_load_model_round_trip_tarflow(tmp_path) -> None:
    flow = _tarflow(num_classes=3, scale="softplus", soft_clip=3.0, first_token="transform").float()
    x = torch.randn(4, 1, 4, 4)
    y = flow.class_context([0, 1, 2, -1])
    flows.save_model(flow, tmp_path / "tarflow")
    loaded = flows.load_model(tmp_path / "tarflow")
    assert type(loaded) is flows.TarFlow and loaded.num_classes == 3
    flow.eval()
    assert torch.equal(loaded.log_prob(x, context=y), flow.log_prob(x, context=y))


def test_standardize_keeps_the_class_and_the_change_of_variables() -> None:
    raw = 3 * torch.randn(50, 4, dtype=torch.float64) + 7
    flow = _tarflow(4, patch=None, standardize=raw)
    plain = _tarflow(4, patch=None)
    plain.transform.load_state_dict(flow.core.state_dict())
    layer = flow.transform[0]
    assert isinstance(flow, flows.TarFlow) and isinstance(layer, flows.Standardize)
    torch.testing.assert_close(layer.loc, raw.mean(0))
    expected = plain.log_prob((raw - layer.loc) / layer.scale) - layer.scale.log().sum()
    torch.testing.assert_close(flow.log_prob(raw), expected, atol=1e-10, rtol=0)


def test_flows_models_lists_tarflow_and_flows_fit_trains_it_on_digits(tmp_path, capsys) -> None:
    from flows.cli import main
    from flows.cli.models import fit_builders

    assert "TarFlow" in fit_builders()
    out = tmp_path / "run"
    options = ["--transforms", "2", "--hidden", "16", "--threads", "1", "--option", "patch=4", "--no-plots"]
    assert main(["fit", "--data", "digits", "--model", "TarFlow", "--epochs", "1", "--out", str(out), *options]) == 0
    assert "test bits/dim:" in capsys.readouterr().out
    model = flows.load_model(out)
    assert type(model) is flows.TarFlow and model.tokens == 4


# -- guidance -----------------------------------------------------------------------------------------


def test_guidance_with_weight_zero_is_the_conditional_decode_and_otherwise_moves_the_samples() -> None:
    t = _block(5, 2, num_classes=3, first_token="transform", perturb=0.2, scale="softplus", soft_clip=2.0)
    z = torch.randn(6, 5, 2, dtype=torch.float64)
    y = _context(t, 6)
    with torch.no_grad():
        plain = t.inverse_sequential(z, y)
        for cached in (True, False):
            same = t.inverse_guided(z, y, weight=0.0, temperature=0.7, cached=cached)
            assert (same - plain).abs().max() < 1e-13 if not cached else torch.equal(same, plain)
        guided = t.inverse_guided(z, y, weight=2.0, temperature=0.7)
        assert (guided - plain).abs().max() > 1e-3
        uncached = t.inverse_guided(z, y, weight=2.0, temperature=0.7, cached=False)
        assert (uncached - guided).abs().max() < 1e-10 * guided.abs().max()
        ramp = t.inverse_guided(z, y, weight=2.0, schedule="linear")
    assert torch.equal(ramp[:, 0], plain[:, 0])  # the ramp starts at 0 on the block's first token
    assert (ramp[:, 1:] - plain[:, 1:]).abs().max() > 1e-3
    null = torch.full_like(y, -1.0)  # the null class guided toward itself: no guidance at temperature 1
    with torch.no_grad():
        assert torch.equal(t.inverse_guided(z, null, weight=3.0), t.inverse_sequential(z, null))


def test_guidance_of_an_unconditional_block_is_the_temperature_contrast() -> None:
    t = _block(4, 2, perturb=0.2)
    z = torch.randn(3, 4, 2, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(t.inverse_guided(z, weight=2.0), t.inverse_sequential(z))  # identical branches
        assert (t.inverse_guided(z, weight=2.0, temperature=0.5) - t.inverse_sequential(z)).abs().max() > 1e-4


def test_guidance_refuses_a_continuous_context_and_bad_settings() -> None:
    with pytest.raises(ValueError, match="expected a class-conditional or unconditional block for guidance"):
        _block(4, 2, 3).inverse_guided(torch.randn(1, 4, 2, dtype=torch.float64), torch.zeros(1, 3).double(), weight=1)
    t = _block(4, 2, num_classes=2)
    z, y = torch.randn(1, 4, 2, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expected schedule in \['constant', 'linear'\], got 'cosine'"):
        t.inverse_guided(z, y, weight=1.0, schedule="cosine")
    with pytest.raises(ValueError, match="expected a finite weight and a temperature > 0"):
        t.inverse_guided(z, y, weight=1.0, temperature=0.0)
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 1\), got None"):
        t.inverse_guided(z, weight=1.0)  # guidance without labels


def test_tarflow_guided_sampling_and_label_dropout() -> None:
    flow = _tarflow(num_classes=3)
    y = flow.class_context([0, 1, 2])
    torch.manual_seed(5)
    plain = flow.sample((2,), y)
    torch.manual_seed(5)
    assert torch.equal(flow.sample((2,), y, guidance=0.0), plain)
    torch.manual_seed(5)
    assert not torch.allclose(flow.sample((2,), y, guidance=3.0, temperature=0.5), plain)
    dropped = _tarflow(num_classes=3, label_dropout=1.0)
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    null = dropped.log_prob(x, context=dropped.class_context([-1, -1, -1]))
    dropped.train()
    torch.testing.assert_close(dropped.log_prob(x, context=y), null)  # every label dropped in training
    dropped.eval()
    assert (dropped.log_prob(x, context=y) != null).all()  # and none in evaluation
    with pytest.raises(ValueError, match=r"expected label_dropout in \[0, 1\] with num_classes > 0"):
        flows.TarFlow(4, label_dropout=0.1)


# -- denoising and classifying with any flow ------------------------------------------------------------


def test_tweedie_on_a_gaussian_data_and_noise_model_is_the_posterior_mean() -> None:
    mu, s, sigma = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), 0.7, 0.4
    total = (s**2 + sigma**2) ** 0.5  # y = x + σε with x ~ N(μ, s²): y ~ N(μ, s² + σ²)
    flow = flows.Flow(flows.Affine(3, shift=0.0, log_scale=0.0), flows.StandardNormal(3)).double()
    with torch.no_grad():  # z = (y - μ) / total
        flow.transform.params[..., 0] = -mu / total
        flow.transform.params[..., 1] = -torch.log(torch.tensor(total, dtype=torch.float64))
    y = torch.randn(6, 3, dtype=torch.float64) * 2
    expected = mu + s**2 / (s**2 + sigma**2) * (y - mu)
    torch.testing.assert_close(flows.tweedie_denoise(flow, y, sigma), expected, atol=1e-12, rtol=0)
    # the reference code's form: one step on the per-dimension mean loss, scaled back by B·D·σ²
    y_ = y.clone().requires_grad_(True)
    loss = -flow.log_prob(y_).mean() / 3
    (grad,) = torch.autograd.grad(loss, y_)
    torch.testing.assert_close(y - 6 * 3 * sigma**2 * grad, expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="expected sigma to be a finite number >= 0, got -1"):
        flows.tweedie_denoise(flow, y, -1)


class _ClassGaussians(flows.Bijection):
    """z = (x - μ_k) / s_k for the one-hot class k in the context: N(μ_k, s_k² I) class densities."""

    def __init__(self, means: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__(means.shape[1])
        self.context_features = means.shape[0]
        self.register_buffer("means", means)
        self.register_buffer("scales", scales)
        self.anchor = torch.nn.Parameter(torch.zeros((), dtype=means.dtype))

    def forward_and_log_det(self, x, context=None):
        mean, scale = context @ self.means, (context @ self.scales)[..., None]
        return (x - mean) / scale, -x.shape[-1] * scale[..., 0].log()


def test_the_bayes_classifier_is_the_analytic_posterior_of_a_gaussian_mixture() -> None:
    means = torch.tensor([[0.0, 0.0], [2.0, 1.0], [-1.0, 2.0]], dtype=torch.float64)
    scales = torch.tensor([1.0, 0.5, 1.5], dtype=torch.float64)
    flow = flows.Flow(_ClassGaussians(means, scales), flows.StandardNormal(2), context=3).double()
    x = torch.randn(7, 2, dtype=torch.float64) * 2
    prior = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    comp = torch.distributions.Normal(means[:, None], scales[:, None, None]).log_prob(x).sum(-1).T  # (7, 3)
    analytic = (comp + prior.log()).log_softmax(-1)
    got = flows.classify.bayes_classifier(flow, x, 3, prior.log())
    torch.testing.assert_close(got, analytic, atol=1e-12, rtol=0)
    uniform = flows.classify.bayes_classifier(flow, x, 3)
    torch.testing.assert_close(uniform, comp.log_softmax(-1), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"expected a finite log_prior of shape \(3,\), got \(2,\)"):
        flows.classify.bayes_classifier(flow, x, 3, prior[:2])
    with pytest.raises(ValueError, match=r"expected a flow with context_features 1 .* or 4"):
        flows.classify.bayes_classifier(flow, x, 4)


def test_the_bayes_classifier_of_a_tarflow_passes_class_indices() -> None:
    flow = _tarflow(num_classes=3)
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64)
    got = flows.classify.bayes_classifier(flow, x, 3)
    manual = torch.stack([flow.log_prob(x, context=flow.class_context([k] * 4)) for k in range(3)], -1)
    torch.testing.assert_close(got, manual.log_softmax(-1), atol=1e-12, rtol=0)


def test_the_benchmark_runs_end_to_end_at_a_tiny_budget(tmp_path, capsys) -> None:
    from pathlib import Path

    from tests.scripts import run_script

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "transformer_flows.py"
    threads = torch.get_num_threads()
    try:
        main = run_script(str(script), run_name="benchmark")["main"]
        argv = ["--data", "digits", "--seconds", "0.5", "--patch", "4", "--blocks", "2", "--layers", "1"]
        argv += ["--width", "16", "--eval-images", "50", "--classify-images", "20", "--out", str(tmp_path)]
        argv += ["--scale", "sigmoid", "--guidance", "1", "--save", str(tmp_path / "model")]
        result = main(argv)
    finally:
        torch.set_num_threads(threads)
    assert result["steps"] >= 1 and result["eval_images"] == 50 and result["classify_images"] == 20
    assert math.isfinite(result["bits_per_dim"]) and 0 <= result["bayes_accuracy"] <= 1
    assert result["finite_samples"] == result["finite_guided"] == 100  # the bounded scale cannot overflow
    assert result["float64_rescored"] == 0
    assert (tmp_path / "tarflow_digits_samples.png").stat().st_size > 1000
    assert (tmp_path / "tarflow_digits_guided.png").stat().st_size > 1000
    saved = flows.load_model(tmp_path / "model")
    assert saved.transform is not None and sum(p.numel() for p in saved.parameters()) == result["parameters"]
    assert "bits_per_dim" in capsys.readouterr().out


def test_the_table_benchmark_runs_end_to_end_at_a_tiny_budget(capsys) -> None:
    from pathlib import Path

    from tests.scripts import run_script

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "tarflow_tables.py"
    threads = torch.get_num_threads()
    try:
        main = run_script(str(script), run_name="benchmark")["main"]
        argv = ["--data", "digits", "--budget", "0.3", "--round", "0.15", "--tarflow-transforms", "1"]
        argv += ["--tarflow-width", "8", "--tarflow-layers", "1", "--nsf-transforms", "1", "--nsf-hidden", "8"]
        rows = main(argv)
    finally:
        torch.set_num_threads(threads)
    assert [row["model"] for row in rows] == ["TarFlow", "NSF"]
    for row in rows:
        assert row["steps"] >= 1 and row["seconds"] >= 0.3 and 1 <= row["best_step"] <= row["steps"]
        assert math.isfinite(row["test"]) and row["test"] > 0  # bits/dim of the digits
    assert "| digits | TarFlow |" in capsys.readouterr().out


def test_a_small_tarflow_learns_the_correlations_of_a_gaussian_table() -> None:
    """Maximum likelihood on a correlated 4-D Gaussian beats the best independent (diagonal) model."""
    gen = torch.Generator().manual_seed(0)
    a = torch.tensor([[1.0, 0, 0, 0], [0.9, 0.4, 0, 0], [-0.5, 0.6, 0.5, 0], [0.3, -0.7, 0.4, 0.4]])
    data = torch.randn(4096, 4, generator=gen) @ a.T
    train, test = data[:3072], data[3072:]
    torch.manual_seed(0)
    flow = flows.TarFlow(4, transforms=2, hidden=(16,), scale="softplus")
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    for _ in range(60):
        batch = train[torch.randint(len(train), (128,), generator=gen)]
        loss = -flow.log_prob(batch).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        nll = -flow.log_prob(test).mean().item()
    cov = a @ a.T
    diagonal = 0.5 * (4 * math.log(2 * math.pi * math.e) + torch.log(torch.diagonal(cov)).sum().item())
    exact = 0.5 * (4 * math.log(2 * math.pi * math.e) + torch.logdet(cov).item())
    assert nll < diagonal - 0.5 * (diagonal - exact), (nll, diagonal, exact)  # half the gap closed at least


def test_the_product_rule_decodes_from_the_normalised_product_of_the_two_gaussians() -> None:
    t = _block(5, 2, num_classes=3, first_token="transform", scale="softplus", soft_clip=2.0, perturb=0.3)
    z = torch.randn(6, 5, 2, dtype=torch.float64)
    y = _context(t, 6)
    w, tau = 1.5, 0.8
    with torch.no_grad():
        x = t.inverse_guided(z, y, weight=w, temperature=tau, rule="product")
        assert torch.equal(t.inverse_guided(z, y, weight=0.0, rule="product"), t.inverse_sequential(z, y))
        # each token's conditional and unconditional Gaussians given the decoded prefix (teacher forced)
        shifted = t._shifted(x)
        mean_c, sd_c = t._scale_shift(t.net(shifted, y[:, 0].long()), slice(None))[::-1]
        mean_u, sd_u = t._scale_shift(t.net(shifted, torch.full((6,), -1), temperature=tau), slice(None))[::-1]
    sd_c, sd_u = sd_c.exp(), torch.maximum(sd_u.exp(), sd_c.exp())  # the unconditional scale floored
    precision = (1 + w) / sd_c**2 - w / sd_u**2  # p_c^(1+w) p_u^(-w), normalised
    mean = ((1 + w) * mean_c / sd_c**2 - w * mean_u / sd_u**2) / precision
    torch.testing.assert_close(x, mean + z / precision.sqrt(), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"expected weight >= 0 with rule='product', got -1\.0"):
        t.inverse_guided(z, y, weight=-1.0, rule="product")
    with pytest.raises(ValueError, match=r"expected rule in \['tarflow', 'product'\], got 'sum'"):
        t.inverse_guided(z, y, weight=1.0, rule="sum")
