r""":class:`Flow`: a transform plus a base distribution, and :func:`evaluating` for safe evaluation.

The transform maps data to latent (the forward direction), so

.. math:: \log p(x \mid c) = \log p_Z(f(x; c) \mid c) + \log|\det J_f(x; c)|,

and sampling draws :math:`z \sim p_Z` then returns :math:`x = f^{-1}(z; c)`.

A :class:`Flow` is an ``nn.Module`` (it owns parameters, moves with ``.to()``, trains under DDP
through ``forward``); :meth:`Flow.distribution` (or ``flow(context)`` for a conditional flow, the
zuko idiom) returns a :class:`FlowDistribution`, a genuine :class:`torch.distributions.Distribution`
over ``x`` for given contexts, for use wherever PyTorch expects one (``Independent``,
``MixtureSameFamily``, ``kl_divergence`` through :func:`monte_carlo_kl`). See ``docs/ecosystem.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
import torch.distributions as td
from torch import Tensor, nn

from flows._validation import (
    as_sample_shape,
    check_context,
    check_context_like,
    check_count,
    check_event,
    check_finite,
    check_flow_inputs,
    check_like,
    format_shape,
    shapes_match,
)
from flows.bijections.base import Bijection, Chain, inside, is_real
from flows.bijections.standardize import Standardize
from flows.distributions import Distribution, TorchDistribution

__all__ = ["Flow", "FlowDistribution", "evaluating", "monte_carlo_kl"]


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block and restore every submodule's previous mode after.

    Evaluation in train mode silently corrupts batch-norm running statistics and scores with batch
    statistics (``docs/tabular.md``); the library's evaluation helpers all go through this.

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


def _as_size(sample_shape: Sequence[int] | int) -> torch.Size:
    return as_sample_shape(sample_shape)


def _uses_context(*modules: nn.Module) -> bool:
    """Whether any submodule declares a context (``context_features > 0``, the Bijection contract)."""
    return any(getattr(m, "context_features", None) for module in modules for m in module.modules())


def _batch_shape(batch_shape: object, who: str) -> torch.Size:
    """A batch shape of non-negative integers, or a clear error naming what came."""
    try:
        return as_sample_shape(batch_shape)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{who}: expected a batch shape of non-negative integers, got {batch_shape!r}") from None


def _no_closed_form(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"FlowDistribution: {what} is not available: a normalizing flow has no closed form for it (expected "
        "log_prob, sample, rsample or rsample_and_log_prob); estimate it from samples, e.g. "
        "x = d.sample((n,)); x.mean(0) for the mean, x.var(0) for the variance, -d.log_prob(x).mean(0) for the entropy"
    )


class Flow(nn.Module):
    r"""A normalizing flow: a :class:`~flows.bijections.base.Bijection` and a base distribution.

    Args:
        transform: maps data ``(*batch, *event_shape)`` to latent.
        base: distribution of the latent; its event shape must be the transform's output shape. A
            :class:`torch.distributions.Distribution` (for instance ``Independent(StudentT(...), 1)``)
            is accepted and wrapped in :class:`~flows.distributions.TorchDistribution`.
        context: width of the context the flow expects (0 = unconditional; ``None`` = not checked).
        check_finite: raise on NaN/Inf inputs to :meth:`log_prob` and NaN/Inf contexts (one
            reduction per call and tensor).
        standardize: data ``(N, *event_shape)`` to fit a :class:`~flows.bijections.Standardize`
            layer on, or a fitted layer; it becomes the first (data-side) layer of the transform,
            so :math:`\log p(x) = \log p_{\text{rest}}((x-\mu)/\sigma) - \sum_i \log\sigma_i`: densities
            stay in data units and the statistics are saved with the model (buffers).

    Raises:
        ValueError: if the base's event shape differs from the transform's output shape, or a
            ``context`` is declared that no layer of the transform or base reads (no submodule
            with ``context_features > 0``).
        TypeError: for a base whose support is not the real space (a discrete or simplex
            distribution; see :class:`~flows.distributions.TorchDistribution`).

    Calling a flow (``forward``):

    * ``flow(x)`` / ``flow(x, context)``: :meth:`log_prob` (what trainers and DDP call);
    * ``flow()`` (unconditional) or ``flow(context)`` (conditional: one tensor is the context,
      as in zuko): :meth:`distribution`, a :class:`FlowDistribution`.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> flow = Flow(Affine(2), StandardNormal(2))
        >>> x, log_p = flow.sample_and_log_prob((5,))
        >>> torch.allclose(log_p, flow.log_prob(x))
        True
        >>> flow().log_prob(x).shape  # a torch.distributions.Distribution
        torch.Size([5])
    """

    #: Whether maximizing ``log_prob`` on data is the right way to train this model (``flows fit``
    #: trains by maximum likelihood and refuses models that set this to ``False``).
    likelihood_trainable: bool = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Flow:
        # Record the constructor's actual arguments (before __init__ can change anything) so that
        # flows.save_model writes the config of the model that exists, not one a caller remembers.
        self = super().__new__(cls)
        object.__setattr__(self, "_arguments", (args, dict(kwargs)))
        return self

    def __init__(
        self,
        transform: Bijection,
        base: Distribution | td.Distribution,
        *,
        context: int | None = None,
        check_finite: bool = True,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        super().__init__()
        if isinstance(base, td.Distribution):
            base = TorchDistribution(base)
        if not isinstance(transform, Bijection):
            raise TypeError(f"Flow: expected a Bijection as transform, got {type(transform).__name__}")
        if not isinstance(base, Distribution):
            raise TypeError(
                f"Flow: expected a flows or torch.distributions Distribution as base, got {type(base).__name__}"
            )
        if not shapes_match(transform.event_shape_out, base.event_shape):
            raise ValueError(
                f"Flow: expected a base distribution of the transform's output event shape: the transform outputs "
                f"events of shape {format_shape(transform.event_shape_out)} but the base distribution has event "
                f"shape {format_shape(base.event_shape)}"
            )
        if context is not None:
            check_count("Flow", "context", context, minimum=0)
        if context and not _uses_context(transform, base):
            raise ValueError(
                f"Flow: expected a transform or base with a conditional layer (context_features > 0) for "
                f"context={context}, got {type(transform).__name__} and {type(base).__name__}, which never read "
                "a context; build the layers with context=... or leave the flow's context out"
            )
        self.transform = transform
        self.base = base
        self.context_features = context
        self.check_finite = check_finite
        #: Layers put in front of the builder's transform (data side first), each as
        #: ``{"layer": name, "options": {...}}`` so that a model file can rebuild them.
        self.preprocessing: list[dict[str, Any]] = []
        # Carries the flow's dtype and device for input checks; holds no information.
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)
        if standardize is not None:
            self.prepend(self._standardize_layer(standardize))
            _, kwargs = self._arguments
            if "standardize" in kwargs:  # keep no reference to the data; the statistics are buffers
                kwargs["standardize"] = None

    def _standardize_layer(self, standardize: Tensor | Standardize) -> Standardize:
        name = type(self).__name__
        if isinstance(standardize, Standardize):
            layer = standardize
        elif isinstance(standardize, Tensor):
            layer = Standardize.fit(standardize)
        else:
            raise TypeError(
                f"{name}: expected standardize to be data (N, *event_shape) or a Standardize layer, "
                f"got {type(standardize).__name__}"
            )
        if not shapes_match(tuple(layer.event_shape), self.transform.event_shape):
            raise ValueError(
                f"{name}: expected standardize data or layer with event shape "
                f"{format_shape(self.transform.event_shape)}, got {format_shape(layer.event_shape)}"
            )
        return layer.to(self._anchor.dtype)

    def prepend(self, *layers: Bijection, options: Sequence[dict[str, Any]] | None = None) -> Flow:
        """Put ``layers`` in front of the transform (data side), keeping this model's class and methods.

        The transform becomes ``Chain(*layers, *earlier_preprocessing, core)``, where ``core`` is the
        builder's own transform (see :attr:`core`). Each layer is recorded in :attr:`preprocessing`
        as ``{"layer": class name, "options": options}`` so that :func:`flows.load_model` rebuilds it
        as ``Layer(event_shape, **options)`` (buffers such as a standardisation's statistics come
        back from the weights).

        Args:
            *layers: transforms from the data side; the last one's output must fit the current transform.
            options: per layer, the keyword options that rebuild it (default ``{}`` each).

        Returns:
            this flow.
        """
        if not layers:
            return self
        options = [{} for _ in layers] if options is None else [dict(o) for o in options]
        if len(options) != len(layers):
            raise ValueError(f"Flow.prepend: expected one options dict per layer ({len(layers)}), got {len(options)}")
        existing = list(self.transform) if self.preprocessing else [self.transform]
        self.transform = Chain(*layers, *existing)
        records = [{"layer": type(t).__name__, "options": o} for t, o in zip(layers, options, strict=True)]
        self.preprocessing = records + self.preprocessing
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point dtype the flow works in (follows ``.double()``, ``.to(...)``)."""
        return self._anchor.dtype

    @property
    def device(self) -> torch.device:
        """The device the flow's parameters and buffers are on."""
        return self._anchor.device

    @property
    def core(self) -> Bijection:
        """The builder's own transform, without the :attr:`preprocessing` layers in front of it."""
        return self.transform[-1] if self.preprocessing else self.transform

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
        check_flow_inputs(self, x, context)  # the one input check, shared with the training objectives
        support = self.support
        if is_real(support):
            z, ladj = self.transform.forward_and_log_det(x, context)
            return self.base.log_prob(z, context) + ladj
        return self._bounded_log_prob(x, context, support)

    @property
    def support(self) -> td.constraints.Constraint:
        """Where the density lives: the domain of the transform's data-side layer (the real space unless bounded).

        A :class:`~flows.Logit` layer, Glow's logit preprocessing or a :class:`~flows.TorchTransform`
        of a bounded transform in front (``SigmoidTransform().inv``: the unit interval) bound it;
        :meth:`log_prob` is ``-inf`` outside. ``support.check(x)`` has shape ``batch``.
        """
        return self.transform.domain

    def _bounded_log_prob(self, x: Tensor, context: Tensor | None, support: td.constraints.Constraint) -> Tensor:
        """``log_prob`` with ``-inf`` outside ``support``; the layers see an inner point there (no error, no NaN).

        No branch on the data: the mask is applied with ``torch.where``, so gradients stay finite (zero
        outside) and batched transforms (``torch.func.vmap``) see the same program for every row.
        """
        try:
            inner = td.transform_to(support)(torch.zeros(self.event_shape, dtype=x.dtype, device=x.device))
        except NotImplementedError:  # no point known inside: the layers check their own inputs
            z, ladj = self.transform.forward_and_log_det(x, context)
            return self.base.log_prob(z, context) + ladj
        n = len(self.event_shape)
        keep = inside(support, x, n) | torch.isnan(x).flatten(x.dim() - n).any(-1)  # NaN stays NaN (check_finite=False)
        safe = torch.where(keep.reshape(*keep.shape, *(1,) * n), x, inner)
        z, ladj = self.transform.forward_and_log_det(safe, context)
        return torch.where(keep, self.base.log_prob(z, context) + ladj, -torch.inf)

    def _latent_context(self, sample_shape: torch.Size, context: Tensor | None) -> Tensor | None:
        if context is None:
            return None
        return context.expand(*sample_shape, *context.shape)

    def rsample(self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None) -> Tensor:
        """Differentiable samples of shape ``(*sample_shape, *context_batch, *event_shape)``."""
        self._check_context(context)
        shape = _as_size(sample_shape)
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
        shape = _as_size(sample_shape)
        z, log_pz = self.base.rsample_and_log_prob(shape, context)
        x, ladj = self.transform.inverse_and_log_det(z, self._latent_context(shape, context))
        return x, log_pz - ladj

    def distribution(self, context: Tensor | None = None) -> FlowDistribution:
        """This flow as a :class:`torch.distributions.Distribution` over ``x`` given ``context``.

        Args:
            context: ``(*batch, context_features)`` for a conditional flow (the distribution's
                ``batch_shape`` is ``batch``), ``None`` for an unconditional one (``batch_shape = ()``).

        Returns:
            a :class:`FlowDistribution` sharing this flow's parameters (gradients reach them).
        """
        return FlowDistribution(self, context)

    def forward(self, x: Tensor | None = None, context: Tensor | None = None) -> Tensor | FlowDistribution:
        """``flow(x[, context])`` is :meth:`log_prob`; ``flow()`` or ``flow(context)`` is :meth:`distribution`.

        A conditional flow (``context_features > 0``) called with a single tensor takes it as the
        context (the zuko idiom ``flow(c).sample()``): ``log_prob`` of a conditional flow always
        needs a context, so the call is unambiguous. Trainers and DDP call ``flow(x, context)``.
        """
        if x is None:
            return self.distribution(context)
        if context is None and self.context_features:
            return self.distribution(x)
        return self.log_prob(x, context)


