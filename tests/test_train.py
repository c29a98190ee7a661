"""The training loop: learning, validation mode, early stopping, schedules, clipping, aux losses, the NaN guard."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import flows
from flows.bijections.auxiliary import add_auxiliary_loss
from flows.data import TensorLoader
from flows.train import (
    Callback,
    CosineDecay,
    EarlyStopping,
    MaximumLikelihood,
    NonFiniteGuard,
    Objective,
    PrintMetrics,
    Trainer,
    TrainingDiverged,
    TrainingWarning,
    WeightedSum,
)


def _data(n: int = 400, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=g) * torch.tensor([2.0, 0.5]) + torch.tensor([1.0, -1.0])


def _model(seed: int = 0) -> flows.Flow:
    torch.manual_seed(seed)
    return flows.RealNVP(2, transforms=2, hidden=(16,))


def test_training_lowers_the_validation_loss_and_records_history() -> None:
    x = _data()
    trainer = Trainer(_model(), lr=1e-2)
    before = trainer.evaluate(x[300:])["loss"]
    history = trainer.fit(x[:300], x[300:], epochs=6, batch_size=50)
    assert len(history) == 6 and history["epoch"] == [1, 2, 3, 4, 5, 6]
    assert history["step"][-1] == 36
    assert history["val_loss"][-1] < before - 0.3
    for key in ("loss", "val_loss", "grad_norm", "lr", "time"):
        assert all(math.isfinite(v) for v in history[key]), key
    assert trainer.model.training  # the loop leaves the model in train mode


class _ModeSpy(nn.Module):
    """A flow wrapper that records the training flag whenever log_prob runs."""

    def __init__(self, flow: nn.Module) -> None:
        super().__init__()
        self.flow = flow
        self.seen: list[tuple[bool, bool]] = []

    def log_prob(self, x, context=None):
        self.seen.append((self.training, torch.is_grad_enabled()))
        return self.flow.log_prob(x)


def test_validation_runs_in_eval_mode_without_gradients_and_restores_modes() -> None:
    spy = _ModeSpy(_model())
    spy.flow.transform[0].eval()  # a submodule deliberately in eval mode must stay so
    Trainer(spy).fit(_data(100), _data(40, seed=1), epochs=1, batch_size=50)
    train_calls, val_calls = spy.seen[:2], spy.seen[2:]
    assert train_calls == [(True, True), (True, True)]
    assert val_calls and all(mode == (False, False) for mode in val_calls)
    assert spy.training and not spy.flow.transform[0].training and spy.flow.transform[1].training


class _ScriptedValidation(Objective):
    """Maximum likelihood for training, a scripted validation curve."""

    def __init__(self, curve: list[float]) -> None:
        self.curve = list(curve)
        self.ml = MaximumLikelihood()

    def __call__(self, model, batch):
        return self.ml(model, batch)

    def evaluate(self, model, batches):
        list(batches)
        return {"loss": self.curve.pop(0)}


class _Snapshots(Callback):
    def __init__(self) -> None:
        self.states: dict[int, dict] = {}

    def on_epoch_end(self, trainer, record) -> None:
        self.states[int(record["epoch"])] = {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_early_stopping_stops_after_patience_and_restores_the_best_weights() -> None:
    snapshots = _Snapshots()
    stopper = EarlyStopping(patience=1)
    trainer = Trainer(
        _model(), _ScriptedValidation([3.0, 2.0, 1.0, 1.5, 2.5, 0.1, 0.1]), lr=1e-2, callbacks=[snapshots, stopper]
    )
    history = trainer.fit(_data(100), _data(20, 1), epochs=7, batch_size=50)
    assert history["epoch"] == [1, 2, 3, 4]  # epoch 4 did not improve on epoch 3: 1 epoch = patience 1
    assert stopper.best_epoch == 3 and stopper.stopped_epoch == 4
    final = trainer.model.state_dict()
    for name, value in snapshots.states[3].items():
        assert torch.equal(final[name], value), name
    assert not torch.equal(
        snapshots.states[4]["transform.transforms.1.conditioner.net.0.weight"],
        final["transform.transforms.1.conditioner.net.0.weight"],
    )
    assert any("early stopping at epoch 4" in e["message"] for e in history.events)


def test_learning_rate_schedules_per_epoch_and_per_step() -> None:
    trainer = Trainer(_model(), lr=0.1, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    history = trainer.fit(_data(100), epochs=3, batch_size=50)
    assert history["lr"] == pytest.approx([0.1, 0.05, 0.025])  # the rate used during each epoch
    trainer = Trainer(
        _model(),
        lr=0.1,
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5),
        scheduler_interval="step",
    )
    assert trainer.fit(_data(100), epochs=1, batch_size=25)["lr"] == pytest.approx([0.1 * 0.5**4])


def test_cosine_decay_follows_the_cosine_over_steps_and_ends_at_the_floor() -> None:
    trainer = Trainer(_model(), lr=0.2)
    decay = CosineDecay(trainer.optimizer, steps=8, floor=0.1)
    seen: list[float] = []

    class Watch(Callback):
        def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
            seen.append(trainer.optimizer.param_groups[0]["lr"])

    trainer.callbacks = [decay, Watch()]
    trainer.fit(_data(100), epochs=2, batch_size=25)  # 8 steps
    expected = [0.2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 8))) for k in range(1, 9)]
    assert seen == pytest.approx(expected)
    assert seen[-1] == pytest.approx(0.02)


def test_cosine_decay_over_seconds_continues_across_a_resume(tmp_path) -> None:
    class Clock:  # a trainer stand-in: only step and elapsed are read
        step, elapsed = 0, 0.0

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    decay = CosineDecay(opt, seconds=100.0)
    clock = Clock()
    clock.elapsed = 25.0
    decay.on_step_end(clock, {})
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    state = decay.state_dict()
    fresh_opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=opt.param_groups[0]["lr"])  # as restored
    resumed = CosineDecay(fresh_opt, seconds=100.0)
    resumed.load_state_dict(state)  # the factor the restored rate carries, not 1
    clock.elapsed = 50.0
    resumed.on_fit_start(clock)
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(0.5)  # half way, from the saved initial rate 1.0
    clock.elapsed = 150.0
    resumed.on_step_end(clock, {})
    assert fresh_opt.param_groups[0]["lr"] == 0.0


def test_cosine_decay_keeps_the_guards_backoff() -> None:
    class Clock:
        step, elapsed = 0, 0.0

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    decay, clock = CosineDecay(opt, steps=10), Clock()
    clock.step = 2
    decay.on_step_end(clock, {})
    at_2 = opt.param_groups[0]["lr"]
    opt.param_groups[0]["lr"] *= 0.5  # a NonFiniteGuard rollback halves the rate
    clock.step = 4
    decay.on_step_end(clock, {})
    expected = 0.5 * at_2 * (0.5 * (1 + math.cos(math.pi * 0.4))) / (0.5 * (1 + math.cos(math.pi * 0.2)))
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)  # the schedule goes on from the lowered rate


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({}, ValueError), ({"steps": 5, "seconds": 1.0}, ValueError), ({"steps": 0}, ValueError),
     ({"seconds": math.nan}, TypeError), ({"steps": "5"}, TypeError), ({"steps": 5, "floor": 1.0}, ValueError)],
)  # fmt: skip
def test_cosine_decay_refuses_bad_horizons(kwargs, error) -> None:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(error, match="CosineDecay"):
        CosineDecay(opt, **kwargs)


def test_plateau_scheduler_receives_the_monitored_metric() -> None:
    objective = _ScriptedValidation([1.0, 2.0, 2.0, 2.0])
    trainer = Trainer(
        _model(), objective, lr=0.1, scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1)
    )
    history = trainer.fit(_data(100), _data(10, 1), epochs=4, batch_size=50)
    assert history["lr"] == pytest.approx([0.1, 0.1, 0.1, 0.01])


class _GradNorms(Callback):
    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_step_end(self, trainer, metrics) -> None:
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


def test_gradient_clipping_bounds_the_applied_gradient() -> None:
    spy = _GradNorms()
    trainer = Trainer(_model(), lr=1e-3, clip_grad_norm=0.01, callbacks=[spy])
    history = trainer.fit(_data(100) * 10, epochs=1, batch_size=25)
    assert history["grad_norm"][0] > 0.01  # the reported norm is the one before clipping
    assert max(spy.norms) <= 0.01 * (1 + 1e-5)


class _Penalised(nn.Module):
    """A flow whose forward pass hands an auxiliary loss to the trainer."""

    def __init__(self, flow: nn.Module, weight: float) -> None:
        super().__init__()
        self.flow, self.weight = flow, weight

    def log_prob(self, x, context=None):
        params = torch.cat([p.reshape(-1) for p in self.flow.parameters()])
        add_auxiliary_loss("l2", self.weight * params.square().sum())
        return self.flow.log_prob(x)


def test_auxiliary_losses_are_added_and_logged() -> None:
    x = _data(100)
    plain = Trainer(_Penalised(_model(), 0.0), lr=1e-2).fit(x, epochs=2, batch_size=50)
    heavy_model = _Penalised(_model(), 1.0)
    heavy = Trainer(heavy_model, lr=1e-2).fit(x, epochs=2, batch_size=50)
    assert plain["aux_l2"][-1] == 0.0
    assert heavy["aux_l2"][-1] > 0
    assert heavy["aux_l2"][-1] < heavy["aux_l2"][0]  # the penalty was minimised, so it reached the loss
    params_plain = torch.cat([p.reshape(-1) for p in _model().parameters()])
    assert params_plain.numel() > 0


class _Faulty(Objective):
    """Maximum likelihood, except that the listed steps give a NaN loss or an infinite gradient."""

    def __init__(self, nan_steps=(), inf_grad_steps=()) -> None:
        self.nan_steps, self.inf_grad_steps = set(nan_steps), set(inf_grad_steps)
        self.calls = 0

    def __call__(self, model, batch):
        self.calls += 1
        loss = MaximumLikelihood()(model, batch)
        if self.calls in self.nan_steps:
            return loss * math.nan
        if self.calls in self.inf_grad_steps:
            p = next(model.parameters())
            return loss + (p.sum() * 1e38) * 1e38 - (p.sum() * 1e38 * 1e38).detach()
        return loss


def test_nan_guard_skips_bad_steps_without_touching_the_weights() -> None:
    model = _model()
    trainer = Trainer(model, _Faulty(nan_steps={2}, inf_grad_steps={3}), lr=1e-2)
    states = []

    class Keep(Callback):
        def on_step_end(self, trainer, metrics):
            states.append((metrics["skipped"], {k: v.clone() for k, v in trainer.model.state_dict().items()}))

    trainer.callbacks.append(Keep())
    history = trainer.fit(_data(100), epochs=1, batch_size=25)
    assert [s for s, _ in states] == [0.0, 1.0, 1.0, 0.0]
    for name in states[0][1]:  # steps 2 and 3 changed nothing
        assert torch.equal(states[0][1][name], states[2][1][name])
    assert history["skipped"] == [2.0]
    assert math.isfinite(history["loss"][0]) and trainer.guard.skipped == 2


def test_nan_guard_rolls_back_with_a_lower_learning_rate_then_gives_up() -> None:
    guard = NonFiniteGuard(max_consecutive=2, lr_factor=0.5, max_rollbacks=1)
    trainer = Trainer(_model(), _Faulty(nan_steps={3, 4}), lr=1e-2, guard=guard)
    with pytest.warns(
        TrainingWarning, match=r"rolled back to the last good state and lowered the learning rate to 0.005"
    ):
        history = trainer.fit(_data(200), epochs=1, batch_size=25)
    assert trainer.lr == pytest.approx(5e-3) and guard.rollbacks == 1
    assert any("rolled back" in e["message"] for e in history.events)

    trainer = Trainer(
        _model(),
        _Faulty(nan_steps=set(range(2, 50))),
        lr=1e-2,
        guard=NonFiniteGuard(max_consecutive=2, max_rollbacks=1),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingWarning)
        with pytest.raises(TrainingDiverged, match="training diverged at step 5: 2 non-finite steps in a row"):
            trainer.fit(_data(200), epochs=1, batch_size=25)


def test_without_the_guard_a_nan_loss_raises() -> None:
    trainer = Trainer(_model(), _Faulty(nan_steps={1}), guard=False)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        trainer.fit(_data(100), epochs=1, batch_size=50)


def test_budgets_stop_mid_epoch_with_a_fractional_record() -> None:
    trainer = Trainer(_model())
    history = trainer.fit(_data(100), epochs=10, batch_size=10, max_steps=15)
    assert trainer.step == 15 and history["epoch"] == [1, 1.5]
    history = Trainer(_model()).fit(_data(100), time_budget=0.0, batch_size=10)
    assert history["step"] == [1]


class _NoData(Objective):
    """A data-free objective (like reverse KL): maximise the likelihood of the model's own samples' shift."""

    def __call__(self, model, batch):
        assert batch is None
        x = torch.randn(16, 2) + 3.0
        return -model.log_prob(x).mean()


def test_data_free_objectives_run_for_steps_per_epoch() -> None:
    history = Trainer(_model(), _NoData(), lr=1e-2).fit(None, epochs=2, steps_per_epoch=5)
    assert history["step"] == [5, 10]


def test_weighted_sum_logs_each_term() -> None:
    x = _data(40)
    model = _model()
    loss, metrics = WeightedSum([(0.25, MaximumLikelihood(), "a"), (0.75, MaximumLikelihood(), "b")])(model, (x,))
    torch.testing.assert_close(loss, -model.log_prob(x).mean())
    assert set(metrics) == {"a_loss", "b_loss"}
    mix = WeightedSum([(0.5, MaximumLikelihood(), "ml"), (0.5, MaximumLikelihood(), "again")])
    history = Trainer(model, mix).fit(x, epochs=1, batch_size=20)
    assert history["ml_loss"] == pytest.approx(history["loss"])


def test_progress_bar_is_quiet_when_not_a_terminal(capsys) -> None:
    Trainer(_model()).fit(_data(100), epochs=1, batch_size=50)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_bar_when_asked_for(capsys) -> None:
    Trainer(_model(), progress=True).fit(_data(100), epochs=2, batch_size=50)
    assert "4/4" in capsys.readouterr().err  # tqdm's count of steps over the run


def test_print_metrics_prints_one_line_per_epoch(capsys) -> None:
    Trainer(_model(), callbacks=[PrintMetrics()]).fit(_data(100), _data(20, 1), epochs=2, batch_size=50)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("epoch    2") and "val_loss" in lines[1]


def test_tensor_loader_and_context_batches() -> None:
    torch.manual_seed(0)
    model = flows.RealNVP(2, 1, transforms=2, hidden=(8,))
    x, c = _data(60), torch.randn(60, 1)
    history = Trainer(model).fit(TensorLoader(x, c, batch_size=20, seed=3), (x[:10], c[:10]), epochs=1)
    assert history["step"] == [3] and math.isfinite(history["val_loss"][0])


class _Recorder:
    """A plain function-like objective (no Objective base class) that records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[nn.Module, object, bool]] = []

    def __call__(self, model, batch):
        self.calls.append((model, batch, torch.is_grad_enabled()))
        x, context = batch
        loss = -model.log_prob(x, context).mean()
        return loss, {"x_mean": x.mean().detach(), "rows": float(len(x))}


