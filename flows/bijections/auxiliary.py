"""Auxiliary losses: how transforms hand regularisers (EIW, RNODE, ...) to whoever trains them.

A transform that has a regulariser calls :func:`add_auxiliary_loss` during its forward pass. The
value goes to every :class:`AuxiliaryLosses` collector that is open at that moment, and nowhere
else: no state is kept on the module, so nothing can go stale. When no collector is open the call
is a no-op, and :func:`collecting_auxiliary_losses` lets a transform skip computing the term.

Trainers open a collector around the loss computation and add ``aux.total()`` to the loss::

    with AuxiliaryLosses() as aux:
        loss = -flow.log_prob(x).mean()
    loss = loss + aux.total()

Each term is already multiplied by the weight its transform was configured with.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
from torch import Tensor

__all__ = ["AuxiliaryLosses", "add_auxiliary_loss", "collecting_auxiliary_losses"]

_ACTIVE: ContextVar[tuple[AuxiliaryLosses, ...]] = ContextVar("flows_auxiliary_losses", default=())


class AuxiliaryLosses:
    """Context manager that collects the auxiliary losses added while it is open.

    Example:
        >>> import torch
        >>> from flows.bijections.auxiliary import AuxiliaryLosses, add_auxiliary_loss
        >>> with AuxiliaryLosses() as aux:
        ...     add_auxiliary_loss("penalty", torch.tensor(0.5))
        ...     add_auxiliary_loss("penalty", torch.tensor(0.25))
        >>> float(aux.total()), aux.by_name()["penalty"].item()
        (0.75, 0.75)
    """

    def __init__(self) -> None:
        self.terms: list[tuple[str, Tensor]] = []
        self._token = None

    def __enter__(self) -> AuxiliaryLosses:
        self._token = _ACTIVE.set((*_ACTIVE.get(), self))
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)
        self._token = None

    def add(self, name: str, value: Tensor) -> None:
        """Record one term (a scalar tensor, already weighted)."""
        self.terms.append((name, value))

    def total(self) -> Tensor:
        """Sum of all terms (a zero tensor when there are none)."""
        if not self.terms:
            return torch.zeros(())
        total = self.terms[0][1]
        for _, value in self.terms[1:]:
            total = total + value
        return total

    def by_name(self) -> dict[str, Tensor]:
        """Terms summed per name, for logging."""
        out: dict[str, Tensor] = {}
        for name, value in self.terms:
            out[name] = out[name] + value if name in out else value
        return out

    def __len__(self) -> int:
        return len(self.terms)


def add_auxiliary_loss(name: str, value: Tensor) -> None:
    """Hand a weighted scalar loss term to every open :class:`AuxiliaryLosses` collector."""
    for collector in _ACTIVE.get():
        collector.add(name, value)


def collecting_auxiliary_losses() -> bool:
    """Whether any collector is open (transforms may skip computing their terms when not)."""
    return bool(_ACTIVE.get())
