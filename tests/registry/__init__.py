"""The transform registry: every exported transform, with inputs, driving the generic test suite.

Each module ``tests/registry/cases_*.py`` defines ``CASES``, a list of :class:`Case`. Add a module
(one per family) or append to one; ``tests/test_registry.py`` picks every case up and also fails if
a transform exported by ``flows`` has no case (see ``EXEMPT`` there for the few that cannot have one).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flows.bijections.base import Bijection

__all__ = ["Case", "all_cases"]


@dataclass
class Case:
    """One registry entry.

    Attributes:
        name: test id.
        make: builds the transform (in the default dtype; the suite converts it to float64).
        event_shape: concrete input event shape used by the suite (fills any ``None`` sizes).
        context: context width (0 for unconditional).
        domain: ``"real"`` for inputs on the real line, ``"unit"`` for inputs in ``(0, 1)``.
        sample: optional ``(shape, generator) -> Tensor`` drawing valid inputs (overrides ``domain``).
        perturb: standard deviation of the parameter perturbation away from initialisation.
        warmup: run one forward pass in train mode before perturbing (data-dependent init).
        train_eval_parity: outputs identical in train and eval mode.
        atol: tolerance for the float64 checks (``None`` = ``check_bijection``'s default).
        batch_shapes: batch shapes exercised by the shape tests.
        tags: free-form labels (e.g. ``"image"``).
    """

    name: str
    make: Callable[[], Bijection]
    event_shape: tuple[int, ...]
    context: int = 0
    domain: str = "real"
    sample: Callable[[tuple[int, ...], torch.Generator], Tensor] | None = None
    perturb: float = 0.1
    warmup: bool = False
    train_eval_parity: bool = True
    atol: float | None = None
    batch_shapes: tuple[tuple[int, ...], ...] = ((), (5,), (2, 3))
    tags: tuple[str, ...] = field(default_factory=tuple)

    def inputs(self, batch: tuple[int, ...], generator: torch.Generator, dtype=torch.float64) -> Tensor:
        """Valid inputs of shape ``(*batch, *event_shape)``."""
        shape = (*batch, *self.event_shape)
        if self.sample is not None:
            return self.sample(shape, generator).to(dtype)
        if self.domain == "unit":
            return (0.05 + 0.9 * torch.rand(shape, generator=generator, dtype=torch.float64)).to(dtype)
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)

    def contexts(self, batch: tuple[int, ...], generator: torch.Generator, dtype=torch.float64) -> Tensor | None:
        """A context of shape ``(*batch, context)`` or ``None``."""
        if not self.context:
            return None
        return torch.randn((*batch, self.context), generator=generator, dtype=torch.float64).to(dtype)

    def __repr__(self) -> str:
        return self.name


def all_cases() -> list[Case]:
    """Every case of every ``cases_*`` module in this package."""
    cases: list[Case] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("cases_"):
            cases.extend(importlib.import_module(f"{__name__}.{info.name}").CASES)
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"registry: duplicate case names {sorted(duplicates)}")
    return cases
