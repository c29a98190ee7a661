r""":class:`Flow`: a transform plus a base distribution, and :func:`evaluating` for safe evaluation.

The transform maps data to latent (the forward direction), so

.. math:: \log p(x \mid c) = \log p_Z(f(x; c) \mid c) + \log|\det J_f(x; c)|,

and sampling draws :math:`z \sim p_Z` then returns :math:`x = f^{-1}(z; c)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from flows._validation import (
    check_context,
    check_context_like,
    check_event,
    check_finite,
    check_like,
    format_shape,
    shapes_match,
)
from flows.bijections.base import Bijection
from flows.distributions import Distribution

__all__ = ["Flow", "evaluating"]


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block and restore every submodule's previous mode after.

    Evaluation in train mode silently corrupts batch-norm running statistics and scores with batch
    statistics (METHODS.md §7); the library's evaluation helpers all go through this.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
        >>> with evaluating(net):
        ...     net.training
        False
        >>> net.training
        True
    """
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, mode in modes:
            m.training = mode


class Flow(nn.Module):
    r"""A normalizing flow: a :class:`~flows.bijections.base.Bijection` and a base distribution.

    Args:
        transform: maps data ``(*batch, *event_shape)`` to latent.
        base: distribution of the latent; its event shape must be the transform's output shape.
        context: width of the context the flow expects (0 = unconditional; ``None`` = not checked).
        check_finite: raise on NaN/Inf inputs to :meth:`log_prob` and NaN/Inf contexts (one
            reduction per call and tensor).

    Raises:
        ValueError: if the base's event shape differs from the transform's output shape.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> flow = Flow(Affine(2), StandardNormal(2))
        >>> x, log_p = flow.sample_and_log_prob((5,))
        >>> torch.allclose(log_p, flow.log_prob(x))
        True
    """

    #: Whether maximizing ``log_prob`` on data is the right way to train this model (``flows fit``
    #: trains by maximum likelihood and refuses models that set this to ``False``).
    likelihood_trainable: bool = True

    def __init__(
        self,
        transform: Bijection,
        base: Distribution,
        *,
        context: int | None = None,
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(transform, Bijection):
            raise TypeError(f"Flow: expected a Bijection as transform, got {type(transform).__name__}")
        if not shapes_match(transform.event_shape_out, base.event_shape):
            raise ValueError(
                f"Flow: the transform outputs events of shape {format_shape(transform.event_shape_out)} "
                f"but the base distribution has event shape {format_shape(base.event_shape)}"
            )
        self.transform = transform
        self.base = base
        self.context_features = context
        self.check_finite = check_finite
        # Carries the flow's dtype and device for input checks; holds no information.
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    @property
    def event_shape(self) -> tuple[int | None, ...]:
        """Shape of one data event."""
        return self.transform.event_shape

    def _check_context(self, context: Tensor | None, x: Tensor | None = None) -> None:
        name = type(self).__name__
        if self.context_features is not None:
            check_context(context, self.context_features, name)
        if context is not None:
            check_like(context, self._anchor, name, "context")
            if x is not None and self.context_features:  # its batch must broadcast to the data's (issue 17)
                check_context_like(context, x, len(self.transform.event_shape), name, self.context_features)
            if self.check_finite:
                check_finite(context, name, "context")

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log-density of data ``x`` (``(*batch, *event_shape)``), of shape ``batch``.

        Raises:
            ValueError: for a wrong event shape or (with ``check_finite``) NaN/Inf values.
            TypeError: for a dtype or device different from the flow's.
        """
        name = type(self).__name__
        check_event(x, self.transform.event_shape, name)
        check_like(x, self._anchor, name)
        if self.check_finite:
            check_finite(x, name)
        self._check_context(context, x)
        z, ladj = self.transform.forward_and_log_det(x, context)
        return self.base.log_prob(z, context) + ladj

    def _latent_context(self, sample_shape: torch.Size, context: Tensor | None) -> Tensor | None:
        if context is None:
            return None
        return context.expand(*sample_shape, *context.shape)

    def rsample(self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None) -> Tensor:
        """Differentiable samples of shape ``(*sample_shape, *context_batch, *event_shape)``."""
        self._check_context(context)
        shape = torch.Size((sample_shape,) if isinstance(sample_shape, int) else sample_shape)
        z = self.base.rsample(shape, context)
        return self.transform.inverse(z, self._latent_context(shape, context))

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None) -> Tensor:
        """Samples without gradient tracking (see :meth:`rsample`)."""
        return self.rsample(sample_shape, context)

    def sample_and_log_prob(
        self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""Differentiable samples and their log-density in one pass (no forward pass needed).

        :math:`\log p(x) = \log p_Z(z) - \log|\det J_{f^{-1}}(z)|`; agrees with :meth:`log_prob`
        on the returned samples.
        """
        self._check_context(context)
        shape = torch.Size((sample_shape,) if isinstance(sample_shape, int) else sample_shape)
        z, log_pz = self.base.rsample_and_log_prob(shape, context)
        x, ladj = self.transform.inverse_and_log_det(z, self._latent_context(shape, context))
        return x, log_pz - ladj

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Same as :meth:`log_prob`."""
        return self.log_prob(x, context)
