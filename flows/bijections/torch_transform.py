r""":class:`TorchTransform` (a torch transform as a :class:`Bijection`) and :class:`BijectionTransform` (back).

PyTorch's transforms (``ExpTransform``, ``AffineTransform``, ``SigmoidTransform``, ``TanhTransform``,
compositions of them, ...) compute ``y = t(x)``, ``x = t.inv(y)`` and an element-wise (or
per-``domain.event_dim``) ``log_abs_det_jacobian(x, y)``. Wrapped, they follow this library's
contract: ``forward_and_log_det`` returns ``(t(x), ladj)`` with the log-determinant summed over the
whole event, ``inverse_and_log_det`` returns ``(t.inv(z), -ladj(x, z))``. Tensor attributes of the
transform (an ``AffineTransform``'s ``loc`` and ``scale``) become buffers, so they move with
``.to()``/``.double()`` and are saved in ``state_dict()``. :class:`BijectionTransform` goes the other
way: any flows layer as a torch transform (``Bijection.as_torch_transform()``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributions.transforms as tdt
from torch import Tensor
from torch.distributions import constraints

from flows._adoption import Adopting, adopt, copyable, modules_inside, untracked_leaves
from flows._validation import check_event
from flows.bijections.base import Bijection, inside, is_real, over_event

__all__ = ["BijectionTransform", "TorchTransform"]


def _module_dtype(t: tdt.Transform) -> torch.dtype | None:
    """The dtype of the first parameter of a module that ``t`` computes with, or ``None``."""
    return next((p.dtype for m in modules_inside(t) for p in m.parameters()), None)


def _probe_bijective(t: tdt.Transform, shape: tuple[int, ...], module_dtype: torch.dtype | None = None) -> str | None:
    """What shows ``t`` is not a bijection at two generic points of its domain, or ``None``.

    ``bijective`` is a class attribute: ``PowerTransform(0.)`` or ``AffineTransform(0., 0.)``
    claim it while mapping everything to one point. At two points inside the domain
    (:func:`torch.distributions.transform_to` of generic reals) the log-determinant must be finite
    and ``t.inv(t(x))`` must give ``x`` back. A domain that cannot be sampled is not probed.
    """
    dtype = next((v.dtype for v in vars(t).values() if isinstance(v, Tensor) and v.is_floating_point()), None)
    dtype = torch.promote_types(dtype or torch.float64, torch.float64) if module_dtype is None else module_dtype
    u = torch.tensor([0.3183, -0.5772], dtype=dtype).reshape(2, *(1,) * len(shape)).expand(2, *shape)
    try:
        x = torch.distributions.transform_to(t.domain)(u)
    except NotImplementedError:
        return None
    try:
        with torch.no_grad():
            z = t(x)
            back = t.inv(z)
            ladj = torch.as_tensor(t.log_abs_det_jacobian(x, z))
    except (ArithmeticError, RuntimeError, ValueError) as error:  # e.g. math.log(0) of a float scale
        return f"an error at a point of its domain ({type(error).__name__}: {error})"
    finite = torch.isfinite(ladj)
    if not bool(finite.all()):
        return f"a non-finite log-determinant {ladj[~finite][0].item()} at a point of its domain"
    tolerance = (1e-6, 1e-8) if dtype == torch.float64 else (1e-4, 1e-5)
    if not bool(torch.allclose(back, x, rtol=tolerance[0], atol=tolerance[1])):
        return "an inverse that does not give the input back (t.inv(t(x)) != x) at a point of its domain"
    return None


class TorchTransform(Adopting, Bijection):
    r"""A bijective ``torch.distributions`` transform, with its log-determinant summed over the event.

    * forward: :math:`z = t(x)`, :math:`\log|\det J| = \sum_{\text{event}} t.\text{log\_abs\_det\_jacobian}(x, z)`;
    * inverse: :math:`x = t^{-1}(z)`, the negative of the forward log-determinant at :math:`x`.

    The wrapper takes the transform over (caching off; inverses ``t.inv`` rebuilt so that the
    module survives ``copy.deepcopy``): the tensor attributes of its leaf transforms are replaced
    by the wrapper's buffers, which hold the same values. It must be bijective and keep the event shape
    (``forward_shape(event) == event``).

    What the transform computes with becomes the wrapper's: ``nn.Parameter`` attributes stay
    parameters, and modules among its attributes (also inside ``functools.partial`` objects and
    bound methods, as zuko's transforms hold their hyper-networks) become submodules; a Pyro
    ``TransformModule`` is itself the submodule ``transform`` (its identity cache switched off). So
    an optimiser of the flow trains them and ``state_dict()`` holds them. ``domain`` and
    ``codomain`` are the transform's over the whole event; inputs outside them are refused
    (torch's Sigmoid inverse would clamp them), and a :class:`~flows.Flow` with this layer in front
    has that domain as its ``support`` (``log_prob`` is ``-inf`` outside).

    Args:
        transform: e.g. ``ComposeTransform([AffineTransform(0.0, 2.0), TanhTransform()])``.
        event_shape: shape of one event; at least ``transform.domain.event_dim`` dimensions.

    Raises:
        TypeError: for something that is not a ``torch.distributions.transforms.Transform``, or a
            tensor attribute computed from trainable tensors (it would be frozen).
        ValueError: for a non-bijective transform (``bijective=False``, or one that fails the probe
            at two points of its domain: a non-finite log-determinant or ``t.inv(t(x)) != x``, as
            ``PowerTransform(0.)`` does), one that changes the event shape, or an event shape with
            fewer dimensions than the transform's own event dimension; in the fused methods, finite
            inputs outside the (co)domain; at construction, a transform that computes with trainable
            tensors held where the wrapper cannot find them (a closure).

    Example:
        >>> import torch
        >>> from torch.distributions.transforms import ExpTransform
        >>> t = TorchTransform(ExpTransform().inv, 2)  # log: (0, inf) -> R
        >>> z, ladj = t.forward_and_log_det(torch.tensor([[1.0, 2.0]]))
        >>> z, ladj  # ladj = -log 1 - log 2
        (tensor([[0.0000, 0.6931]]), tensor([-0.6931]))
    """

    def __init__(self, transform: tdt.Transform, event_shape: int | Sequence[int]) -> None:
        if not isinstance(transform, tdt.Transform):
            raise TypeError(
                f"TorchTransform: expected a torch.distributions.transforms.Transform, got {type(transform).__name__}"
            )
        if not transform.bijective:
            raise ValueError(f"TorchTransform: expected a bijective transform, got {transform}")
        super().__init__(event_shape)
        shape = tuple(self.event_shape)
        if any(s is None for s in shape):
            raise ValueError(f"TorchTransform: expected a fully specified event shape, got {shape}")
        if transform.domain.event_dim > len(shape) or transform.codomain.event_dim > len(shape):
            raise ValueError(
                f"TorchTransform: expected an event shape with at least {transform.domain.event_dim} dimensions "
                f"for {transform}, got {shape}"
            )
        if tuple(transform.forward_shape(shape)) != shape:
            raise ValueError(
                f"TorchTransform: expected a transform that keeps the event shape {shape}, "
                f"got one that maps it to {tuple(transform.forward_shape(shape))}"
            )
        problem = _probe_bijective(transform, shape, _module_dtype(transform))
        if problem is not None:
            text = " ".join(str(transform).split())  # a composition's repr spans lines
            raise ValueError(f"TorchTransform: expected a bijective transform, got {text} with {problem}")
        self.transform = copyable(transform)  # a Pyro TransformModule: registered as the submodule `transform`
        self._slots = adopt(self, self.transform, "TorchTransform")
        self._check_owned(shape)

    def _check_owned(self, shape: tuple[int, ...]) -> None:
        """Refuse a transform that computes with trainable tensors this module does not own (they would not train)."""
        dtype = next((p.dtype for p in self.parameters()), None) or next((b.dtype for b in self.buffers()), None)
        u = torch.zeros(shape, dtype=dtype or torch.get_default_dtype())
        try:
            with torch.enable_grad():
                z = self.transform(torch.distributions.transform_to(self.transform.domain)(u))
        except NotImplementedError:  # a domain that cannot be sampled: nothing to probe
            return
        missing = untracked_leaves(z, self)
        if missing:
            raise ValueError(
                f"TorchTransform: expected a transform whose trainable tensors it can own (nn.Parameters or modules "
                f"among its attributes), got {type(self.transform).__name__}, which computes with {missing} trainable "
                "tensor(s) held elsewhere (in a closure?): an optimiser of the flow would not train them and "
                "save_model would miss them; wrap a transform that holds its modules as attributes, or a Pyro "
                "TransformModule"
            )

    @property
    def domain(self) -> constraints.Constraint:
        """The wrapped transform's domain, over the whole event."""
        return over_event(self.transform.domain, len(self.event_shape))

    @property
    def codomain(self) -> constraints.Constraint:
        """The wrapped transform's codomain, over the whole event."""
        return over_event(self.transform.codomain, len(self.event_shape))

    def _ladj(self, x: Tensor, z: Tensor) -> Tensor:
        ladj = self.transform.log_abs_det_jacobian(x, z)
        batch = self.batch_shape(x)
        ladj = ladj.expand(*batch, *self.event_shape[: len(self.event_shape) - self.transform.domain.event_dim])
        return ladj.flatten(len(batch)).sum(-1) if ladj.dim() > len(batch) else ladj  # flatten: empty batches too

    def _check_domain(self, given: Tensor, out: Tensor, ladj: Tensor, what: str) -> None:
        """Refuse finite inputs that the wrapped transform maps to NaN (they lie outside its domain).

        A torch transform does not say where it is defined beyond its first part's ``domain``
        (``atanh`` inside a composition returns NaN for ``|u| >= 1``): a NaN that a finite input
        produced is an out-of-domain input, not a result.
        """
        batch = self.batch_shape(given)
        nan = torch.isnan(out).flatten(len(batch)).any(-1) | torch.isnan(ladj)
        if bool(nan.any()):
            finite = torch.isfinite(given).flatten(len(batch)).all(-1)
            culprit = nan & finite
            if bool(culprit.any()):
                index = tuple(int(i) for i in culprit.nonzero()[0])
                raise ValueError(
                    f"{type(self).__name__}({self.transform}): expected {what} inside the wrapped transform's domain, "
                    f"got finite values at batch index {index} that it maps to NaN"
                )

    def _check_constraint(self, given: Tensor, constraint: constraints.Constraint, what: str) -> None:
        """Refuse finite inputs outside the wrapped transform's (co)domain (torch's Sigmoid inverse clamps them)."""
        if is_real(constraint):  # nothing to check, no reduction
            return
        outside = ~inside(constraint, given, len(self.event_shape)) & torch.isfinite(given).flatten(
            given.dim() - len(self.event_shape)
        ).all(-1)
        if bool(outside.any()):
            index = tuple(int(i) for i in outside.nonzero()[0])
            raise ValueError(
                f"{type(self).__name__}({self.transform}): expected {what} in its {constraint}, got values outside it "
                f"at batch index {index}"
            )

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(x, self.event_shape, type(self).__name__)
        self._check_constraint(x, self.domain, "inputs")
        z = self.transform(x)
        ladj = self._ladj(x, z)
        self._check_domain(x, z, ladj, "inputs")
        return z, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(z, self.event_shape, type(self).__name__, "latent input")
        self._check_constraint(z, self.codomain, "latent inputs")
        x = self.transform.inv(z)
        ladj = -self._ladj(x, z)
        self._check_domain(z, x, ladj, "latent inputs")
        return x, ladj

    def extra_repr(self) -> str:
        return f"{self.transform}, event_shape={tuple(self.event_shape)}"


class BijectionTransform(tdt.Transform):
    r"""A :class:`~flows.bijections.base.Bijection` as a :class:`torch.distributions.transforms.Transform`.

    The direction is the bijection's (data to latent): ``T(x) = f(x)``, ``T.inv(z) = f^{-1}(z)`` and
    ``T.log_abs_det_jacobian(x, z)`` :math:`= \log|\det J_f(x)|` of shape ``batch`` (summed over
    the event: ``domain`` and ``codomain`` are the bijection's, with ``event_dim = len(event_shape)``).
    So torch's ``TransformedDistribution(base, T.inv)`` (which maps base draws *to* data) is the flow
    ``Flow(f, base)``: :math:`\log p(x) = \log p_Z(f(x)) + \log|\det J_f(x)|`.

    Each call runs the bijection's fused ``*_and_log_det`` once and remembers that log-determinant
    with the input and output tensors, so ``log_abs_det_jacobian(x, z)`` on exactly the pair just
    computed (what ``TransformedDistribution.log_prob`` and ``rsample`` do) costs no second pass;
    any other pair is computed afresh. The memo is keyed on the output tensor itself, which is only
    ever paired with the log-determinant computed with it, so it cannot go stale. ``cache_size=1``
    additionally turns on torch's call cache (``T.inv(T(x))`` returns ``x``), which is keyed on the
    input's identity: a second call on the same tensor after the parameters changed returns the old
    output, so keep it for sampling-then-scoring.

    Gradients reach the bijection's parameters; in Pyro, register them with
    ``pyro.module(name, bijection)``.

    Args:
        bijection: the flows transform.
        context: fixed context of a conditional bijection, ``(*batch, context_features)``; it is
            broadcast to the batch of every input.
        cache_size: 0 or 1, torch's call cache.

    Example:
        >>> import torch
        >>> from torch.distributions import Independent, Normal, TransformedDistribution
        >>> from flows import MAF
        >>> flow = MAF(2, transforms=1, hidden=(8,))
        >>> base = Independent(Normal(torch.zeros(2), torch.ones(2)), 1)
        >>> d = TransformedDistribution(base, flow.transform.as_torch_transform().inv)
        >>> x = torch.randn(5, 2)
        >>> torch.allclose(d.log_prob(x), flow.log_prob(x))
        True
    """

    bijective = True

    def __init__(self, bijection: Bijection, context: Tensor | None = None, *, cache_size: int = 0) -> None:
        if not isinstance(bijection, Bijection):
            raise TypeError(f"BijectionTransform: expected a flows Bijection, got {type(bijection).__name__}")
        if cache_size not in (0, 1):
            raise ValueError(f"BijectionTransform: expected cache_size 0 or 1, got {cache_size!r}")
        if context is not None and not isinstance(context, Tensor):
            raise TypeError(f"BijectionTransform: expected a context tensor or None, got {type(context).__name__}")
        super().__init__(cache_size=cache_size)
        self.bijection = bijection
        self.context = context
        self._memo: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def domain(self) -> constraints.Constraint:
        return self.bijection.domain

    @property
    def codomain(self) -> constraints.Constraint:
        return self.bijection.codomain

    def _context(self, x: Tensor, event_ndim: int) -> Tensor | None:
        if self.context is None:
            return None
        return self.context.expand(*x.shape[: x.dim() - event_ndim], self.context.shape[-1])

    def _call(self, x: Tensor) -> Tensor:
        z, ladj = self.bijection.forward_and_log_det(x, self._context(x, len(self.bijection.event_shape)))
        self._memo = (x, z, ladj)
        return z

    def _inverse(self, z: Tensor) -> Tensor:
        x, ladj = self.bijection.inverse_and_log_det(z, self._context(z, len(self.bijection.event_shape_out)))
        self._memo = (x, z, -ladj)
        return x

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        memo = self._memo
        if memo is not None and memo[0] is x and memo[1] is y:
            return memo[2]
        return self.bijection.forward_and_log_det(x, self._context(x, len(self.bijection.event_shape)))[1]

    def with_cache(self, cache_size: int = 1) -> BijectionTransform:
        if cache_size == self._cache_size:
            return self
        return BijectionTransform(self.bijection, self.context, cache_size=cache_size)

    def _shape(self, shape: Sequence[int], inverse: bool) -> torch.Size:
        t = self.bijection
        given, other = (t.event_shape_out, t.event_shape) if inverse else (t.event_shape, t.event_shape_out)
        shape = torch.Size(shape)
        batch = shape[: len(shape) - len(given)]
        if tuple(given) == tuple(other):
            return shape
        if all(s is not None for s in other):
            return batch + torch.Size(other)
        with torch.no_grad():  # shape-changing layer of free sizes (a squeeze): run it once
            probe = torch.zeros(shape[len(batch) :], dtype=next((p.dtype for p in t.parameters()), None))
            return batch + (t.inverse(probe) if inverse else t.forward(probe)).shape

    def forward_shape(self, shape: Sequence[int]) -> torch.Size:
        return self._shape(shape, inverse=False)

    def inverse_shape(self, shape: Sequence[int]) -> torch.Size:
        return self._shape(shape, inverse=True)

    def __repr__(self) -> str:
        context = "" if self.context is None else f", context={tuple(self.context.shape)}"
        return f"BijectionTransform({type(self.bijection).__name__}{context})"
