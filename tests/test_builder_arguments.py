"""One builder vocabulary: the shared argument checker's errors, and the deprecated spellings that still work."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

from flows import CNF, FFJORD, IAF, MAF, NICE, NSF, FreeFormInjectiveFlow, Glow, RealNVP, evaluating
from flows.model_file import save_model
from flows.particles import EquivariantCNF

VECTOR = {
    "RealNVP": lambda **o: RealNVP(3, **{"transforms": 1, "hidden": (4,), **o}),
    "NICE": lambda **o: NICE(3, **{"transforms": 1, "hidden": (4,), **o}),
    "MAF": lambda **o: MAF(3, **{"transforms": 1, "hidden": (4,), **o}),
    "IAF": lambda **o: IAF(3, **{"transforms": 1, "hidden": (4,), **o}),
    "NSF": lambda **o: NSF(3, **{"transforms": 1, "hidden": (4,), **o}),
    "NSF-coupling": lambda **o: NSF(3, **{"transforms": 1, "hidden": (4,), "coupling": True, **o}),
    "FFJORD": lambda **o: FFJORD(3, **{"transforms": 1, "hidden": (4,), **o}),
    "FreeFormInjectiveFlow": lambda **o: FreeFormInjectiveFlow(3, **{"latent_features": 2, "hidden": (4,), **o}),
}
WITH_TRANSFORMS = [name for name in VECTOR if name != "FreeFormInjectiveFlow"]
NAME = {"NSF-coupling": "NSF"}


def _name(builder: str) -> str:
    return NAME.get(builder, builder)


@pytest.mark.parametrize("builder", list(VECTOR))
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"hidden": 64}, TypeError, r"expected hidden to be a sequence of layer widths such as \(64, 64\), got 64"),
        ({"hidden": "64"}, TypeError, "expected hidden to be a sequence of layer widths"),
        ({"hidden": (8, 0)}, ValueError, r"expected hidden to be positive int widths.*, got \(8, 0\)"),
        ({"hidden": (8.5,)}, ValueError, r"expected hidden to be positive int widths.*, got \(8.5,\)"),
        ({"context": -1}, ValueError, "expected context to be an int >= 0, got -1"),
        ({"context": 1.5}, ValueError, "expected context to be an int >= 0, got 1.5"),
        (
            {"activation": nn.ReLU()},
            TypeError,
            r"expected activation to be a module class or factory .*got the instance",
        ),
        ({"activation": "relu"}, TypeError, "expected activation to be a module class or factory such as nn.ReLU"),
    ],
)
def test_the_shared_checker_names_what_was_expected_and_what_came(
    builder: str, options: dict, error: type, message: str
) -> None:
    with pytest.raises(error, match=f"^{_name(builder)}: {message}"):
        VECTOR[builder](**options)


@pytest.mark.parametrize("builder", WITH_TRANSFORMS)
@pytest.mark.parametrize("transforms", [0, -1, 1.5, True])
def test_transforms_must_be_a_positive_int(builder: str, transforms: object) -> None:
    with pytest.raises(
        ValueError, match=rf"^{_name(builder)}: expected transforms to be an int >= 1, got {transforms}"
    ):
        VECTOR[builder](transforms=transforms)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RealNVP(1), r"RealNVP: expected features to be an int >= 2 \(couplings need two parts\), got 1"),
        (lambda: NICE(2.0), r"NICE: expected features to be an int >= 2 \(couplings need two parts\), got 2.0"),
        (lambda: MAF("3"), "MAF: expected features to be an int >= 1, got '3'"),
        (lambda: FFJORD(0), "FFJORD: expected features to be an int >= 1, got 0"),
        (lambda: FreeFormInjectiveFlow(0, latent_features=1), "FreeFormInjectiveFlow: expected features to be an int"),
        (
            lambda: MAF(3, hidden=()),
            r"MAF: expected hidden to be positive int widths \(at least 1 hidden layer\), got \(\)",
        ),
        (lambda: FreeFormInjectiveFlow(3, latent_features=2, beta=-1.0), "expected beta to be a finite number >= 0"),
        (
            lambda: FreeFormInjectiveFlow(3, latent_features=2, noise_std=float("nan")),
            "expected noise_std to be a finite",
        ),
        (lambda: Glow((1, 4, 4), levels=1, steps=0), "Glow: expected steps to be an int >= 1, got 0"),
        (lambda: Glow((1, 4, 4), levels=0), "Glow: expected levels to be an int >= 1, got 0"),
        (lambda: Glow((1, 4, 4), levels=1, hidden=(4, 0)), r"Glow: expected hidden to be positive int widths"),
        (lambda: Glow((1, 4, 4), levels=1, context=-2), "Glow: expected context to be an int >= 0, got -2"),
        (lambda: Glow((1, 4, 4), levels=1, activation=nn.ReLU()), "Glow: expected activation to be a module class"),
        (lambda: EquivariantCNF(3, 2, hidden=(8, 4)), r"EquivariantCNF: expected equal hidden widths .*got \(8, 4\)"),
        (
            lambda: EquivariantCNF(3, 2, hidden=()),
            r"EquivariantCNF: expected hidden to be positive int widths \(at least 1 hidden layer\), got \(\)",
        ),
    ],
)
def test_other_builders_use_the_same_checks(build, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_empty_hidden_is_a_linear_conditioner_where_the_network_allows_it() -> None:
    x = torch.randn(5, 3)
    assert RealNVP(3, transforms=2, hidden=[]).log_prob(x).shape == (5,)
    assert NSF(3, transforms=2, hidden=(), coupling=True).log_prob(x).shape == (5,)


# -- deprecated spellings: they warn and give the same model ----------------------------------------


def _same_log_prob(old, new, x: torch.Tensor, context: torch.Tensor | None = None) -> None:
    with evaluating(old), evaluating(new):
        torch.testing.assert_close(old.log_prob(x, context), new.log_prob(x, context), rtol=0, atol=0)


def _built(seed: int, build):
    torch.manual_seed(seed)
    return build()


def test_ffjord_time_is_t1() -> None:
    x = torch.randn(4, 2)
    new = _built(0, lambda: FFJORD(2, hidden=(8,), t1=0.5, trace="exact"))
    with pytest.warns(DeprecationWarning, match=r"FFJORD: time= is deprecated, use t1="):
        old = _built(0, lambda: FFJORD(2, hidden=(8,), time=0.5, trace="exact"))
    assert old.transform[0].t1 == new.transform[0].t1 == 0.5
    _same_log_prob(old, new, x)
    assert isinstance(new.transform[0], CNF)
    with pytest.raises(TypeError, match=r"FFJORD: got both time= \(the old name\) and t1="):
        FFJORD(2, time=0.5, t1=0.5)


def test_a_model_built_with_an_old_name_is_saved_with_the_new_one(tmp_path) -> None:
    with pytest.warns(DeprecationWarning):
        model = FFJORD(2, hidden=(8,), time=0.5)
    save_model(model, tmp_path / "ffjord")
    arguments = json.loads((tmp_path / "ffjord.json").read_text())["arguments"]
    assert arguments["t1"] == 0.5 and "time" not in arguments
    with pytest.warns(DeprecationWarning, match=r"Glow: hidden=4 \(one width\) is deprecated"):
        glow = Glow((1, 4, 4), levels=1, steps=1, hidden=4)
    save_model(glow, tmp_path / "glow")
    assert json.loads((tmp_path / "glow.json").read_text())["arguments"]["hidden"] == [4, 4]


def test_glow_int_hidden_is_two_equal_layers() -> None:
    x = torch.rand(3, 1, 4, 4)
    new = _built(1, lambda: Glow((1, 4, 4), levels=1, steps=1, hidden=(6, 6)))
    with pytest.warns(DeprecationWarning, match=r"pass the widths hidden=\(6, 6\)"):
        old = _built(1, lambda: Glow((1, 4, 4), levels=1, steps=1, hidden=6))
    assert old.hidden == new.hidden == (6, 6)
    _same_log_prob(old, new, x)
    deeper = Glow((1, 4, 4), levels=1, steps=1, hidden=(6, 5, 6))  # a sequence sets the depth too
    assert deeper.log_prob(x).shape == (3,)


def test_equivariant_cnf_width_and_layers_are_one_width_per_layer() -> None:
    x = torch.randn(2, 6)
    x = x - x.unflatten(-1, (3, 2)).mean(-2).repeat(1, 3)
    options = {"rtol": 1e-4, "atol": 1e-4}
    new = _built(2, lambda: EquivariantCNF(3, 2, hidden=(8, 8), **options))
    with pytest.warns(DeprecationWarning, match=r"layers= is deprecated, pass one width per layer: hidden=\(8, 8\)"):
        old = _built(2, lambda: EquivariantCNF(3, 2, hidden=8, layers=2, **options))
    _same_log_prob(old, new, x)
    with pytest.warns(DeprecationWarning, match=r"hidden=8 \(one width\) is deprecated.*hidden=\(8, 8, 8\)"):
        three = EquivariantCNF(3, 2, hidden=8)
    assert len(three.transform.field.edge) == 3
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="expected 2 hidden widths for layers=2"):
        EquivariantCNF(3, 2, hidden=(8, 8, 8), layers=2)


def test_new_spellings_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        FFJORD(2, hidden=(4,), t1=2.0)
        Glow((1, 4, 4), levels=1, steps=1, hidden=(4, 4))
        EquivariantCNF(3, 2, hidden=(4,))


def test_iaf_takes_maf_options() -> None:
    """MAF and IAF are one builder (IAF inverts every layer), so IAF takes dropout and batch_norm too."""
    torch.manual_seed(0)
    iaf = IAF(3, transforms=3, hidden=(8,), batch_norm=True, dropout=0.1)
    assert sum(type(m.transform).__name__ == "BatchNorm" for m in iaf.transform) == 2
    with evaluating(iaf):
        x, log_p = iaf.sample_and_log_prob((5,))
        torch.testing.assert_close(iaf.log_prob(x), log_p, rtol=1e-4, atol=1e-4)
    iaf.train()
    x, log_p = iaf.sample_and_log_prob((6,))  # train mode: the batch norms use the samples' statistics
    assert log_p.shape == (6,) and bool(torch.isfinite(log_p).all())
