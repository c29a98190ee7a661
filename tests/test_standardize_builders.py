"""standardize= in every builder: the model keeps its class, the log-det accounts for it, raw tables fit well."""

from __future__ import annotations

import math

import pytest
import torch

from flows import FFJORD, IAF, MAF, NICE, NSF, Flow, FreeFormInjectiveFlow, Glow, RealNVP, Standardize

OFFSET = torch.tensor([1000.0, -300.0, 3.0])
SCALE = torch.tensor([50.0, 0.01, 2.0])


def _raw(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=gen, dtype=torch.float64) * SCALE.double() + OFFSET.double()


BUILDERS = {
    "NSF": lambda s: NSF(3, transforms=1, hidden=(8,), bins=4, standardize=s),
    "NSF-coupling": lambda s: NSF(3, transforms=2, hidden=(8,), coupling=True, standardize=s),
    "MAF": lambda s: MAF(3, transforms=1, hidden=(8,), standardize=s),
    "IAF": lambda s: IAF(3, transforms=1, hidden=(8,), standardize=s),
    "RealNVP": lambda s: RealNVP(3, transforms=2, hidden=(8,), standardize=s),
    "NICE": lambda s: NICE(3, transforms=2, hidden=(8,), standardize=s),
    "FFJORD": lambda s: FFJORD(3, hidden=(8,), trace="exact", rtol=1e-7, atol=1e-7, standardize=s),
    "FIF": lambda s: FreeFormInjectiveFlow(3, latent_features=3, hidden=(8,), standardize=s),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_standardize_keeps_the_class_and_the_change_of_variables(name: str) -> None:
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        data = _raw(64)
        model = BUILDERS[name](data).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    assert type(model).__name__ == name.split("-")[0].replace("FIF", "FreeFormInjectiveFlow")
    assert model.preprocessing == [{"layer": "Standardize", "options": {}}]
    layer = model.transform[0]
    assert isinstance(layer, Standardize)
    mean, std = data.mean(0), data.std(0, correction=0)
    torch.testing.assert_close(layer.loc, mean)
    torch.testing.assert_close(layer.scale, std)
    # log p(x) = log p_core((x - mu) / sigma) - sum log sigma: the density of the raw data
    x = _raw(5, seed=1)
    with torch.no_grad():
        inner = Flow(model.core, model.base).double().log_prob((x - mean) / std)
        torch.testing.assert_close(model.log_prob(x), inner - std.log().sum(), atol=1e-6, rtol=1e-6)
    assert list(model.state_dict())[:2] == ["transform.transforms.0.loc", "transform.transforms.0.scale"]


def test_standardize_keeps_builder_methods() -> None:
    data = torch.randn(20, 2) * 10 + 5
    ffjord = FFJORD(2, hidden=(8,), standardize=data)
    ffjord.log_prob(data[:3])
    assert isinstance(ffjord, FFJORD) and ffjord.nfe > 0
    images = torch.randn(10, 1, 4, 4) * 3 + 7
    glow = Glow((1, 4, 4), scales=1, steps=1, hidden=(4, 4), logit_alpha=None, standardize=images)
    assert isinstance(glow, Glow)
    assert glow.sample((2,), temperature=0.5).shape == (2, 1, 4, 4)
    assert glow.log_prob(images[:3]).shape == (3,)
    with pytest.raises(ValueError, match="expected logit_alpha=None with standardize"):
        Glow((1, 4, 4), scales=1, steps=1, hidden=(4, 4), standardize=images)


def test_config_preprocessing_keeps_the_class(tmp_path) -> None:
    from flows import load_model, save_model

    model = load_model(save_model(FFJORD(2, hidden=[8]).prepend(Standardize(2)), tmp_path / "ffjord"))
    assert type(model) is FFJORD and model.preprocessing == [{"layer": "Standardize", "options": {}}]
    model.log_prob(torch.randn(3, 2))
    assert model.nfe > 0
    assert isinstance(model.transform[0], Standardize)


def test_standardize_accepts_a_fitted_layer_and_checks_shapes() -> None:
    layer = Standardize(3, loc=torch.tensor([1.0, 2.0, 3.0]), scale=2.0)
    model = MAF(3, transforms=1, hidden=(8,), standardize=layer)
    assert model.transform[0] is layer
    with pytest.raises(ValueError, match=r"expected standardize data or layer with event shape \(3,\), got \(4,\)"):
        MAF(3, transforms=1, hidden=(8,), standardize=torch.randn(10, 4))
    with pytest.raises(TypeError, match="expected standardize to be data"):
        MAF(3, transforms=1, hidden=(8,), standardize=[1.0, 2.0, 3.0])


def test_nsf_on_a_raw_table_fits_with_standardize_and_not_without() -> None:
    """Offsets of 1000 and scales from 0.01 to 50: NSF's splines act on [-5, 5] and see nothing without it."""
    gen = torch.Generator().manual_seed(0)
    mix = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    scale, offset = torch.tensor([50.0, 0.01]), torch.tensor([1000.0, -300.0])

    def draw(n: int) -> torch.Tensor:
        return (torch.randn(n, 2, generator=gen) @ mix.T) * scale + offset

    train, test = draw(500), draw(2000)
    cov = (mix @ mix.T) * torch.outer(scale, scale)
    entropy = 0.5 * torch.logdet(2 * math.pi * math.e * cov).item()  # the best possible test NLL (1.63)
    results = {}
    for standardize in (True, False):
        torch.manual_seed(1)
        model = NSF(2, transforms=1, hidden=(16,), standardize=train if standardize else None)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(100):
            loss = -model.log_prob(train).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            results[standardize] = -model.log_prob(test).mean().item()
    assert results[True] < entropy + 0.1  # measured: 1.644 vs 1.634
    assert results[False] > entropy + 1000  # measured: about 5e5
