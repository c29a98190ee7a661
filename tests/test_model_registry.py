"""The public builder registry, and one model file for every builder in it.

Every registered builder is saved with :func:`flows.save_model` and rebuilt with
:func:`flows.load_model` (small sizes, float64, perturbed weights) and must give the same
``log_prob`` bit for bit; the test is parametrised over :func:`flows.architectures.registry.builders`,
so a builder registered tomorrow is covered on its first day (one with an unusual signature needs a
line in ``_RECIPES``, and the test says so).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import flows
from flows import load_model, save_model
from flows.architectures import registry
from flows.model_file import ModelFileError, describe_model

_GENERATOR_SEED = 7


def _dependent() -> nn.Module:
    from flows.architectures.dependent import DependentFlow

    relationship = torch.eye(6, dtype=torch.float64) * 0.8 + 0.2
    return DependentFlow(flows.RealNVP(2, transforms=1, hidden=(8,)), relationship, lam=0.3)


def _dependent_log_prob(model: nn.Module) -> torch.Tensor:
    x = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(_GENERATOR_SEED))
    return torch.stack([model.log_prob_full(x), *model.log_prob_batch(x[:3], torch.tensor([0, 2, 5]))])


#: Builders whose first arguments are not ``(features, ...)`` or that need other sizes: how to build one.
_RECIPES: dict[str, Callable[[type], nn.Module]] = {
    "Glow": lambda cls: cls((1, 4, 4), scales=1, steps=1, hidden=(4, 4)),
    "FFJORD": lambda cls: cls(3, transforms=1, hidden=(8,), rtol=1e-6, atol=1e-6, trace="exact"),
    "FreeFormInjectiveFlow": lambda cls: cls(3, latent_features=2, hidden=(8,)),
    "EquivariantCNF": lambda cls: cls(3, 2, hidden=(8,), rtol=1e-6, atol=1e-6),
    "DependentFlow": lambda cls: _dependent(),
}
#: How to evaluate a model that has no ``log_prob(x)``.
_EVALUATE: dict[str, Callable[[nn.Module], torch.Tensor]] = {"DependentFlow": _dependent_log_prob}


def _build(name: str) -> nn.Module:
    cls = registry.builders()[name]
    if name in _RECIPES:
        return _RECIPES[name](cls)
    parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert parameters[:1] == ["features"], (
        f"{name}: its constructor starts with {parameters[:2]}, not (features, ...); add a line to _RECIPES in "
        "tests/test_model_registry.py saying how to build a small one"
    )
    return cls(3, transforms=1, hidden=(8,))


def _log_prob(name: str, model: nn.Module) -> torch.Tensor:
    if name in _EVALUATE:
        return _EVALUATE[name](model)
    generator = torch.Generator().manual_seed(_GENERATOR_SEED)
    x = 0.05 + 0.9 * torch.rand((4, *model.event_shape), generator=generator, dtype=torch.float64)
    with torch.no_grad():
        return model.log_prob(x)


def _perturbed(model: nn.Module) -> nn.Module:
    """Weights away from their initial values, so a rebuild that ignored the file could not pass."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


