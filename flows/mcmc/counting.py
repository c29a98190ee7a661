r"""Counting target evaluations, the budget unit of sampler comparisons."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from flows.targets.base import EnergyTarget, as_target

__all__ = ["CountingTarget"]


class CountingTarget(EnergyTarget):
    """Wrap a target and count how many configurations its energy (and gradient) is evaluated at.

    Samplers are compared at an equal budget of target evaluations: wrap the target, run the
    sampler, read :attr:`energy_evals` (energies without gradient) and :attr:`grad_evals`
    (energies with gradient). The wrapped target's own :meth:`energy_and_grad` is used, so
    analytic gradients are kept.

    Args:
        target: the target to count.

    Example:
        >>> import torch
        >>> from flows.targets import Gaussian
        >>> counted = CountingTarget(Gaussian(3))
        >>> _ = counted.energy(torch.zeros(5, 3)); _ = counted.energy_and_grad(torch.zeros(2, 4, 3))
        >>> counted.energy_evals, counted.grad_evals, counted.evaluations
        (5, 8, 13)
    """

    def __init__(self, target: EnergyTarget) -> None:
        target = as_target(target, "CountingTarget")
        super().__init__(tuple(target.event_shape))
        self.target = target
        self.energy_evals = 0
        self.grad_evals = 0

    @property
    def log_Z(self) -> float | None:  # type: ignore[override]
        """The wrapped target's ``log_Z``."""
        return self.target.log_Z

    @property
    def evaluations(self) -> int:
        """All evaluations, with or without gradient."""
        return self.energy_evals + self.grad_evals

    def reset(self) -> None:
        """Set the counters to zero."""
        self.energy_evals = self.grad_evals = 0

    def _count(self, x: Tensor) -> int:
        return x.numel() // max(self.dim, 1)

    def energy(self, x: Tensor) -> Tensor:
        self.energy_evals += self._count(x)
        return self.target.energy(x)

    def energy_and_grad(self, x: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        self.grad_evals += self._count(x)
        return self.target.energy_and_grad(x, create_graph=create_graph)

    def log_prob_and_grad(self, x: Tensor) -> tuple[Tensor, Tensor]:
        self.grad_evals += self._count(x)
        return self.target.log_prob_and_grad(x)

    def sample(self, sample_shape: Sequence[int] | int = (), **options: object) -> Tensor:
        return self.target.sample(sample_shape, **options)

    @property
    def has_exact_sampler(self) -> bool:
        """Whether the wrapped target has an exact sampler."""
        return self.target.has_exact_sampler

    def extra_repr(self) -> str:
        return f"energy_evals={self.energy_evals}, grad_evals={self.grad_evals}"
