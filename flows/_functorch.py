"""Running whole-batch code under :func:`torch.func.vmap`: fold the mapped dimension into the batch.

A layer whose computation couples the rows of a batch through Python control flow (an adaptive
ODE solver choosing one step sequence, an accept/reject test) cannot run on vmap's batched tensors,
which refuse data-dependent branching. Such a layer already handles a leading batch of any size,
so under vmap it can run once on the unwrapped tensors with the mapped dimension in front, exactly
as a hand-written vmap rule of a ``torch.autograd.Function`` does, and hand the result back batched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["functorch_active", "vmap_level", "with_vmap_folded"]


def functorch_active() -> bool:
    """Whether a :mod:`torch.func` transform (vmap, grad, jacrev, jvp, ...) is running (never under torch.compile)."""
    if torch.compiler.is_compiling():
        return False
    return bool(torch._C._functorch.get_interpreter_stack())


def vmap_level(*tensors: Tensor | None) -> int | None:
    """The level of the innermost running :func:`torch.func.vmap` if one of ``tensors`` is batched at it.

    ``None`` outside vmap, when the innermost transform is not a vmap (``vmap(jacrev(f))``: the
    tensors are then wrapped for differentiation first), or when no tensor is batched at that level.
    """
    if torch.compiler.is_compiling():
        return None
    stack = torch._C._functorch.get_interpreter_stack()
    if not stack or stack[-1].key() != torch._C._functorch.TransformType.Vmap:
        return None
    level = stack[-1].level()
    functorch = torch._C._functorch
    for t in tensors:
        if isinstance(t, Tensor) and functorch.is_batchedtensor(t) and functorch.maybe_get_level(t) == level:
            return level
    return None


def with_vmap_folded(fn: Callable[..., tuple[Tensor, ...]], *tensors: Tensor | None) -> tuple[Tensor, ...]:
    """``fn(*tensors)`` with the innermost vmap's dimension as the leading batch dimension of every tensor.

    Tensors batched at the innermost vmap level are unwrapped with that dimension moved to the front;
    the others (not ``None``) are broadcast along a new leading dimension of the vmap's size. ``fn``
    runs with the vmap layer popped (on ordinary tensors, as an autograd function's vmap rule does), so
    it must treat the leading dimension as one more batch dimension; each of its outputs comes back
    batched along its leading dimension. Without a vmap batching ``tensors``, this is ``fn(*tensors)``.

    Randomness inside ``fn`` is drawn once for the folded batch (independent per mapped row), the
    behaviour of ``vmap(..., randomness="different")``.
    """
    level = vmap_level(*tensors)
    if level is None:
        return fn(*tensors)
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter, temporarily_pop_interpreter_stack

    functorch = torch._C._functorch
    size = retrieve_current_functorch_interpreter().batch_size()
    folded = []
    for t in tensors:
        if isinstance(t, Tensor) and functorch.is_batchedtensor(t) and functorch.maybe_get_level(t) == level:
            value, dim = functorch._unwrap_batched(t, level)
            folded.append(value.movedim(dim, 0))
        elif isinstance(t, Tensor):
            folded.append(t.expand(size, *t.shape))
        else:
            folded.append(t)
    with temporarily_pop_interpreter_stack():
        outputs = fn(*folded)
    return tuple(functorch._add_batch_dim(out, 0, level) for out in outputs)