@pytest.mark.parametrize("name", sorted(registry.builders()))
def test_every_registered_builder_round_trips_through_one_model_file(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _perturbed(_build(name).double()).eval()
    reference = _log_prob(name, model)
    assert bool(torch.isfinite(reference).all())
    torch.manual_seed(123)  # the rebuild draws other initial weights: only the file can make them equal
    loaded = load_model(save_model(model, tmp_path / name))
    assert type(loaded) is type(model)
    assert {t.dtype for t in loaded.state_dict().values() if t.is_floating_point()} == {torch.float64}
    assert torch.equal(_log_prob(name, loaded), reference)


def test_a_training_checkpoint_carries_the_model_files_config_and_loads_with_load_model(tmp_path: Path) -> None:
    from flows.train import MaximumLikelihood, Trainer, read_checkpoint_header

    torch.manual_seed(0)
    model = flows.NSF(2, transforms=1, hidden=(8,), standardize=torch.randn(40, 2) * 3 + 5)
    trainer = Trainer(model, MaximumLikelihood(), checkpoint=tmp_path / "run.ckpt", config=describe_model(model))
    trainer.fit(torch.randn(64, 2) * 3 + 5, epochs=1, batch_size=32)
    trainer.save()
    saved = save_model(trainer.model, tmp_path / "model")
    on_file = {k: v for k, v in read_checkpoint_header(tmp_path / "run.ckpt")["config"].items()}
    in_model_file = flows.model_file.read_model_config(saved)
    assert on_file == {k: in_model_file[k] for k in on_file}  # the same dict, less the tensor table and info
    assert set(in_model_file) - set(on_file) == {"tensors", "weights", "aliases", "info"}
    x = torch.randn(5, 2) * 3 + 5
    from_checkpoint = load_model(tmp_path / "run.ckpt")
    assert type(from_checkpoint) is flows.NSF and from_checkpoint.preprocessing == model.preprocessing
    assert torch.equal(from_checkpoint.log_prob(x), trainer.model.eval().log_prob(x))


def test_a_builder_s_own_mixed_dtypes_come_back_and_a_half_converted_model_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _perturbed(_dependent())  # as built: a float32 flow over the base's float64 buffers and parameter
    kinds = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    assert kinds == {torch.float32, torch.float64} and describe_model(model)["dtype"] is None
    loaded = load_model(save_model(model, tmp_path / "dependent"))
    assert {k: t.dtype for k, t in loaded.state_dict().items()} == {k: t.dtype for k, t in model.state_dict().items()}
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(loaded.log_prob_full(x), model.log_prob_full(x))
    half = flows.RealNVP(2, transforms=2, hidden=(4,))
    half.transform.transforms[1].double()
    with pytest.raises(ModelFileError, match=r"expected one floating dtype .* convert the model with .to\(dtype\)"):
        save_model(half, tmp_path / "half")


def test_the_library_s_builders_are_all_registered() -> None:
    import flows.architectures
    import flows.particles

    exported = {
        name: obj
        for module in (flows, flows.architectures, flows.particles)
        for name in module.__all__
        if inspect.isclass(obj := getattr(module, name)) and issubclass(obj, flows.Flow) and obj is not flows.Flow
    }
    exported["DependentFlow"] = flows.DependentFlow  # a model, not a Flow: its base spans the whole data set
    found = registry.builders()
    assert {name: found.get(name) for name in exported} == exported
    assert {"EquivariantCNF", "DependentFlow", "TarFlow"} <= set(found)


def test_lookup_ignores_case_and_an_unknown_name_lists_the_known_ones() -> None:
    assert registry.get("realnvp") is flows.RealNVP and registry.get("TARFLOW") is flows.TarFlow
    assert registry.get("Nope", None) is None
    with pytest.raises(ValueError, match=r"expected a builder among \[.*'RealNVP'.*\] \(any case\), got 'Nope'"):
        registry.get("Nope")
    assert registry.name_of(flows.NSF) == "NSF" and registry.name_of(flows.Flow) is None


def test_register_takes_a_class_a_name_or_both_and_refuses_clashes(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.builders()))

    @registry.register
    class Wide(flows.RealNVP):
        pass

    @registry.register("Narrow")
    class _Narrow(flows.RealNVP):
        pass

    assert registry.get("wide") is Wide and registry.get("narrow") is _Narrow
    assert registry.register(Wide) is Wide  # the same class again changes nothing
    with pytest.raises(ValueError, match=r"unused ignoring case, got 'realNVP'.*'RealNVP' names"):
        registry.register("realNVP", Wide)
    with pytest.raises(TypeError, match="expected a model class"):
        registry.register("tiny", lambda features: flows.RealNVP(features))
    with pytest.raises(ValueError, match="a Python identifier"):
        registry.register("needs-latent", Wide)


def test_save_model_refuses_what_no_registered_builder_made(tmp_path: Path) -> None:
    class Unregistered(flows.RealNVP):
        pass

    with pytest.raises(ModelFileError, match=r"expected a model made by one of the builders .* got Unregistered"):
        save_model(Unregistered(2, transforms=1), tmp_path / "u")
    with pytest.raises(ModelFileError, match="got Flow"):
        save_model(flows.Flow(flows.Affine(2), flows.StandardNormal(2)), tmp_path / "f")
