"""One builder vocabulary: the shared argument checker's errors, and the old spellings refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flows import FFJORD, IAF, MAF, NICE, NSF, FreeFormInjectiveFlow, Glow, RealNVP, evaluating
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
        ({"context": 1.5}, TypeError, "expected context to be an int >= 0, got 1.5"),
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
@pytest.mark.parametrize(
    ("transforms", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_transforms_must_be_a_positive_int(builder: str, transforms: object, error: type) -> None:
    with pytest.raises(error, match=rf"^{_name(builder)}: expected transforms to be an int >= 1, got {transforms}"):
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
        (lambda: Glow((1, 4, 4), scales=1, steps=0), "Glow: expected steps to be an int >= 1, got 0"),
        (lambda: Glow((1, 4, 4), scales=0), "Glow: expected scales to be an int >= 1, got 0"),
        (lambda: Glow((1, 4, 4), scales=1, hidden=(4, 0)), r"Glow: expected hidden to be positive int widths"),
        (lambda: Glow((1, 4, 4), scales=1, context=-2), "Glow: expected context to be an int >= 0, got -2"),
        (lambda: Glow((1, 4, 4), scales=1, activation=nn.ReLU()), "Glow: expected activation to be a module class"),
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


# -- the old spellings are gone: nothing was released, so they are refused, not translated -----------


def test_the_old_spellings_are_refused() -> None:
    with pytest.raises(TypeError, match="time"):  # FFJORD's integration length is t1=, as CNF's
        FFJORD(2, hidden=(8,), time=0.5)
    with pytest.raises(TypeError, match=r"Glow: expected hidden to be a sequence of layer widths .*got 4"):
        Glow((1, 4, 4), scales=1, steps=1, hidden=4)
    with pytest.raises(TypeError, match=r"EquivariantCNF: expected hidden to be a sequence .*got 8"):
        EquivariantCNF(3, 2, hidden=8)
    with pytest.raises(TypeError, match="layers"):  # one width per layer: hidden=(8, 8)
        EquivariantCNF(3, 2, hidden=(8, 8), layers=2)


def test_the_new_spellings_build() -> None:
    assert FFJORD(2, hidden=(4,), t1=2.0).transform[0].t1 == 2.0
    assert Glow((1, 4, 4), scales=1, steps=1, hidden=(6, 5, 6)).hidden == (6, 5, 6)  # a sequence sets the depth
    assert len(EquivariantCNF(3, 2, hidden=(4, 4)).transform.field.edge) == 2


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
