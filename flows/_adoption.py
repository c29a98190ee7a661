"""Taking over objects of other libraries: the tensors and modules inside torch transforms and distributions.

A wrapper module (:class:`~flows.TorchTransform`, :class:`~flows.TorchDistribution`) must own
whatever state the wrapped object computes with, or an optimiser trains nothing and
``state_dict()`` misses weights. :func:`adopt` walks the object (its attributes, nested transforms
and distributions, ``functools.partial`` objects and bound methods, as zuko's transforms hold their
hyper-networks) and registers on the wrapper:

* every ``nn.Module`` it finds as a submodule (its parameters and buffers become the wrapper's);
* every ``nn.Parameter`` attribute as a parameter (the same object: it stays trainable);
* every other tensor attribute as a buffer, the object pointed at the buffer (:func:`point_at`).

A tensor that requires gradients but is no parameter was computed from parameters elsewhere and
would be frozen at its current value: it is refused. :func:`untracked_leaves` is the last check:
the trainable leaves an output depends on that the wrapper does not own.
"""

from __future__ import annotations

import functools
import types

import torch.distributions as td
import torch.distributions.transforms as tdt
from torch import Tensor, nn

__all__ = ["Adopting", "Inverted", "adopt", "copyable", "modules_inside", "point_at", "untracked_leaves"]

Slot = tuple[object, str, str]  # (owner, attribute, registered name)


class Inverted(tdt.Transform):
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


def copyable(t: tdt.Transform) -> tdt.Transform:
    """``t`` with every torch ``_InverseTransform`` replaced by :class:`Inverted`, caching off where it can be.

    A transform that is also an ``nn.Module`` (Pyro's ``TransformModule``) cannot be rebuilt with
    another cache size: its cache (and its members') is switched off in place. Left on, it is keyed
    on the identity of the last input, so a training loop scoring the same data tensor every step
    would get the first step's output (and graph) back.
    """
    if isinstance(t, nn.Module):
        for part in t.modules():
            if isinstance(part, tdt.Transform) and part._cache_size:
                part._cache_size, part._cached_x_y = 0, (None, None)
        return t
    if isinstance(t, tdt._InverseTransform):
        return Inverted(copyable(t.inv))
    if isinstance(t, tdt.ComposeTransform):
        return tdt.ComposeTransform([copyable(p) for p in t.parts])
    if isinstance(t, tdt.IndependentTransform):
        return tdt.IndependentTransform(copyable(t.base_transform), t.reinterpreted_batch_ndims)
    try:
        return t.with_cache(0)
    except NotImplementedError:  # a custom transform without a cache-size constructor
        return t


def _walk(obj: object, path: str, seen: set[int], slots: list[Slot], modules: list[nn.Module]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        modules.append(obj)
        for key, value in vars(obj).items():  # a module held in a partial (Pyro's conditioned transforms)
            if isinstance(value, (functools.partial, types.MethodType)):
                _walk(value, f"{path}_{key}", seen, slots, modules)
        return
    if isinstance(obj, functools.partial):
        for i, part in enumerate((obj.func, *obj.args, *obj.keywords.values())):
            _walk(part, f"{path}_p{i}", seen, slots, modules)
        return
    if isinstance(obj, types.MethodType):
        _walk(obj.__self__, path, seen, slots, modules)
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _walk(item, f"{path}{i}", seen, slots, modules)
        return
    if not isinstance(obj, (tdt.Transform, td.Distribution)):
        return
    for key, value in vars(obj).items():
        if isinstance(value, Tensor):
            slots.append((obj, key, f"{path}_{key}"))
        else:
            _walk(value, f"{path}_{key}", seen, slots, modules)


def adopt(owner: nn.Module, obj: object, who: str, path: str = "t") -> list[Slot]:
    """Register the state of ``obj`` on ``owner``: modules, parameters, and tensors as buffers.

    Returns the slots (``(object, attribute, registered name)``) that :func:`point_at` keeps
    pointing at the registered tensors after ``.to()`` or ``load_state_dict``.

    Raises:
        TypeError: for a tensor attribute that requires gradients but is not an ``nn.Parameter``
            (computed from parameters the wrapper cannot own; it would be frozen).
    """
    slots: list[Slot] = []
    modules: list[nn.Module] = []
    _walk(obj, path, set(), slots, modules)
    registered: dict[int, str] = {}
    kept: list[Slot] = []
    for holder, key, name in slots:
        value = getattr(holder, key)
        if id(value) in registered:  # one tensor held twice (a lazy property's alias): one registration
            kept.append((holder, key, registered[id(value)]))
            continue
        if isinstance(value, nn.Parameter):
            owner.register_parameter(name, value)
        elif value.requires_grad:
            raise TypeError(
                f"{who}: expected tensors that are constants or nn.Parameters, got {type(holder).__name__}.{key}, "
                f"computed from trainable tensors ({type(value.grad_fn).__name__}) that the wrapper cannot own: it "
                "would be frozen at its current value; pass the nn.Parameter itself, or the module that computes it"
            )
        else:
            owner.register_buffer(name, value.detach().clone())
        registered[id(value)] = name
        kept.append((holder, key, name))
    held = {id(m) for m in owner.modules()}
    for i, module in enumerate(modules):
        if id(module) not in held:
            owner.add_module(f"{path}_module{i}", module)
    point_at(owner, kept)
    return kept


def modules_inside(obj: object) -> list[nn.Module]:
    """The modules :func:`adopt` would register for ``obj`` (``obj`` itself if it is one); changes nothing."""
    slots: list[Slot] = []
    modules: list[nn.Module] = []
    _walk(obj, "t", set(), slots, modules)
    return modules


def point_at(owner: nn.Module, slots: list[Slot]) -> None:
    """Point every slot's attribute at the tensor registered under its name (after ``.to()``, loading)."""
    for holder, key, name in slots:
        object.__setattr__(holder, key, getattr(owner, name))


class Adopting:
    """Mixin of a module that holds a wrapped object's tensors as its own buffers (``self._slots`` from :func:`adopt`).

    ``.to()``/``.double()`` and ``load_state_dict`` replace the buffers; the wrapped object is
    pointed at the new tensors after each, so it never computes with the old ones.
    """

    _slots: list

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        module = super()._apply(fn, recurse)  # type: ignore[misc]
        point_at(self, self._slots)  # type: ignore[arg-type]
        return module

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super()._load_from_state_dict(*args, **kwargs)  # type: ignore[misc]
        point_at(self, self._slots)  # type: ignore[arg-type]


def untracked_leaves(output: Tensor, owner: nn.Module) -> int:
    """How many trainable leaf tensors ``output`` depends on that ``owner`` does not hold as parameters."""
    owned = {id(p) for p in owner.parameters()}
    found: set[int] = set()
    stack, seen = [output.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        leaf = getattr(fn, "variable", None)
        if leaf is not None and id(leaf) not in owned:
            found.add(id(leaf))
        stack.extend(f for f, _ in fn.next_functions)
    return len(found)