def test_a_custom_objective_callable_is_called_once_per_batch() -> None:
    torch.manual_seed(0)
    model = flows.RealNVP(2, 1, transforms=2, hidden=(8,))
    x, c = _data(50), torch.randn(50, 1)
    objective = _Recorder()
    trainer = Trainer(model, objective, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    history = trainer.fit((x, c), epochs=2, batch_size=20, shuffle=False)
    train_calls = objective.calls
    assert len(train_calls) == trainer.step == 6  # 3 batches (20, 20, 10) per epoch, one call each
    for i, (called_model, batch, grad) in enumerate(train_calls):
        assert called_model is model and grad
        assert type(batch) is tuple and len(batch) == 2  # (x, context), as the data came
        rows = slice(20 * (i % 3), 20 * (i % 3) + 20)
        assert torch.equal(batch[0], x[rows]) and torch.equal(batch[1], c[rows])
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # the loss was minimised
    # metrics are averaged over the epoch, weighted by the batch sizes: (20·20 + 20·20 + 10·10) / 50
    assert history["rows"] == [pytest.approx(18.0)] * 2
    assert history["x_mean"][0] == pytest.approx(float(x.mean()), abs=1e-6)
    # validation without an evaluate method: the loss and metrics averaged over the batches, without gradients
    objective.calls.clear()
    measures = trainer.evaluate((x, c), batch_size=30)
    assert len(objective.calls) == 2 and not any(grad for _, _, grad in objective.calls)
    assert set(measures) == {"loss", "x_mean", "rows"} and measures["rows"] == pytest.approx((30 * 30 + 20 * 20) / 50)


def test_an_objective_can_be_replaced_between_fits() -> None:
    first, second = _Recorder(), _Recorder()
    x, c = _data(40), torch.randn(40, 1)
    torch.manual_seed(0)
    trainer = Trainer(flows.RealNVP(2, 1, transforms=2, hidden=(8,)), first)
    trainer.fit((x, c), epochs=1, batch_size=20)
    trainer.objective = second
    trainer.fit((x, c), epochs=2, batch_size=20)
    assert len(first.calls) == 2 and len(second.calls) == 2


def test_what_an_objective_returns_is_checked() -> None:
    x = _data(20)
    with pytest.raises(
        TypeError, match=r"expected an objective to return a scalar loss \(shape \(\)\), got shape \(20,\)"
    ):
        Trainer(_model(), lambda model, batch: -model.log_prob(batch[0])).fit(x, epochs=1, batch_size=20)
    with pytest.raises(
        TypeError, match=r"expected an objective to return a loss tensor or \(loss, metrics\), got list"
    ):
        Trainer(_model(), lambda model, batch: [model.log_prob(batch[0]).mean()]).fit(x, epochs=1, batch_size=20)
    with pytest.raises(TypeError, match=r"expected a callable objective\(model, batch\), got str"):
        Trainer(_model(), "ml")


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"expected an nn\.Module as model, got str"):
        Trainer("model")
    with pytest.raises(ValueError, match="expected scheduler_interval 'epoch' or 'step', got 'batch'"):
        Trainer(_model(), scheduler_interval="batch")
    with pytest.raises(ValueError, match="expected clip_grad_norm > 0 or None, got -1"):
        Trainer(_model(), clip_grad_norm=-1)
    with pytest.raises(ValueError, match="expected at least one of epochs, max_steps or time_budget"):
        Trainer(_model()).fit(_data(10))
    with pytest.raises(ValueError, match="expected steps_per_epoch when there is no training data"):
        Trainer(_model()).fit(None, epochs=1)
    with pytest.raises(
        TypeError, match=r"expected floating-point data, got dtype torch.int64; for integer data pass levels"
    ):
        Trainer(_model()).fit(torch.zeros(10, 2, dtype=torch.long), epochs=1)
    with pytest.raises(ValueError, match="expected levels to be an int >= 2 or None, got 1"):
        MaximumLikelihood(levels=1)
    with pytest.raises(ValueError, match="expected 0 < lr_factor <= 1, got 2"):
        NonFiniteGuard(lr_factor=2)
    with pytest.raises(ValueError, match="expected a global batch_size divisible by world_size=2, got 3"):
        TensorLoader(torch.zeros(4), batch_size=3, world_size=2, rank=1)
    with pytest.raises(ValueError, match="expected tensors of the same length"):
        TensorLoader(torch.zeros(4), torch.zeros(5), batch_size=2)


def test_the_default_optimizer_is_fused_adam_where_supported() -> None:
    from flows.train import default_optimizer

    real = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2, dtype=torch.float64))]
    assert default_optimizer(real, lr=0.1).defaults["fused"] is True
    mixed = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    optimizer = default_optimizer(mixed, lr=0.1)
    assert not optimizer.defaults["fused"]
    for p in mixed:
        p.grad = torch.ones_like(p)
    optimizer.step()  # fused Adam would raise here on the complex parameter
    assert torch.allclose(mixed[0].detach(), torch.full((3,), 0.9))
    assert isinstance(Trainer(_model()).optimizer, torch.optim.Adam) and Trainer(_model()).optimizer.defaults["fused"]
