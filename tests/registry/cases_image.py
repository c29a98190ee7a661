"""Registry cases for the image family: squeeze, split, flatten, 1×1 convolutions, EIW, Glow's transform.

Events are tiny images (mostly ``(4, 4, 4)``) so that the ``H·W`` factors are checked against the
full autograd Jacobian.
"""

from __future__ import annotations

import torch

import flows
from flows.bijections import half_mask
from flows.nn import ConvNet
from tests.registry import Case


def _seeded(fn):
    def make():
        torch.manual_seed(0)
        return fn()

    return make


def _mixed_channels(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Channels with different shapes of distribution (Gaussian, uniform, Laplace, ...), so that the
    entropy-informed order is not the identity."""
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    channels = shape[-3]
    out = x.clone()
    for c in range(channels):
        kind = c % 4
        if kind == 1:
            out[..., c, :, :] = x[..., c, :, :].pow(3) / 3  # heavy-tailed
        elif kind == 2:
            out[..., c, :, :] = 3.4 * (u[..., c, :, :] - 0.5)  # uniform
        elif kind == 3:
            out[..., c, :, :] = torch.sign(x[..., c, :, :]) * torch.log1p(-u[..., c, :, :]).neg()  # Laplace
        else:
            out[..., c, :, :] = x[..., c, :, :]  # Gaussian
    return out


def _split(context: int = 0) -> flows.Split:
    inner = flows.Chain(
        flows.Squeeze(2),
        flows.Invertible1x1Conv(8, lu=True),
        flows.AffineCoupling((8, None, None), context, conditioner=ConvNet(4, 8, (8,), context=context)),
        flows.Flatten((8, 2, 2)),
    )
    return flows.Split((4, 4, 4), inner)


def _glow(**options) -> flows.Bijection:
    return flows.Glow((1, 8, 8), scales=2, steps=1, hidden=(8, 8), **options).transform


CASES = [
    Case("squeeze", lambda: flows.Squeeze(1), (1, 4, 4), tags=("image",)),
    Case("squeeze-4ch", lambda: flows.Squeeze(4), (4, 4, 4), tags=("image",)),
    Case("squeeze-factor3", lambda: flows.Squeeze(2, factor=3), (2, 3, 6), tags=("image",)),
    Case("flatten", lambda: flows.Flatten((2, 3, 3)), (2, 3, 3), tags=("image",)),
    Case("invertible-1x1", _seeded(lambda: flows.Invertible1x1Conv(4)), (4, 4, 4), tags=("image",)),
    Case("invertible-1x1-lu", _seeded(lambda: flows.Invertible1x1Conv(4, lu=True)), (4, 4, 4), tags=("image",)),
    Case("invertible-1x1-rect", _seeded(lambda: flows.Invertible1x1Conv(3)), (3, 2, 5), tags=("image",)),
    Case("split", _seeded(_split), (4, 4, 4), tags=("image",)),
    Case("split-context", _seeded(lambda: _split(3)), (4, 4, 4), context=3, tags=("image",)),
    Case(
        "affine-coupling-conv",
        lambda: flows.AffineCoupling((4, None, None), conditioner=ConvNet(2, 4, (8, 8))),
        (4, 4, 4),
        tags=("image",),
    ),
    Case(
        "affine-coupling-conv-context",
        lambda: flows.AffineCoupling(
            (4, None, None), 2, mask=half_mask(4, keep_first=False), conditioner=ConvNet(2, 4, (8,), context=2)
        ),
        (4, 4, 4),
        context=2,
        tags=("image",),
    ),
    # The entropy-informed order is a function of running statistics that train-mode calls update, so
    # these cases estimate it on the warm-up batch and then freeze it (update_steps=1): the suite checks
    # the layer as the bijection it is for a given order. The updating itself (train mode only, before
    # the permutation is applied, inverse from the buffers, hysteresis) is tested in tests/test_eiw.py.
    Case(
        "entropy-permutation",
        lambda: flows.EntropyPermutation(4, update_steps=1),
        (4, 4, 4),
        sample=_mixed_channels,
        warmup=True,
        tags=("image",),
    ),
    Case(
        "eiw-shuffle",
        _seeded(lambda: flows.EIWShuffle(4, hidden=(8,), update_steps=1)),
        (4, 4, 4),
        sample=_mixed_channels,
        warmup=True,
        perturb=0.3,
        tags=("image",),
    ),
    Case(
        "eiw-shuffle-context",
        _seeded(lambda: flows.EIWShuffle(5, 2, hidden=(8,), update_steps=1)),
        (5, 2, 3),
        context=2,
        sample=_mixed_channels,
        warmup=True,
        perturb=0.3,
        tags=("image",),
    ),
    Case("glow-transform", _seeded(_glow), (1, 8, 8), domain="unit", warmup=True, atol=1e-6, tags=("image",)),
    Case(
        "glow-transform-circulant",
        _seeded(lambda: _glow(mixer="circulant", coupling="additive")),
        (1, 8, 8),
        domain="unit",
        warmup=True,
        atol=1e-6,
        tags=("image",),
    ),
    Case(
        "glow-transform-eiw-lu",
        _seeded(lambda: _glow(split="eiw", mixer="lu", eiw_update_steps=1)),
        (1, 8, 8),
        domain="unit",
        warmup=True,
        atol=1e-6,
        tags=("image",),
    ),
]
