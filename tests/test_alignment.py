"""TarFlow extras in float64: representation alignment routes, the gradient classifier, noise, labelled loaders."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flows
from flows.classify import bayes_classifier, gradient_classifier
from flows.data import load_digits, load_mnist
from flows.testing import perturb_parameters
from flows.train import MaximumLikelihood, RepresentationAlignment, Trainer

BLOCKS, LAYERS, ALIGNED = 4, 2, (2, 0)  # align block 2 (of 0..3, 0 = data side), transformer layer 0


def _flow(**options) -> flows.TarFlow:
    torch.manual_seed(0)
    options = {"patch": 2, "transforms": BLOCKS, "hidden": (16,) * LAYERS, "heads": 2, "num_classes": 3, **options}
    flow = flows.TarFlow((1, 4, 4), **options).double()
    perturb_parameters(flow, 0.1, generator=torch.Generator().manual_seed(1))
    return flow


def _encoder(maps: int = 2) -> nn.Module:
    """A small frozen random CNN: (B, 1, 4, 4) -> (B, 6, maps, maps)."""
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(1, 6, 4 // maps, stride=4 // maps), nn.Tanh()).double()


def _batch(n: int = 6):
    gen = torch.Generator().manual_seed(3)
    return torch.randn(n, 1, 4, 4, generator=gen, dtype=torch.float64), (torch.arange(n) % 3).double()[:, None]


def _reached(module: nn.Module) -> set[str]:
    return {name for name, p in module.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}


def _alignment_gradients(route: str) -> tuple[list[set[str]], list[set[str]], set[str]]:
    flow = _flow()
    align = RepresentationAlignment(
        _encoder(), where=ALIGNED, route=route, width=16, features=6, projector_width=8
    ).double()
    x, y = _batch()
    _, states = align.hidden_states(flow, x, y)
    align.alignment_loss(states, align.targets(x, (2, 2))).backward()
    reached = [_reached(block) for block in flow.blocks]
    everything = [{name for name, _ in block.named_parameters()} for block in flow.blocks]
    return reached, everything, _reached(align.projector)


@pytest.mark.parametrize("route", ["reverse", "forward", "detach"])
def test_each_alignment_route_reaches_exactly_the_documented_parameters(route: str) -> None:
    reached, everything, projector = _alignment_gradients(route)
    b, layer = ALIGNED
    after = ("net.blocks.", "net.proj_out", "net.norm_out")  # the blocks and what follows them
    upto = {n for n in everything[b] if not n.startswith(after)}
    upto |= {n for n in everything[b] if any(n.startswith(f"net.blocks.{i}.") for i in range(layer + 1))}
    expected = {
        "reverse": [set()] * b + [everything[i] for i in range(b, BLOCKS)],  # the aligned block and those nearer z
        "forward": [everything[i] for i in range(b)] + [upto] + [set()] * (BLOCKS - b - 1),
        "detach": [set()] * b + [upto] + [set()] * (BLOCKS - b - 1),
    }[route]
    assert reached == expected
    assert projector == {
        name
        for name, _ in RepresentationAlignment(
            _encoder(), ALIGNED, width=16, features=6, projector_width=8
        ).projector.named_parameters()
    }


def test_the_routes_align_the_same_features_and_the_encoder_stays_frozen() -> None:
    flow = _flow()
    x, y = _batch()
    states = {}
    for route in ("reverse", "forward", "detach"):
        align = RepresentationAlignment(_encoder(), where=[ALIGNED, (-1, 1)], route=route, width=16, features=6)
        log_p, states[route] = align.hidden_states(flow, x, y)
        torch.testing.assert_close(log_p, flow.log_prob(x, y), rtol=0, atol=1e-12)
    for route in ("forward", "detach"):
        for a, b in zip(states["reverse"], states[route], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert all(not p.requires_grad for p in align.encoder.parameters())
    # rows are in patch order: the first token of a block's order (patch 0 forward, patch 3 reverse) sees no data
    tokens, same = torch.randn(6, 4, 4, dtype=torch.float64), torch.zeros_like(y)
    for block, first in ((flow.blocks[0], 0), (flow.blocks[1], 3)):
        h = block.hidden_states(tokens, same, layers=[1])[0]
        assert h.shape == (6, 4, 16) and torch.allclose(h[:, first], h[:1, first].expand(6, 16), rtol=0, atol=1e-14)
        assert not torch.allclose(h[:, 3 - first], h[:1, 3 - first].expand(6, 16))


def test_the_forward_route_reads_the_likelihood_pass_own_states_with_the_two_pass_gradient() -> None:
    flow, (x, y) = _flow(), _batch()
    block = flow.blocks[1]
    tokens = torch.randn(6, 4, 4, dtype=torch.float64)
    z, ladj, states = block.forward_with_states(tokens, y, layers=[1, 0])
    z0, ladj0 = block.forward_and_log_det(tokens, y)
    torch.testing.assert_close((z, ladj), (z0, ladj0), rtol=0, atol=0)
    for h, h0 in zip(states, block.hidden_states(tokens, y, layers=[1, 0]), strict=True):
        torch.testing.assert_close(h, h0, rtol=0, atol=0)
    align = RepresentationAlignment(_encoder(), where=[(-1, 1), (0, 0)], route="forward", width=16, features=6).double()
    targets = align.targets(x, (2, 2))
    grads = []
    for one_pass in (True, False):  # the states from the likelihood pass, or from a second pass on its inputs
        flow.zero_grad()
        if one_pass:
            log_p, states = align.hidden_states(flow, x, y)
        else:
            state = flow.forward_pass(x, y)
            log_p = state.log_prob
            pairs = ((3, 1), (0, 0))
            states = [flow.blocks[b].hidden_states(state.inputs[b], y, layers=[layer])[0] for b, layer in pairs]
        (-log_p.mean() + align.alignment_loss(states, targets)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in flow.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"expected state blocks in 0\.\.3, got 4"):
        flow.forward_pass(x, y, states=[(4, 0)])
    for bad in ((0,), (0, 1.0), "ab", (True, 0)):
        with pytest.raises(ValueError, match=r"expected states as \(block, layer\) pairs of ints"):
            flow.forward_pass(x, y, states=[bad])
    with pytest.raises(ValueError, match=r"expected layers in 0\.\.1, got \[2\]"):
        flow.forward_pass(x, y, states=[(0, 2)])


def test_encoder_grids_are_interpolated_or_pooled_to_the_flow_grid_and_bad_outputs_are_refused() -> None:
    x, _ = _batch()
    for grid in ("interpolate", "pool"):
        align = RepresentationAlignment(_encoder(maps=4), where=ALIGNED, width=16, features=6, grid=grid).double()
        maps = align.encoder(x)
        expected = F.adaptive_avg_pool2d(maps, 2) if grid == "pool" else F.interpolate(maps, size=2, mode="bilinear")
        torch.testing.assert_close(align.targets(x, (2, 2)), expected.flatten(2).transpose(1, 2))
        tokens = RepresentationAlignment(_TokenEncoder(align.encoder), where=ALIGNED, width=16, features=6, grid=grid)
        torch.testing.assert_close(tokens.targets(x, (2, 2)), align.targets(x, (2, 2)))
    bad = RepresentationAlignment(nn.Flatten(), where=ALIGNED, width=16, features=6)
    with pytest.raises(ValueError, match="expected the encoder to return tokens"):
        bad.targets(x, (2, 2))
    with pytest.raises(ValueError, match="expected route in"):
        RepresentationAlignment(_encoder(), where=ALIGNED, route="sideways", width=16, features=6)
    with pytest.raises(ValueError, match="expected where to be"):
        RepresentationAlignment(_encoder(), where=[(1.5, 0)], width=16, features=6)
    with pytest.raises(ValueError, match="default projector"):
        RepresentationAlignment(_encoder(), where=ALIGNED)
    with pytest.raises(ValueError, match=r"expected blocks in -4\.\.3"):
        RepresentationAlignment(_encoder(), where=(4, 0), width=16, features=6).hidden_states(_flow(), *_batch())
    with pytest.raises(ValueError, match=r"expected layers in 0\.\.1"):
        RepresentationAlignment(_encoder(), where=(0, 2), width=16, features=6).hidden_states(_flow(), *_batch())


class _TokenEncoder(nn.Module):
    def __init__(self, maps: nn.Module) -> None:
        super().__init__()
        self.maps = maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maps(x).flatten(2).transpose(1, 2)  # (B, 16, 6) tokens of a 4x4 grid


def test_the_trainer_trains_flow_and_projector_with_the_alignment_term() -> None:
    flow = _flow()
    align = RepresentationAlignment(_encoder(), where=ALIGNED, width=16, features=6, projector_width=8).double()
    before = [p.detach().clone() for p in align.projector.parameters()]
    x, y = _batch(12)
    trainer = Trainer(
        flow, align, optimizer=lambda p: torch.optim.Adam([*p, *align.projector.parameters()], 1e-3), progress=False
    )
    history = trainer.fit((x, y), epochs=2, batch_size=6)
    record = history.last()
    assert {"nll", "alignment"} <= set(record) and math.isfinite(record["loss"])
    assert record["loss"] == pytest.approx(record["nll"] + 16 * 0.5 * record["alignment"], rel=1e-9)
    assert all(not torch.equal(a, b) for a, b in zip(before, align.projector.parameters(), strict=True))
    with pytest.raises(TypeError, match="expected a TarFlow model"):
        align(flows.RealNVP(16, transforms=1, hidden=(4,)), (x.flatten(1),))


def test_alignment_stops_after_until_steps_and_is_still_measured() -> None:
    flow, (x, y) = _flow(), _batch(12)
    align = RepresentationAlignment(
        _encoder(), where=ALIGNED, width=16, features=6, projector_width=8, until=2
    ).double()
    trainer = Trainer(
        flow, align, optimizer=lambda p: torch.optim.Adam([*p, *align.projector.parameters()], 1e-3), progress=False
    )
    first = trainer.fit((x, y), epochs=1, batch_size=6, shuffle=False).last()  # steps 1-2: aligned
    assert int(align.steps) == 2
    assert first["loss"] == pytest.approx(first["nll"] + 16 * 0.5 * first["alignment"], rel=1e-9)
    projector = [p.detach().clone() for p in align.projector.parameters()]
    weights = [p.detach().clone() for p in flow.parameters()]
    second = trainer.fit((x, y), epochs=2, batch_size=6, shuffle=False).last()  # steps 3-4: likelihood alone
    assert int(align.steps) == 4 and second["loss"] == pytest.approx(second["nll"], rel=1e-12)
    assert second["alignment"] != 0 and math.isfinite(second["alignment"])  # still measured
    assert all(torch.equal(a, b) for a, b in zip(projector, align.projector.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights, flow.parameters(), strict=True))
    flow.eval()
    align(flow, (x, y))  # evaluation does not count
    assert int(align.steps) == 4 and "until=2" in repr(align)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="expected until to be None or a positive int"):
            RepresentationAlignment(_encoder(), where=ALIGNED, width=16, features=6, until=bad)


@pytest.mark.parametrize("until", [None, 3])
def test_a_resumed_alignment_run_continues_with_the_saved_projector(tmp_path, until: int | None) -> None:
    x, y = _batch(12)

    def run(epochs: int, resume: bool):
        torch.manual_seed(0)
        flow = _flow()
        align = RepresentationAlignment(
            _encoder(), where=ALIGNED, width=16, features=6, projector_width=8, until=until
        ).double()
        trainer = Trainer(
            flow,
            align,
            optimizer=lambda p: torch.optim.Adam([*p, *align.projector.parameters()], 1e-3),
            progress=False,
            checkpoint=tmp_path / "run.ckpt",
        )
        if resume:
            trainer.resume()
        trainer.fit((x, y), epochs=epochs, batch_size=6, shuffle=False)
        return flow, align

    whole_flow, whole = run(2, resume=False)
    (tmp_path / "run.ckpt").unlink()
    run(1, resume=False)
    resumed_flow, resumed = run(2, resume=True)  # a fresh projector in the new process: the checkpoint restores it
    for a, b in zip(whole.projector.parameters(), resumed.projector.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(whole_flow.parameters(), resumed_flow.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_trainer_refuses_an_objective_whose_parameters_the_optimizer_does_not_hold() -> None:
    align = RepresentationAlignment(_encoder(), where=ALIGNED, width=16, features=6, projector_width=8).double()
    with pytest.raises(ValueError, match=r"RepresentationAlignment has trainable parameters .*projector"):
        Trainer(_flow(), align, progress=False)
    trainer = Trainer(_flow(), progress=False)
    with pytest.raises(ValueError, match="does not hold"):
        trainer.objective = align


def test_resuming_without_the_objective_state_is_refused(tmp_path) -> None:
    x, y = _batch(12)
    align = RepresentationAlignment(_encoder(), where=ALIGNED, width=16, features=6, projector_width=8).double()
    trainer = Trainer(
        _flow(), align, optimizer=lambda p: torch.optim.Adam([*p, *align.projector.parameters()]), progress=False
    )
    trainer.fit((x, y), epochs=1, batch_size=6)
    state = trainer.state_dict()
    state["objective"] = None  # as an older checkpoint
    with pytest.raises(ValueError, match="holds none for it"):
        trainer.load_state_dict(state)
    plain = Trainer(_flow(), progress=False)
    with pytest.raises(ValueError, match=r"not an nn\.Module"):
        plain.load_state_dict(trainer.state_dict())


# -- the gradient classifier ---------------------------------------------------------------------


class _GaussianClasses(nn.Module):
    """``log p(x | w) = log N(x; A (wᵀE), I)``: class Gaussians with a soft-label path."""

    def __init__(self, a: torch.Tensor, table: torch.Tensor) -> None:
        super().__init__()
        self.a, self.table, self.num_classes, self.event_shape = a, table, table.shape[0], (a.shape[0],)
        self.context_features = 1

    def log_prob_class_weights(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        mean = (weights @ self.table) @ self.a.T
        return -0.5 * ((x - mean) ** 2).sum(-1) - 0.5 * x.shape[-1] * math.log(2 * math.pi)

    def log_prob(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.log_prob_class_weights(x, F.one_hot(context[..., 0].long(), self.num_classes).to(x.dtype))


def test_the_gradient_classifier_is_the_bayes_argmax_for_symmetric_class_means_and_not_in_general() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))[0][:, :3] * 2.0  # A E_k orthogonal
    symmetric = _GaussianClasses(a, torch.eye(3, dtype=torch.float64))  # equal norms, equal <A Ē, A E_k>
    x = torch.randn(200, 5, generator=gen, dtype=torch.float64) * 2
    scores = gradient_classifier(symmetric, x, 3)
    bayes = bayes_classifier(symmetric, x, 3)
    assert torch.equal(scores.argmax(-1), bayes.argmax(-1))
    g = (x - a @ torch.full((3,), 1 / 3, dtype=torch.float64)) @ a  # ∇_e log p at Ē, then (1/K)<g, E_k - Ē>
    torch.testing.assert_close(scores, (g - g.mean(-1, keepdim=True)) / 3, rtol=0, atol=1e-12)
    lopsided = _GaussianClasses(a, torch.diag(torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)))
    differ = gradient_classifier(lopsided, x, 3).argmax(-1) != bayes_classifier(lopsided, x, 3).argmax(-1)
    assert differ.any()  # the linearisation favours the far class mean


def test_the_gradient_classifier_on_a_tarflow_is_the_derivative_of_its_soft_label_density() -> None:
    flow = _flow(null_class="mean").eval()
    x, y = _batch()
    one_hot = F.one_hot(y[:, 0].long(), 3).double()
    torch.testing.assert_close(flow.log_prob_class_weights(x, one_hot), flow.log_prob(x, y), rtol=0, atol=1e-12)
    uniform = torch.full((6, 3), 1 / 3, dtype=torch.float64)
    null = flow.log_prob(x, torch.full_like(y, -1.0))
    torch.testing.assert_close(flow.log_prob_class_weights(x, uniform), null, rtol=1e-13, atol=1e-12)
    scores = gradient_classifier(flow, x, 3)
    eps = 1e-6
    for k in range(3):  # d/dε log p(x | softmax(ε e_k)) by central differences
        lam = torch.zeros(6, 3, dtype=torch.float64)
        lam[:, k] = eps
        plus, minus = (
            flow.log_prob_class_weights(x, lam.softmax(-1)),
            flow.log_prob_class_weights(x, (-lam).softmax(-1)),
        )
        torch.testing.assert_close(scores[:, k], ((plus - minus) / (2 * eps)).detach(), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(scores.sum(-1), torch.zeros(6, dtype=torch.float64), rtol=0, atol=1e-12)


def test_the_gradient_classifier_and_class_weights_refuse_flows_without_a_class_table() -> None:
    x, _ = _batch()
    with pytest.raises(TypeError, match="expected a class-conditional flow with a class-embedding table"):
        gradient_classifier(flows.RealNVP(16, transforms=1, hidden=(4,)), x.flatten(1), 3)
    with pytest.raises(TypeError, match="without classes"):
        gradient_classifier(_flow(num_classes=0), x, 3)
    with pytest.raises(ValueError, match=r"expected num_classes equal to the flow's \(3\), got 4"):
        gradient_classifier(_flow(), x, 4)
    with pytest.raises(ValueError, match=r"expected finite float class weights \(\*batch, 3\)"):
        _flow().log_prob_class_weights(x, torch.ones(6, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected a class-conditional flow"):
        _flow(num_classes=0).log_prob_class_weights(x, torch.ones(6, 3, dtype=torch.float64))


# -- noise augmentation, denoising and noise-aware scoring ----------------------------------------


def test_maximum_likelihood_noises_batches_with_the_models_recorded_noise() -> None:
    flow = _flow(noise_std=0.3)
    x, y = _batch()
    torch.manual_seed(7)
    loss = MaximumLikelihood()(flow, (x, y))
    torch.manual_seed(7)
    noisy = x + 0.3 * torch.randn_like(x)
    torch.testing.assert_close(loss, -flow.log_prob(noisy, y).mean(), rtol=0, atol=1e-12)
    explicit = MaximumLikelihood(noise_std=0.0)(flow, (x, y))  # an explicit σ overrides the model's
    torch.testing.assert_close(explicit, -flow.log_prob(x, y).mean(), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="expected noise_std to be a finite number >= 0"):
        MaximumLikelihood(noise_std=-1.0)
    with pytest.raises(ValueError, match="expected noise_std to be a finite number >= 0"):
        flows.TarFlow((1, 4, 4), patch=2, noise_std=float("nan"))


def test_the_bayes_classifier_scores_inputs_noised_like_the_training_data_when_asked() -> None:
    flow = _flow(noise_std=0.2).eval()
    x, _ = _batch()
    gen = torch.Generator().manual_seed(4)
    got = bayes_classifier(flow, x, 3, noise_std="model", draws=2, generator=gen)
    gen = torch.Generator().manual_seed(4)
    noised = [x + 0.2 * torch.randn(x.shape, generator=gen, dtype=x.dtype) for _ in range(2)]
    log_p = sum(
        torch.stack([flow.log_prob(v, torch.full((6, 1), float(k), dtype=torch.float64)) for k in range(3)], -1)
        for v in noised
    )
    torch.testing.assert_close(got, (log_p / 2).log_softmax(-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(bayes_classifier(flow, x, 3, noise_std=0.0), bayes_classifier(flow, x, 3))
    with pytest.raises(ValueError, match="expected noise_std='model' for a flow that records its training noise_std"):
        bayes_classifier(_flow(), x, 3, noise_std="model")
    with pytest.raises(ValueError, match="expected draws to be an int >= 1"):
        bayes_classifier(flow, x, 3, noise_std="model", draws=0)


def test_sampling_with_denoise_is_one_tweedie_step_with_the_flows_conditional_score() -> None:
    flow = _flow(noise_std=0.25).eval()
    y = flow.class_context([0, 1, 2])
    torch.manual_seed(9)
    raw = flow.sample(context=y)
    for denoise in (True, 0.25):
        torch.manual_seed(9)
        got = flow.sample(context=y, denoise=denoise)
        torch.testing.assert_close(got, flows.tweedie_denoise(flow, raw, 0.25, context=y), rtol=0, atol=1e-12)
    torch.manual_seed(9)
    guided = flow.sample(context=y, guidance=0.0, denoise=0.25)
    torch.testing.assert_close(guided, flows.tweedie_denoise(flow, raw, 0.25, context=y), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="expected a flow trained with noise_std for denoise=True"):
        _flow().sample(context=y, denoise=True)
    with pytest.raises(ValueError, match="expected denoise to be None, True or a finite sigma"):
        flow.sample(context=y, denoise=-0.1)


# -- labelled loaders ------------------------------------------------------------------------------


def test_the_loaders_return_labels_when_asked_and_the_same_images_either_way(tmp_path) -> None:
    train, test = load_digits()
    (train2, y_train), (test2, y_test) = load_digits(labels=True)
    assert torch.equal(train, train2) and torch.equal(test, test2)
    assert y_train.dtype == torch.int64 and y_train.shape == (len(train),) and set(y_test.tolist()) == set(range(10))
    rng = np.random.default_rng(0)
    arrays = {f"x_{s}": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for s, n in (("train", 5), ("test", 3))}
    arrays |= {"y_train": np.array([0, 1, 2, 3, 9], dtype=np.uint8), "y_test": np.array([4, 5, 6], dtype=np.uint8)}
    np.savez(tmp_path / "mnist.npz", **arrays)
    (x, y), (_, yt) = load_mnist(tmp_path, verify=False, labels=True)
    assert torch.equal(x, load_mnist(tmp_path, verify=False)[0]) and y.tolist() == [0, 1, 2, 3, 9]
    assert yt.dtype == torch.int64 and yt.tolist() == [4, 5, 6]
    np.savez(tmp_path / "mnist.npz", **(arrays | {"y_test": np.array([4, 5, 10])}))
    with pytest.raises(ValueError, match=r"expected y_test of shape \(3,\) holding integers 0..9"):
        load_mnist(tmp_path, verify=False, labels=True)
    del arrays["y_train"]
    np.savez(tmp_path / "mnist.npz", **arrays)
    with pytest.raises(ValueError, match=r"missing \['y_train'\]"):
        load_mnist(tmp_path, verify=False, labels=True)
    assert load_mnist(tmp_path, verify=False)[1].shape == (3, 1, 28, 28)  # images alone need no labels


def test_the_benchmark_trains_a_noise_model_with_reverse_alignment_at_a_tiny_budget(capsys) -> None:
    from pathlib import Path

    from tests.scripts import run_script

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "transformer_flows.py"
    threads = torch.get_num_threads()
    try:
        main = run_script(str(script), run_name="benchmark")["main"]
        argv = ["--data", "digits", "--seconds", "0.5", "--patch", "4", "--blocks", "2", "--layers", "1"]
        argv += ["--width", "16", "--eval-images", "20", "--classify-images", "20", "--noise-std", "0.1"]
        argv += ["--align", "reverse", "--align-where=-1:0", "--encoder-seconds", "0.3", "--encoder-width", "8"]
        argv += ["--projector-width", "12"]
        result = main(argv)
    finally:
        torch.set_num_threads(threads)
    assert result["steps"] >= 1 and result["encoder_steps"] >= 1
    for key in ("bayes_accuracy", "bayes_accuracy_clean", "gradient_accuracy"):
        assert 0 <= result[key] <= 1
    assert "gradient_accuracy" in capsys.readouterr().out


def _benchmark_module():
    from pathlib import Path

    from tests.scripts import run_script

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "transformer_flows.py"
    return run_script(str(script), run_name="benchmark")


@pytest.mark.parametrize("patch", [2, 3, 4])
def test_the_global_stand_in_encoder_sees_the_whole_image_and_the_local_one_its_patch(patch: int) -> None:
    module = _benchmark_module()
    torch.manual_seed(0)
    x = torch.randn(1, 1, 12, 12)
    moved = x.clone()
    moved[..., 6, 6] += 1.0  # a pixel in the middle of the image
    for kind in ("global", "local"):
        encoder = module["StandInEncoder"](patch, width=8, kind=kind)
        a, b = encoder(x), encoder(moved)
        assert a.shape == (1, 8, 12 // patch, 12 // patch)
        changed = (a - b).abs().amax(1)[0] > 0  # which grid cells the pixel reaches
        if kind == "global":
            assert changed.all(), changed
        else:  # its own cell (and a neighbour when the pixel sits on a patch's edge), never the corner
            assert changed[6 // patch, 6 // patch] and not changed[0, 0] and changed.sum() <= 4, changed
    with pytest.raises(ValueError, match="encoder kind must be 'local' or 'global', got 'deep'"):
        module["StandInEncoder"](patch, kind="deep")


def test_the_benchmark_refuses_an_alignment_fraction_outside_0_1_or_alignment_flags_without_alignment() -> None:
    parse = _benchmark_module()["parse"]
    threads = torch.get_num_threads()
    try:
        assert parse(["--align", "forward", "--align-until", "0.25"]).align_until == 0.25
        assert parse(["--align", "forward"]).encoder == "global"
        for bad in ("0", "1.5", "-0.1"):
            with pytest.raises(SystemExit):
                parse(["--align", "forward", "--align-until", bad])
        for ignored in (["--align-until", "0.5"], ["--encoder", "local"]):  # no alignment: refused, not ignored
            with pytest.raises(SystemExit):
                parse(ignored)
    finally:
        torch.set_num_threads(threads)
