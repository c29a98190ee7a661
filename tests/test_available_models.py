"""``flows models`` lists exactly the builders ``flows fit`` can build and train: each one fits here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flows import load_model
from flows.architectures import registry
from flows.cli import main
from flows.cli.models import fit_builders, fit_can_build


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "table.npy"
    rows = np.random.default_rng(0).normal(size=(80, 3)) * [1.0, 5.0, 0.1]
    np.save(path, rows.astype(np.float32))
    return path


def test_models_prints_the_fit_ready_builders(capsys) -> None:
    assert main(["models"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == fit_builders()
    assert {"FFJORD", "IAF", "MAF", "NICE", "NSF", "RealNVP"} <= set(printed)
    # Glow takes an image shape, levels and steps; FIF is trained by its own objective; DependentFlow
    # takes a flow and a relationship matrix, EquivariantCNF particles
    not_fit = {"Glow", "FreeFormInjectiveFlow", "DependentFlow", "EquivariantCNF"}
    assert not not_fit & set(printed)
    assert not_fit | set(printed) <= set(registry.builders())


@pytest.mark.parametrize("name", fit_builders())
def test_every_listed_model_fits_through_the_command(name: str, table: Path, tmp_path: Path) -> None:
    """The path of ``flows fit --model NAME``: option checks, model_for_data, one epoch, the saved model."""
    out = tmp_path / name
    command = ["fit", "--data", str(table), "--model", name, "--out", str(out), "--epochs", "1"]
    tiny = ["--transforms", "1", "--hidden", "4", "--batch-size", "64", "--threads", "1", "--quiet", "--no-plots"]
    assert main([*command, *tiny]) == 0
    model = load_model(out)
    assert type(model).__name__ == name
    with torch.no_grad():
        log_prob = model.eval().log_prob(torch.from_numpy(np.load(table))[:5])
    assert log_prob.shape == (5,) and bool(torch.isfinite(log_prob).all())


def test_a_registered_builder_is_listed_only_when_fit_can_call_it(monkeypatch, tmp_path: Path) -> None:
    from flows import RealNVP, save_model

    class Tiny(RealNVP):
        def __init__(self, features, context=0, **options):
            super().__init__(features, context, transforms=1, hidden=(4,))

    class NeedsLatent(RealNVP):
        def __init__(self, features, context=0, *, latent_features: int):
            super().__init__(features, context, transforms=1, hidden=(latent_features,))

    monkeypatch.setitem(registry._REGISTRY, "Tiny", Tiny)
    monkeypatch.setitem(registry._REGISTRY, "NeedsLatent", NeedsLatent)
    assert fit_can_build(Tiny) and not fit_can_build(NeedsLatent)
    assert "Tiny" in fit_builders() and "NeedsLatent" not in fit_builders()
    # every registered builder saves and loads, whether flows fit can build it or not
    model = NeedsLatent(3, latent_features=5)
    x = torch.randn(2, 3)
    assert torch.equal(load_model(save_model(model, tmp_path / "latent")).log_prob(x), model.log_prob(x))


def test_an_old_keyword_through_option_is_refused(table: Path, tmp_path: Path, capsys) -> None:
    """``--option time=`` (FFJORD's old name for ``t1``) is an unknown option now, refused before training."""
    out = tmp_path / "ffjord"
    command = ["fit", "--data", str(table), "--model", "FFJORD", "--out", str(out), "--epochs", "1"]
    assert main([*command, "--transforms", "1", "--hidden", "4", "--quiet", "--no-plots", "--option", "time=0.5"]) == 2
    error = capsys.readouterr().err
    assert "expected one of FFJORD's options" in error and "'t1'" in error and "got 'time'" in error
    assert not (out / "run.json").exists()


def test_fit_refuses_a_builder_it_cannot_build(table: Path, tmp_path: Path, capsys) -> None:
    command = ["fit", "--data", str(table), "--model", "Glow", "--out", str(tmp_path / "g"), "--epochs", "1"]
    assert main([*command, "--quiet", "--no-plots"]) == 2
    assert "Glow" in capsys.readouterr().err
