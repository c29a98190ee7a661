"""Registry cases for the transformer autoregressive flows: every scale, order, first-token mode and conditioning.

Events are short token sequences ``(T, C)``; the class-conditional cases draw their contexts as
class indices (``-1``, the null class, included) instead of Gaussian noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import flows
from tests.registry import Case


@dataclass(repr=False)
class ClassCase(Case):
    """A case whose context is a class index in ``-1..num_classes-1`` (stored as a float).

    The indices cycle through every class and the null class in a random order, so that a batch of
    ``num_classes + 1`` rows reaches every row of the class table (and the learned null row).
    """

    num_classes: int = 3

    def contexts(self, batch: tuple[int, ...], generator: torch.Generator, dtype=torch.float64) -> Tensor | None:
        n = int(torch.Size(batch).numel())
        labels = torch.randperm(n, generator=generator) % (self.num_classes + 1) - 1
        return labels.reshape(*batch, 1).to(dtype)


def _block(tokens: int = 4, features: int = 2, context: int = 0, **options) -> flows.TransformerAutoregressive:
    torch.manual_seed(0)
    options = {"width": 8, "layers": 1, "heads": 2, **options}
    return flows.TransformerAutoregressive(tokens, features, context, **options)


def _ta(name: str, event: tuple[int, int] = (4, 2), context: int = 0, **options) -> Case:
    return Case(
        f"transformer-ar-{name}",
        lambda: _block(*event, context, **options),
        event,
        context=context,
        tags=("transformer",),
    )


CASES = [
    _ta("exp"),
    _ta("exp-two-layers", (3, 1), layers=2),
    _ta("exp-reverse", order="reverse"),
    _ta("exp-permuted", (5, 1), order=[3, 0, 4, 1, 2]),
    _ta("exp-two-tokens-sos", (2, 3), first_token="transform"),
    _ta("softplus-clip", (5, 3), scale="softplus", soft_clip=2.0),
    _ta("softplus-sos", scale="softplus", first_token="transform", order="reverse"),
    _ta("sigmoid", (3, 3), scale="sigmoid"),
    _ta("sigmoid-sos-clip", scale="sigmoid", first_token="transform", soft_clip=3.0),
    _ta("uncached", decoding="uncached"),
    _ta("jacobi", (3, 3), decoding="jacobi"),
    _ta("context", context=3, order="reverse"),
    _ta("context-softplus", (5, 1), context=2, scale="softplus", first_token="transform"),
    ClassCase(
        "transformer-ar-classes",
        lambda: _block(num_classes=3),
        (4, 2),
        context=1,
        tags=("transformer",),
    ),
    ClassCase(
        "transformer-ar-classes-learned-null",
        lambda: _block(3, 2, num_classes=3, null_class="learned", scale="sigmoid", order="reverse"),
        (3, 2),
        context=1,
        tags=("transformer",),
    ),
    Case("patchify", lambda: flows.Patchify((2, 4, 6), 2), (2, 4, 6), tags=("image", "transformer")),
    Case("patchify-whole", lambda: flows.Patchify((1, 3, 3), 3), (1, 3, 3), tags=("image", "transformer")),
]