class FlowDistribution(td.Distribution):
    r"""A :class:`Flow` at given contexts, as a :class:`torch.distributions.Distribution` over ``x``.

    ``batch_shape`` is the context's batch shape (``()`` for an unconditional flow) and
    ``event_shape`` the flow's. :meth:`log_prob` broadcasts ``x`` of shape
    ``(*sample, *batch', *event)`` against ``batch_shape`` (so ``MixtureSameFamily`` and
    ``Independent`` work); :meth:`rsample` returns ``(*sample_shape, *batch_shape, *event_shape)``
    and is differentiable with respect to the flow's parameters. :meth:`expand` broadcasts the
    context (or, unconditionally, just the batch shape). Means, variances and entropies have no
    closed form and raise :class:`NotImplementedError`; ``torch.distributions.kl_divergence``
    raises with a pointer to :func:`monte_carlo_kl`.

    Why a separate object rather than making :class:`Flow` a ``Distribution``: a ``Distribution``
    is a value for fixed parameters and a fixed batch of contexts, while a ``Flow`` is a module
    that owns parameters, moves between devices and is called by trainers and DDP. The module
    hands out distribution objects, as zuko's ``LazyDistribution`` does.

    Args:
        flow: the flow.
        context: ``(*batch, context_features)`` or ``None``.

    Example:
        >>> import torch
        >>> from flows import MAF
        >>> flow = MAF(2, context=3, transforms=1, hidden=(8,))
        >>> d = flow(torch.randn(4, 3))  # the zuko idiom
        >>> d.batch_shape, d.event_shape, d.sample((5,)).shape
        (torch.Size([4]), torch.Size([2]), torch.Size([5, 4, 2]))
        >>> mix = torch.distributions.MixtureSameFamily(torch.distributions.Categorical(torch.ones(4)), d)
        >>> mix.log_prob(torch.randn(6, 2)).shape
        torch.Size([6])
    """

    arg_constraints: ClassVar[dict] = {}
    has_rsample = True

    def __init__(self, flow: Flow, context: Tensor | None = None, *, batch_shape: Sequence[int] | None = None) -> None:
        if not isinstance(flow, Flow):
            raise TypeError(f"FlowDistribution: expected a Flow, got {type(flow).__name__}")
        flow._check_context(context)
        event = tuple(flow.event_shape)
        if any(s is None for s in event):
            raise ValueError(f"FlowDistribution: expected a flow with a fixed event shape, got {format_shape(event)}")
        if batch_shape is not None:
            batch_shape = _batch_shape(batch_shape, "FlowDistribution")
        if context is not None:
            default = context.shape[:-1]
            if batch_shape is not None and batch_shape != default:
                if torch.broadcast_shapes(batch_shape, default) != batch_shape:
                    raise ValueError(
                        f"FlowDistribution: expected a batch shape that the context's batch {tuple(default)} "
                        f"broadcasts to, got {tuple(batch_shape)}"
                    )
                context = context.expand(*batch_shape, context.shape[-1])
            batch = context.shape[:-1]
        else:
            batch = torch.Size(() if batch_shape is None else batch_shape)
        self.flow, self.context = flow, context
        super().__init__(batch, torch.Size(event), validate_args=False)

    @property
    def support(self) -> td.constraints.Constraint:
        """The flow's :attr:`Flow.support` (the data-side layer's domain); ``log_prob`` is ``-inf`` outside it."""
        return self.flow.support

    @property
    def mean(self) -> Tensor:
        raise _no_closed_form("the mean")

    @property
    def mode(self) -> Tensor:
        raise _no_closed_form("the mode")

    @property
    def variance(self) -> Tensor:
        raise _no_closed_form("the variance")

    @property
    def stddev(self) -> Tensor:
        raise _no_closed_form("the standard deviation")

    def entropy(self) -> Tensor:
        raise _no_closed_form("the entropy")

    def perplexity(self) -> Tensor:
        raise _no_closed_form("the perplexity")

    def cdf(self, value: Tensor) -> Tensor:
        raise _no_closed_form("the CDF")

    def icdf(self, value: Tensor) -> Tensor:
        raise _no_closed_form("the inverse CDF")

    def enumerate_support(self, expand: bool = True) -> Tensor:
        raise NotImplementedError(
            "FlowDistribution: expected a discrete distribution for enumerate_support, got a continuous flow"
        )

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> FlowDistribution:
        batch = _batch_shape(batch_shape, "FlowDistribution.expand")
        try:
            fits = torch.broadcast_shapes(batch, self.batch_shape) == batch
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"FlowDistribution.expand: expected a batch shape that {tuple(self.batch_shape)} broadcasts to, "
                f"got {tuple(batch)}"
            )
        if self.context is None:
            return FlowDistribution(self.flow, None, batch_shape=batch)
        return FlowDistribution(self.flow, self.context.expand(*batch, self.context.shape[-1]))

    def rsample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        shape = _as_size(sample_shape)
        if self.context is None:
            return self.flow.rsample(shape + self.batch_shape)
        return self.flow.rsample(shape, self.context)

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample_and_log_prob(self, sample_shape: Sequence[int] | int = ()) -> tuple[Tensor, Tensor]:
        """Samples and their log-density in one pass (the flow's fused inverse)."""
        shape = _as_size(sample_shape)
        if self.context is None:
            return self.flow.sample_and_log_prob(shape + self.batch_shape)
        return self.flow.sample_and_log_prob(shape, self.context)

    def log_prob(self, value: Tensor) -> Tensor:
        n = len(self.event_shape)
        check_event(value, self.event_shape, "FlowDistribution", "value")
        batch = torch.broadcast_shapes(value.shape[: value.dim() - n], self.batch_shape)
        value = value.expand(*batch, *self.event_shape)
        context = None if self.context is None else self.context.expand(*batch, self.context.shape[-1])
        return self.flow.log_prob(value, context)

    def __repr__(self) -> str:
        return (
            f"FlowDistribution({type(self.flow).__name__}, batch_shape={tuple(self.batch_shape)}, "
            f"event_shape={tuple(self.event_shape)})"
        )


