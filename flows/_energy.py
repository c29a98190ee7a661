r"""The energy protocol: what a stochastic block or sampler needs of a target, defined below both.

:class:`Energy` is anything with an ``event_shape``, an energy :math:`u(x)` of shape ``batch`` and
``energy_and_grad`` (:math:`u` and :math:`\nabla_x u`). :class:`flows.targets.EnergyTarget` satisfies
it, and so does any user object with those three members, so :mod:`flows.bijections.stochastic`
depends on this module and not on :mod:`flows.targets` (layers never import targets; see
``docs/architecture.md``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Energy"]


@runtime_checkable
class Energy(Protocol):
    r"""An energy :math:`u` on events of shape ``event_shape`` (density :math:`\propto e^{-u}`).

    Attributes:
        event_shape: the shape of one configuration.
    """

    event_shape: torch.Size

    def energy(self, x: Tensor) -> Tensor:
        """:math:`u(x)` of shape ``x.shape[:-len(event_shape)]``."""
        ...

    def energy_and_grad(self, x: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        r""":math:`(u(x), \nabla_x u(x))`; with ``create_graph`` the gradient is differentiable."""
        ...
