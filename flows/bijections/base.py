"""The bijection contract: :class:`Bijection`, :class:`Inverse`, :class:`Chain` and :class:`InverseNotAvailable`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.distributions import constraints

from flows._validation import (
    as_shape,
    check_context,
    check_context_like,
    check_event,
    check_finite,
    format_shape,
    shapes_match,
)

__all__ = ["Bijection", "Chain", "Inverse", "InverseNotAvailable", "inside", "is_real", "over_event", "sum_event_dims"]


def sum_event_dims(t: Tensor, event_ndim: int, batch_shape: torch.Size) -> Tensor:
    """Sum an elementwise log-determinant over the last ``event_ndim`` dims and expand to ``batch_shape``.

    ``t`` must hold the full event shape in its trailing dimensions; it may lack (some of) the
    batch dimensions (e.g. a parameter of event shape), in which case the summed result is
    expanded (a view) to ``batch_shape``.
    """
    if event_ndim:
        t = t.sum(dim=tuple(range(-event_ndim, 0)))
    return t.expand(batch_shape)


def over_event(constraint: constraints.Constraint, event_ndim: int) -> constraints.Constraint:
    """``constraint`` reinterpreted over ``event_ndim`` event dimensions (``check`` then returns the batch shape)."""
    extra = event_ndim - constraint.event_dim
    return constraints.independent(constraint, extra) if extra > 0 else constraint


def is_real(constraint: constraints.Constraint) -> bool:
    """Whether ``constraint`` is the whole real space (``real``, ``real_vector``, ``independent(real, k)``)."""
    while isinstance(constraint, constraints.independent):
        constraint = constraint.base_constraint
    return constraint is constraints.real


def inside(constraint: constraints.Constraint, x: Tensor, event_ndim: int) -> Tensor:
    """``constraint.check(x)`` reduced to the batch shape (works for empty batches, unlike torch's ``independent``)."""
    while isinstance(constraint, constraints.independent):
        constraint = constraint.base_constraint
    ok = constraint.check(x)
    extra = ok.dim() - (x.dim() - event_ndim)
    return ok.flatten(ok.dim() - extra).all(-1) if extra > 0 else ok


_Fused = Callable[..., tuple[Tensor, Tensor]]


def _first_parameter(module: nn.Module) -> Tensor | None:
    """``next(module.parameters(), None)`` (the same pre-order) without building the generators: it runs every call."""
    for p in module._parameters.values():
        if p is not None:
            return p
    for child in module._modules.values():
        if child is not None and (p := _first_parameter(child)) is not None:
            return p
    return None


def _validated(method: _Fused, inverse: bool) -> _Fused:
    """``method`` (a fused ``*_and_log_det``) preceded by :meth:`Bijection.check_call`."""

    @functools.wraps(method)
    def checked(self: Bijection, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.check_call(x, context, inverse=inverse)
        return method(self, x, context)

    checked._validated = True  # type: ignore[attr-defined]
    return checked


class InverseNotAvailable(NotImplementedError):
    """Raised by a transform that has no closed-form inverse in its current configuration.

    The message names the class and the reason (for example, a batch-norm layer in train mode).
    """


class Bijection(nn.Module):
    r"""Base class of every transform: an invertible map with its log-absolute-determinant.

    Direction convention (the whole library follows it): the **forward** direction maps data
    :math:`x` to latent :math:`z = f(x)`; sampling runs the inverse. A flow's density is

    .. math:: \log p(x) = \log p_Z(f(x)) + \log |\det J_f(x)|.

    Shape contract:

    * inputs are ``(*batch, *event_shape)`` with any number (including zero) of leading batch
      dimensions; outputs of the forward direction are ``(*batch, *event_shape_out)``;
    * the log-absolute-determinant of the Jacobian (``ladj``) has shape ``batch``: it is already
      summed over the event dimensions (image transforms include the ``H·W`` factor);
    * every method takes ``context=None`` (a tensor ``(*batch, context_features)`` for conditional
      transforms, ignored by unconditional ones).

    The contract is enforced: every subclass's :meth:`forward_and_log_det` and
    :meth:`inverse_and_log_det` first run :meth:`check_call`, so a wrong event shape, an integer
    or complex input, or a context that does not fit (missing, wrong width, dtype or batch, or
    NaN/Inf for a conditional transform) is a clear error instead of a wrong result. A NaN or
    infinite *input* is not checked here (one reduction per layer): it gives NaN or infinite
    outputs; :class:`~flows.Flow` checks its inputs once (``check_finite``).

    Subclasses implement :meth:`forward_and_log_det` and, when a closed-form inverse exists,
    :meth:`inverse_and_log_det`. :meth:`forward`, :meth:`inverse` and :attr:`inv` are derived.

    Args:
        event_shape: shape of one event on the data side (an ``int`` means a vector). ``None``
            entries mean "any size" (e.g. ``(C, None, None)`` for a convolutional layer).
        event_shape_out: shape of one event on the latent side; defaults to ``event_shape``.

    Example:
        >>> import torch
        >>> from flows import Affine
        >>> t = Affine(3)
        >>> x = torch.randn(5, 3)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> z.shape, ladj.shape
        (torch.Size([5, 3]), torch.Size([5]))
        >>> torch.allclose(t.inverse(z), x)
        True
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        event_shape_out: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.event_shape = as_shape(event_shape, "event_shape")
        self.event_shape_out = (
            self.event_shape if event_shape_out is None else as_shape(event_shape_out, "event_shape_out")
        )

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for name, inverse in (("forward_and_log_det", False), ("inverse_and_log_det", True)):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_validated", False):
                setattr(cls, name, _validated(method, inverse))

    def check_call(self, x: Tensor, context: Tensor | None, *, inverse: bool = False) -> None:
        """Raise unless ``x`` (and ``context``) fit this transform; run before every fused call.

        Checks that ``x`` is a real floating-point tensor ``(*batch, *event_shape)`` (the latent
        event shape when ``inverse``) of the dtype of the module's parameters (outside autocast);
        for a conditional transform (``context_features > 0``) that the context is present,
        ``(*batch, context_features)`` (or a map ``(*batch, context_features, H, W)`` for images)
        and finite; and for any context given that it has the dtype and device of ``x`` and a
        batch shape that broadcasts to ``x``'s.

        Raises:
            TypeError: for a non-tensor, an integer/bool/complex input or context, or a context of
                another dtype or device than the input.
            ValueError: for a wrong event shape, a missing or unexpected-width context, a context
                batch that does not broadcast to the input's, or a NaN/Inf context.
        """
        who = type(self).__name__
        event = self.event_shape_out if inverse else self.event_shape
        what = "latent input" if inverse else "input"
        check_event(x, event, who, what)
        if not x.is_floating_point():
            raise TypeError(f"{who}: expected a real floating-point {what}, got dtype {x.dtype}")
        reference = _first_parameter(self)
        if reference is not None and reference.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"{who}: expected {what} of dtype {reference.dtype} (the module's), got {x.dtype}; "
                "convert the data or the module with .to(...)"
            )
        features = getattr(self, "context_features", None)
        conditional = isinstance(features, int) and features > 0
        if conditional and context is None:
            check_context(context, features, who)  # raises: expected a context, got None
        if context is not None:
            check_context_like(context, x, len(event), who, features if conditional else None)
            if conditional:
                check_finite(context, who, "context", hint=None)

    # -- the contract -------------------------------------------------------------------------
    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Map data to latent: returns ``(z, ladj)`` with ``ladj = log|det ∂z/∂x|`` of shape ``batch``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward_and_log_det")

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Map latent to data: returns ``(x, ladj)`` with ``ladj = log|det ∂x/∂z|`` of shape ``batch``."""
        raise InverseNotAvailable(f"{type(self).__name__} has no closed-form inverse")

    # -- where it is defined ------------------------------------------------------------------
    @property
    def domain(self) -> constraints.Constraint:
        """The set of data-side events the transform is defined on, over the whole event.

        The whole real space by default; bounded layers (:class:`~flows.Logit`, a
        :class:`~flows.TorchTransform` of a bounded transform) override it. A flow's ``support``
        is the domain of its transform (a :class:`Chain`'s is its first member's). ``check(x)`` has
        shape ``batch``.
        """
        return over_event(constraints.real, len(self.event_shape))

    @property
    def codomain(self) -> constraints.Constraint:
        """The set of latent-side events the transform maps onto (the real space by default)."""
        return over_event(constraints.real, len(self.event_shape_out))

    def as_torch_transform(self, context: Tensor | None = None, *, cache_size: int = 0):
        """This transform (data to latent) as a :class:`torch.distributions.transforms.Transform`.

        See :class:`~flows.bijections.torch_transform.BijectionTransform`: ``TransformedDistribution(base,
        t.as_torch_transform().inv)`` is the flow ``Flow(t, base)``.

        Args:
            context: fixed context of a conditional transform, ``(*batch, context_features)``.
            cache_size: torch's call cache: 0 (default) or 1 (``t.inv(t(x))`` returns ``x`` itself, keyed
                on the tensor's identity, so a later call on the same tensor after a parameter update
                would return the old value; use it for sample-then-score only).
        """
        from flows.bijections.torch_transform import BijectionTransform

        return BijectionTransform(self, context, cache_size=cache_size)

    # -- derived conveniences -----------------------------------------------------------------
    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        return self.forward_and_log_det(x, context)[0]

    def inverse(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """Map latent to data and return the tensor only."""
        check_event(z, self.event_shape_out, type(self).__name__, "latent input")
        return self.inverse_and_log_det(z, context)[0]

    @property
    def inv(self) -> Bijection:
        """The inverse transform (swaps the two fused methods; no copy, shares parameters)."""
        return Inverse(self)

    def batch_shape(self, x: Tensor) -> torch.Size:
        """The batch part of ``x.shape`` for an input on the data side."""
        return x.shape[: x.dim() - len(self.event_shape)]

    def extra_repr(self) -> str:
        if self.event_shape == self.event_shape_out:
            return f"event_shape={format_shape(self.event_shape)}"
        return f"event_shape={format_shape(self.event_shape)}, event_shape_out={format_shape(self.event_shape_out)}"


class Inverse(Bijection):
    """The inverse of a transform: ``Inverse(t).forward_and_log_det`` is ``t.inverse_and_log_det``.

    Parameters are shared with ``t``; ``Inverse(t).inv`` returns ``t`` itself.

    Args:
        transform: the transform to invert.

    Example:
        >>> import torch
        >>> from flows import Affine
        >>> t = Affine(2)
        >>> x = torch.randn(4, 2)
        >>> torch.allclose(t.inv(t(x)), x)
        True
    """

    def __init__(self, transform: Bijection) -> None:
        if not isinstance(transform, Bijection):
            raise TypeError(f"Inverse: expected a Bijection, got {type(transform).__name__}")
        super().__init__(transform.event_shape_out, transform.event_shape)
        self.transform = transform

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.transform.inverse_and_log_det(x, context)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.transform.forward_and_log_det(z, context)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self.transform.inverse(x, context)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self.transform.forward(z, context)

    @property
    def inv(self) -> Bijection:
        return self.transform

    @property
    def domain(self) -> constraints.Constraint:
        return self.transform.codomain

    @property
    def codomain(self) -> constraints.Constraint:
        return self.transform.domain

    def extra_repr(self) -> str:
        return ""


class Chain(Bijection):
    r"""Composition of transforms applied **in list order** in the forward direction.

    ``Chain(t1, t2, t3)`` maps :math:`x \mapsto t_3(t_2(t_1(x)))` and sums the log-determinants;
    the inverse runs the members' inverses in reverse order. Neighbouring event shapes are checked
    at construction.

    Supports ``len``, iteration, integer indexing and slicing (a slice is a new ``Chain`` sharing
    the members).

    Args:
        *transforms: one or more transforms.

    Raises:
        ValueError: if the chain is empty or two neighbours disagree on the event shape.

    Example:
        >>> import torch
        >>> from flows import Affine, Chain, Reverse
        >>> chain = Chain(Affine(3), Reverse(3))
        >>> z, ladj = chain.forward_and_log_det(torch.randn(2, 3))
        >>> len(chain), ladj.shape
        (2, torch.Size([2]))
    """

    def __init__(self, *transforms: Bijection) -> None:
        if len(transforms) == 1 and isinstance(transforms[0], (list, tuple)):
            transforms = tuple(transforms[0])
        if not transforms:
            raise ValueError("Chain: expected at least one transform, got none")
        for i, t in enumerate(transforms):
            if not isinstance(t, Bijection):
                raise TypeError(f"Chain: member {i} must be a Bijection, got {type(t).__name__}")
        for i in range(1, len(transforms)):
            before, after = transforms[i - 1], transforms[i]
            if not shapes_match(before.event_shape_out, after.event_shape):
                raise ValueError(
                    f"Chain: member {i - 1} ({type(before).__name__}) outputs events of shape "
                    f"{format_shape(before.event_shape_out)} but member {i} ({type(after).__name__}) "
                    f"expects {format_shape(after.event_shape)}"
                )
        super().__init__(transforms[0].event_shape, transforms[-1].event_shape_out)
        self.transforms = nn.ModuleList(transforms)

    def __len__(self) -> int:
        return len(self.transforms)

    @property
    def domain(self) -> constraints.Constraint:
        """The first (data-side) member's domain; a bounded member behind it checks its own inputs."""
        return self.transforms[0].domain

    @property
    def codomain(self) -> constraints.Constraint:
        return self.transforms[-1].codomain

    def __iter__(self) -> Iterator[Bijection]:
        return iter(self.transforms)

    def __getitem__(self, index: int | slice) -> Bijection:
        if isinstance(index, slice):
            return Chain(*self.transforms[index])
        return self.transforms[index]

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(x, self.event_shape, "Chain")
        ladj = None
        for t in self.transforms:
            x, term = t.forward_and_log_det(x, context)
            ladj = term if ladj is None else ladj + term
        return x, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(z, self.event_shape_out, "Chain", "latent input")
        ladj = None
        for t in reversed(self.transforms):
            z, term = t.inverse_and_log_det(z, context)
            ladj = term if ladj is None else ladj + term
        return z, ladj

    # Tensor-only passes go through the members' tensor-only methods, so a member that can skip
    # its log-determinant when it is not wanted (a CNF's trace integral) does. A subclass that
    # overrides a fused method (to add a side effect, e.g. an auxiliary loss) keeps the derived path.
    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if type(self).forward_and_log_det is not Chain.forward_and_log_det:
            return super().forward(x, context)
        check_event(x, self.event_shape, "Chain")
        for t in self.transforms:
            x = t.forward(x, context)
        return x

    def inverse(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        if type(self).inverse_and_log_det is not Chain.inverse_and_log_det:
            return super().inverse(z, context)
        check_event(z, self.event_shape_out, "Chain", "latent input")
        for t in reversed(self.transforms):
            z = t.inverse(z, context)
        return z

    def extra_repr(self) -> str:
        return ""