def monte_carlo_kl(p: td.Distribution, q: td.Distribution, samples: int = 1000) -> Tensor:
    r"""Monte-Carlo estimate of :math:`\mathrm{KL}(p \,\|\, q) = E_p[\log p(x) - \log q(x)]`, shape ``batch``.

    Uses ``samples`` reparameterised draws from ``p`` when it has ``rsample`` (so the estimate is
    differentiable, e.g. for variational inference), plain draws otherwise. Unbiased; its standard
    error is ``std / sqrt(samples)`` of the per-draw differences.

    Args:
        p: distribution to draw from (e.g. ``flow(context)``).
        q: any distribution with ``log_prob`` on ``p``'s samples.
        samples: number of draws.

    Example:
        >>> import torch
        >>> from torch.distributions import Independent, Normal
        >>> from flows import Affine, Flow, StandardNormal
        >>> p = Flow(Affine(2), StandardNormal(2))()
        >>> q = Independent(Normal(torch.ones(2), 1.0), 1)
        >>> abs(monte_carlo_kl(p, q, 20000).item() - 1.0) < 0.05  # exact: |mu|^2 / 2 = 1
        True
    """
    check_count("monte_carlo_kl", "samples", samples)
    if isinstance(p, FlowDistribution):
        x, log_p = p.rsample_and_log_prob((samples,))
    else:
        x = p.rsample((samples,)) if p.has_rsample else p.sample((samples,))
        log_p = p.log_prob(x)
    return (log_p - q.log_prob(x)).mean(0)


def _no_closed_form_kl(p: td.Distribution, q: td.Distribution) -> Tensor:
    raise NotImplementedError(
        f"kl_divergence: expected a pair with a closed-form KL, got {type(p).__name__} and {type(q).__name__}; "
        "a flow's KL has none: estimate it with flows.monte_carlo_kl(p, q, samples)"
    )


for _pair in ((FlowDistribution, td.Distribution), (td.Distribution, FlowDistribution), (FlowDistribution,) * 2):
    td.register_kl(*_pair)(_no_closed_form_kl)
