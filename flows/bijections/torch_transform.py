r""":class:`TorchTransform`: a bijective :class:`torch.distributions.transforms.Transform` as a :class:`Bijection`.

PyTorch's transforms (``ExpTransform``, ``AffineTransform``, ``SigmoidTransform``, ``TanhTransform``,
compositions of them, ...) compute ``y = t(x)``, ``x = t.inv(y)`` and an element-wise (or
per-``domain.event_dim``) ``log_abs_det_jacobian(x, y)``. Wrapped, they follow this library's
contract: ``forward_and_log_det`` returns ``(t(x), ladj)`` with the log-determinant summed over the
whole event, ``inverse_and_log_det`` returns ``(t.inv(z), -ladj(x, z))``. Tensor attributes of the
transform (an ``AffineTransform``'s ``loc`` and ``scale``) become buffers, so they move with
``.to()``/``.double()`` and are saved in ``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributions.transforms as tdt
from torch import Tensor

from flows._validation import check_event
from flows.bijections.base import Bijection

__all__ = ["TorchTransform"]


def _tensor_slots(t: tdt.Transform, path: str = "t", seen: set[int] | None = None) -> list[tuple[object, str, str]]:
    """``(owner, attribute, buffer name)`` for every tensor attribute of ``t`` and the transforms inside it."""
    seen = set() if seen is None else seen
    if id(t) in seen:
        return []
    seen.add(id(t))
    slots: list[tuple[object, str, str]] = []
    for key, value in vars(t).items():
        if isinstance(value, Tensor):
            slots.append((t, key, f"{path}_{key}"))
        elif isinstance(value, tdt.Transform):
            slots += _tensor_slots(value, f"{path}_{key}", seen)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, tdt.Transform) for v in value):
            for i, v in enumerate(value):
                slots += _tensor_slots(v, f"{path}_{key}{i}", seen)
    return slots


class _Inverted(tdt.Transform):
    """``inner.inv`` that survives ``copy.deepcopy`` (torch's ``_InverseTransform`` loses its transform there)."""

    def __init__(self, inner: tdt.Transform) -> None:
        super().__init__(cache_size=0)
        self.inner = inner

    @property
    def domain(self):
        return self.inner.codomain

    @property
    def codomain(self):
        return self.inner.domain

    @property
    def bijective(self) -> bool:
        return self.inner.bijective

    @property
    def sign(self) -> int:
        return self.inner.sign

    def _call(self, x: Tensor) -> Tensor:
        return self.inner.inv(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return self.inner(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -self.inner.log_abs_det_jacobian(y, x)

    def forward_shape(self, shape):
        return self.inner.inverse_shape(shape)

    def inverse_shape(self, shape):
        return self.inner.forward_shape(shape)

    def __repr__(self) -> str:
        return f"{self.inner}.inv"


def _copyable(t: tdt.Transform) -> tdt.Transform:
    """``t`` with every torch ``_InverseTransform`` replaced by :class:`_Inverted`, caching off."""
    if isinstance(t, tdt._InverseTransform):
        return _Inverted(_copyable(t.inv))
    if isinstance(t, tdt.ComposeTransform):
        return tdt.ComposeTransform([_copyable(p) for p in t.parts])
    if isinstance(t, tdt.IndependentTransform):
        return tdt.IndependentTransform(_copyable(t.base_transform), t.reinterpreted_batch_ndims)
    return t.with_cache(0)


def _probe_bijective(t: tdt.Transform, shape: tuple[int, ...]) -> str | None:
    """What shows ``t`` is not a bijection at two generic points of its domain, or ``None``.

    ``bijective`` is a class attribute: ``PowerTransform(0.)`` or ``AffineTransform(0., 0.)``
    claim it while mapping everything to one point. At two points inside the domain
    (:func:`torch.distributions.transform_to` of generic reals) the log-determinant must be finite
    and ``t.inv(t(x))`` must give ``x`` back. A domain that cannot be sampled is not probed.
    """
    dtype = next((v.dtype for v in vars(t).values() if isinstance(v, Tensor) and v.is_floating_point()), None)
    dtype = torch.promote_types(dtype or torch.float64, torch.float64)
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
    if not bool(torch.allclose(back, x, rtol=1e-6, atol=1e-8)):
        return "an inverse that does not give the input back (t.inv(t(x)) != x) at a point of its domain"
    return None


class TorchTransform(Bijection):
    r"""A bijective ``torch.distributions`` transform, with its log-determinant summed over the event.

    * forward: :math:`z = t(x)`, :math:`\log|\det J| = \sum_{\text{event}} t.\text{log\_abs\_det\_jacobian}(x, z)`;
    * inverse: :math:`x = t^{-1}(z)`, the negative of the forward log-determinant at :math:`x`.

    The wrapper takes the transform over (caching off; inverses ``t.inv`` rebuilt so that the
    module survives ``copy.deepcopy``): the tensor attributes of its leaf transforms are replaced
    by the wrapper's buffers, which hold the same values. It must be bijective and keep the event shape
    (``forward_shape(event) == event``).

    Args:
        transform: e.g. ``ComposeTransform([AffineTransform(0.0, 2.0), TanhTransform()])``.
        event_shape: shape of one event; at least ``transform.domain.event_dim`` dimensions.

    Raises:
        TypeError: for something that is not a ``torch.distributions.transforms.Transform``.
        ValueError: for a non-bijective transform (``bijective=False``, or one that fails the probe
            at two points of its domain: a non-finite log-determinant or ``t.inv(t(x)) != x``, as
            ``PowerTransform(0.)`` does), one that changes the event shape, or an event shape with
            fewer dimensions than the transform's own event dimension.

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
        problem = _probe_bijective(transform, shape)
        if problem is not None:
            text = " ".join(str(transform).split())  # a composition's repr spans lines
            raise ValueError(f"TorchTransform: expected a bijective transform, got {text} with {problem}")
        self.transform = _copyable(transform)
        self._slots = _tensor_slots(self.transform)
        for owner, key, name in self._slots:
            self.register_buffer(name, getattr(owner, key).detach().clone())
        self._point_at_buffers()

    def _point_at_buffers(self) -> None:
        for owner, key, name in self._slots:
            object.__setattr__(owner, key, getattr(self, name))

    def _apply(self, fn, recurse: bool = True):
        # .to()/.double() replace the buffers; the transform must use the new tensors.
        module = super()._apply(fn, recurse)
        self._point_at_buffers()
        return module

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._point_at_buffers()

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

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(x, self.event_shape, type(self).__name__)
        z = self.transform(x)
        ladj = self._ladj(x, z)
        self._check_domain(x, z, ladj, "inputs")
        return z, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(z, self.event_shape, type(self).__name__, "latent input")
        x = self.transform.inv(z)
        ladj = -self._ladj(x, z)
        self._check_domain(z, x, ladj, "latent inputs")
        return x, ladj

    def extra_repr(self) -> str:
        return f"{self.transform}, event_shape={tuple(self.event_shape)}"
