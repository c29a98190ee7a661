r"""Base distributions as modules.

Parameters and constants live in buffers/parameters, so ``.to(device)``, ``.double()`` and ``state_dict()`` just work.

Every distribution has an ``event_shape`` and the methods ``log_prob(x, context=None)`` (shape
``batch``), ``rsample(sample_shape, context=None)``, ``sample`` (no gradient) and
``rsample_and_log_prob``. With a context of shape ``(*c, context_features)`` the samples have shape
``(*sample_shape, *c, *event_shape)``.

:class:`TorchDistribution` makes any :class:`torch.distributions.Distribution` (a Student-t, a
Laplace, a full-covariance Gaussian, ...) such a module, so it can be a flow's base.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributions as td
from torch import Tensor, nn

from flows._validation import as_shape, check_event

__all__ = ["DiagNormal", "Distribution", "StandardNormal", "TorchDistribution"]


class Distribution(nn.Module):
    """Base class of the library's distributions (base distributions of flows).

    Subclasses implement :meth:`log_prob` and :meth:`rsample`; :meth:`sample` and
    :meth:`rsample_and_log_prob` are derived (override the latter when it can be fused).

    Args:
        event_shape: shape of one event.
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__()
        self.event_shape = torch.Size(as_shape(event_shape, "event_shape", allow_none=False))

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log-density of ``x`` (``(*batch, *event_shape)``), of shape ``batch``."""
        raise NotImplementedError

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Reparameterised sample of shape ``(*sample_shape, *context_batch, *event_shape)``."""
        raise NotImplementedError

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Sample without gradient tracking."""
        return self.rsample(sample_shape, context)

    def rsample_and_log_prob(
        self, sample_shape: Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """A reparameterised sample and its log-density."""
        x = self.rsample(sample_shape, context)
        return x, self.log_prob(x, context)

    def _sample_shape(self, sample_shape: Sequence[int] | int, context: Tensor | None) -> torch.Size:
        if isinstance(sample_shape, int):
            sample_shape = (sample_shape,)
        shape = torch.Size(sample_shape)
        if context is not None:
            shape = shape + context.shape[:-1]
        return shape + self.event_shape

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}"


class StandardNormal(Distribution):
    r"""Standard normal :math:`\mathcal N(0, I)` over events of any shape.

    :math:`\log p(x) = -\tfrac12 \|x\|^2 - \tfrac{n}{2}\log 2\pi`, ``n`` = number of event entries.

    Args:
        event_shape: shape of one event.

    Example:
        >>> import torch
        >>> d = StandardNormal((2, 3))
        >>> d.sample((4,)).shape, round(d.log_prob(torch.zeros(2, 3)).item(), 4)
        (torch.Size([4, 2, 3]), -5.5136)
    """

    def __init__(self, event_shape: int | Sequence[int]) -> None:
        super().__init__(event_shape)
        # Carries dtype and device for sampling; not saved (it holds no information).
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)
        self._log_norm = 0.5 * self.event_shape.numel() * math.log(2 * math.pi)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        return -0.5 * x.square().sum(dims) - self._log_norm

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        a = self._anchor
        return torch.randn(self._sample_shape(sample_shape, context), dtype=a.dtype, device=a.device)


class DiagNormal(Distribution):
    r"""Diagonal Gaussian :math:`\mathcal N(\mu, \operatorname{diag}\sigma^2)` with learnable (or fixed) parameters.

    :math:`\log p(x) = \sum_i [-\tfrac12 ((x_i-\mu_i)/\sigma_i)^2 - \log\sigma_i - \tfrac12\log 2\pi]`.

    Args:
        event_shape: shape of one event.
        loc: initial mean (broadcast to ``event_shape``).
        scale: initial standard deviation (positive).
        trainable: learn ``loc`` and ``log_scale`` (otherwise they are buffers).

    Example:
        >>> import torch
        >>> d = DiagNormal(2, loc=1.0, scale=2.0)
        >>> round(d.log_prob(torch.ones(2)).item(), 4) == round(-2 * math.log(2) - math.log(2 * math.pi), 4)
        True
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        *,
        loc: float | Tensor = 0.0,
        scale: float | Tensor = 1.0,
        trainable: bool = True,
    ) -> None:
        super().__init__(event_shape)
        scale = torch.as_tensor(scale, dtype=torch.get_default_dtype())
        if not bool((scale > 0).all()):
            raise ValueError(f"DiagNormal: expected a positive scale, got {scale}")
        loc = torch.as_tensor(loc, dtype=torch.get_default_dtype()).expand(self.event_shape).clone()
        log_scale = scale.log().expand(self.event_shape).clone()
        if trainable:
            self.loc, self.log_scale = nn.Parameter(loc), nn.Parameter(log_scale)
        else:
            self.register_buffer("loc", loc)
            self.register_buffer("log_scale", log_scale)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        u = (x - self.loc) * torch.exp(-self.log_scale)
        return (-0.5 * u.square() - self.log_scale).sum(dims) - 0.5 * self.event_shape.numel() * math.log(2 * math.pi)

    def rsample(self, sample_shape: Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        eps = torch.randn(self._sample_shape(sample_shape, context), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.log_scale.exp()


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
