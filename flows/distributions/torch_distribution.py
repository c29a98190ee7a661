"""Any :class:`torch.distributions.Distribution` as a base: :class:`TorchDistribution`."""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributions as td
from torch import Tensor

from flows._validation import check_event
from flows.distributions.base import Distribution

__all__ = ["TorchDistribution"]


def _tensor_arguments(d: td.Distribution) -> dict[str, Tensor]:
    """The constructor arguments of ``d`` that were given (``arg_constraints`` names set on the instance)."""
    found = {k: v for k, v in vars(d).items() if k in d.arg_constraints and isinstance(v, Tensor)}
    if isinstance(d, td.MultivariateNormal):  # exactly one matrix parameterisation may be given
        found = {"loc": d.loc, "scale_tril": d.scale_tril}
    return found


class TorchDistribution(Distribution):
    r"""A :class:`torch.distributions.Distribution` as a base-distribution module.

    The distribution's tensor arguments (``loc``, ``scale``, ``df``, ...) become buffers, so they
    move with ``.to()``/``.double()`` and are saved in ``state_dict()``; the distribution object is
    rebuilt from the buffers on each call (cheap: no computation happens at construction). All of
    the distribution's batch dimensions are taken as event dimensions (a base has no batch), as
    ``Independent(d, len(d.batch_shape))`` would. ``context`` is accepted and only sets the batch
    shape of samples. Parameters are fixed: wrap a learnable location/scale in an
    :class:`~flows.bijections.Affine` layer instead.

    Args:
        distribution: e.g. ``StudentT(df, loc, scale)`` or ``Independent(Laplace(loc, scale), 1)``,
            whose arguments are tensors of the event shape.

    Raises:
        TypeError: for something that is not a ``torch.distributions.Distribution``.
        ValueError: for a distribution that cannot be rebuilt from its tensor arguments.

    Example:
        >>> import torch
        >>> from torch.distributions import StudentT
        >>> d = TorchDistribution(StudentT(torch.full((3,), 4.0), torch.zeros(3), torch.ones(3)))
        >>> d.event_shape, d.sample((5,)).shape, d.log_prob(torch.zeros(2, 3)).shape
        (torch.Size([3]), torch.Size([5, 3]), torch.Size([2]))
    """

    def __init__(self, distribution: td.Distribution) -> None:
        if not isinstance(distribution, td.Distribution):
            raise TypeError(
                f"TorchDistribution: expected a torch.distributions.Distribution, got {type(distribution).__name__}"
            )
        inner = distribution
        while isinstance(inner, td.Independent):
            inner = inner.base_dist
        super().__init__(tuple(inner.batch_shape) + tuple(inner.event_shape))
        self.family = type(inner)
        arguments = _tensor_arguments(inner)
        self._names = sorted(arguments)
        for name in self._names:
            self.register_buffer(name, arguments[name].detach().clone())
        try:
            rebuilt = self.distribution()
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"TorchDistribution: expected a distribution that can be rebuilt from its tensor arguments "
                f"{self._names}, got {type(inner).__name__}: {error}"
            ) from error
        self._reinterpreted = len(rebuilt.batch_shape)

    def distribution(self) -> td.Distribution:
        """The wrapped distribution, rebuilt from the current buffers (all dimensions as event dimensions)."""
        d = self.family(**{k: getattr(self, k) for k in self._names}, validate_args=False)
        return td.Independent(d, len(d.batch_shape)) if len(d.batch_shape) else d

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        return self.distribution().log_prob(x)

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        shape = self._sample_shape(sample_shape, context)
        batch = shape[: len(shape) - len(self.event_shape)]
        d = self.distribution()
        return d.rsample(batch) if d.has_rsample else d.sample(batch)

    def extra_repr(self) -> str:
        return f"{self.family.__name__}, event_shape={tuple(self.event_shape)}"
