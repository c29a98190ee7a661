"""``torch.compile`` support: the Trainer's ``compile`` option and the compiled input check."""

from __future__ import annotations

import warnings

import pytest
import torch

import flows
from flows.train import Trainer


def _data(n: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g) * torch.tensor([2.0, 0.5, 1.0, 3.0])


def _fit(compile: bool | dict) -> tuple[list[float], flows.Flow]:
    torch.manual_seed(0)
    model = flows.RealNVP(4, transforms=2, hidden=(8,))
    losses: list[float] = []

    class Record(flows.train.Callback):
        def on_step_end(self, trainer, metrics) -> None:
            losses.append(metrics["loss"])

    data = _data()
    # 96 rows in batches of 40: the last batch has another size, which a compiled objective must handle
    Trainer(model, lr=1e-2, compile=compile, callbacks=[Record()], progress=False).fit(data, epochs=2, batch_size=40)
    return losses, model


@pytest.mark.parametrize("compile", [{"backend": "aot_eager"}, True], ids=["aot_eager", "inductor"])
def test_compiled_training_follows_eager_training(compile) -> None:
    eager, eager_model = _fit(False)
    compiled, compiled_model = _fit(compile)
    assert len(compiled) == len(eager) == 6
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    for a, b in zip(compiled_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_compiled_training_reports_a_nan_input_like_eager() -> None:
    data = _data()
    data[7, 2] = float("nan")
    trainer = Trainer(flows.RealNVP(4, transforms=2, hidden=(8,)), compile={"backend": "aot_eager"}, progress=False)
    with pytest.raises(ValueError, match=r"1 NaN/Inf value\(s\), the first at index \(\d+, 2\)"):
        trainer.fit(data, epochs=1, batch_size=96)


def test_input_check_stays_in_the_compiled_graph() -> None:
    flow = flows.RealNVP(4, transforms=2, hidden=(8,))
    log_prob = torch.compile(flow.log_prob, backend="aot_eager", fullgraph=True)  # a graph break would raise
    x = _data(8)
    torch.testing.assert_close(log_prob(x), flow.log_prob(x))
    x[3, 1] = float("inf")
    with pytest.raises(RuntimeError, match="expected no NaN/Inf values in the input"):
        log_prob(x)
    flow.check_finite = False
    assert not torch.isfinite(torch.compile(flow.log_prob, backend="aot_eager")(x)).all()


def test_bad_compile_options_raise() -> None:
    with pytest.raises(TypeError, match="expected compile to be a bool or a dict"):
        Trainer(flows.RealNVP(4, transforms=2, hidden=(8,)), compile="max-autotune")


def test_the_trainer_hands_the_objective_to_the_given_backend() -> None:
    graphs = []

    def spy(graph_module, example_inputs):  # a torch.compile backend that runs the graph as traced
        graphs.append(graph_module)
        return graph_module.forward

    losses, _ = _fit({"backend": spy})
    assert graphs, "the objective was not compiled"
    assert any(
        node.target is torch.ops.aten.addmm.default or "linear" in str(node.target)
        for g in graphs
        for node in g.graph.nodes
    ), "the flow's layers are not in the compiled graph"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_fit(False)[0]), rtol=1e-5, atol=1e-6)


def _fit_model(make, data, compile, objective=None) -> list[float]:
    torch.manual_seed(0)
    losses: list[float] = []

    class Record(flows.train.Callback):
        def on_step_end(self, trainer, metrics) -> None:
            losses.append(metrics["loss"])

    trainer = Trainer(make(), objective, compile=compile, callbacks=[Record()], progress=False)
    trainer.fit(data, epochs=1, batch_size=40)
    return losses


def test_a_model_the_compiler_rejects_trains_eagerly_with_a_warning() -> None:
    def failing_backend(graph_module, example_inputs):
        raise NotImplementedError("this backend compiles nothing")

    levels = torch.randint(0, 17, (80, 4), generator=torch.Generator().manual_seed(1))
    objective = flows.train.MaximumLikelihood(levels=17)  # draws dequantization noise before the graph

    def make():
        return flows.RealNVP(4, transforms=2, hidden=(8,))

    eager = _fit_model(make, levels, False, objective)
    with pytest.warns(flows.train.TrainingWarning, match="could not compile this model"):
        compiled = _fit_model(make, levels, {"backend": failing_backend}, objective)
    assert compiled == eager  # same random draws, same steps: the failed attempt left no trace


@pytest.mark.parametrize(
    "make",
    [
        lambda: flows.MAF(4, transforms=2, hidden=(8,)),
        lambda: flows.NSF(4, transforms=2, hidden=(8,)),  # hand-written autograd: trained eagerly
        lambda: flows.FFJORD(4, hidden=(8,)),  # adaptive solver: trained eagerly
    ],
    ids=["MAF", "NSF", "FFJORD"],
)
def test_every_kind_of_flow_trains_the_same_with_compile(make) -> None:
    data = _data(80)
    eager = _fit_model(make, data, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", flows.train.TrainingWarning)
        compiled = _fit_model(make, data, True)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)


def test_dequantized_integer_data_compiles() -> None:
    levels = torch.randint(0, 17, (80, 4), generator=torch.Generator().manual_seed(1))
    objective = flows.train.MaximumLikelihood(levels=17)

    def make():
        return flows.RealNVP(4, transforms=2, hidden=(8,))

    eager = _fit_model(make, levels, False, objective)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flows.train.TrainingWarning)  # no fallback to eager here
        compiled = _fit_model(make, levels, True, objective)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)
