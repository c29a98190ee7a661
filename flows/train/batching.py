"""What the trainer does to data before the objective sees it: loaders, process shards, resumable epochs, devices.

Everything here is plumbing that no objective needs to know about. A batch leaves this module on
the model's device, as the loader made it: ``(x,)`` or ``(x, context)`` for tensor data (a tuple
of tensors sharing their leading batch dimension), whatever an iterable yields, or ``None`` for
objectives that draw their own samples. Objectives unpack it with :func:`split_batch`; the trainer
weighs epoch means by :func:`batch_size_of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from flows.data.loader import TensorLoader

__all__ = [
    "Data",
    "as_tensors",
    "batch_size_of",
    "epoch_batches",
    "on_device",
    "split_batch",
    "steps_in_epoch",
    "to_device",
    "train_loader",
    "val_loader",
]

Data = Tensor | Sequence[Tensor] | TensorLoader | Iterable[Any] | None
"""What :meth:`flows.train.Trainer.fit` accepts as training or validation data."""


def split_batch(batch: object) -> tuple[Tensor, Tensor | None]:
    """``(x, context)`` from a batch that is a tensor, ``(x,)`` or ``(x, context)``.

    Raises:
        TypeError: for anything else.

    Example:
        >>> import torch
        >>> x, context = split_batch((torch.zeros(4, 2),))
        >>> tuple(x.shape), context
        ((4, 2), None)
    """
    if isinstance(batch, Tensor):
        return batch, None
    if type(batch) is tuple and len(batch) == 1 and isinstance(batch[0], Tensor):  # the common case, kept cheap
        return batch[0], None
    if isinstance(batch, (tuple, list)) and 1 <= len(batch) <= 2 and all(isinstance(b, Tensor) for b in batch):
        return batch[0], batch[1] if len(batch) == 2 else None
    raise TypeError(f"expected a batch that is a tensor, (x,) or (x, context), got {type(batch).__name__}")


def batch_size_of(batch: object) -> int:
    """Number of samples in a batch (its first tensor's leading size; 1 for ``None`` or non-tensors)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor) and batch[0].dim():
        return int(batch[0].shape[0])
    return 1


def to_device(batch: object, device: torch.device) -> object:
    """Move the tensors of a batch (a tensor, tuple or list of tensors) to ``device``."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def on_device(batches: Iterable[object], device: torch.device) -> Iterator[object]:
    """``batches`` moved to ``device`` one by one (unchanged for a CPU device: CPU data stays where it is)."""
    if device.type == "cpu":
        yield from batches
    else:
        for batch in batches:
            yield to_device(batch, device)


def as_tensors(data: object) -> tuple[Tensor, ...] | None:
    """``(x,)`` or ``(x, context)`` for tensor data, ``None`` for anything else."""
    if isinstance(data, Tensor):
        return (data,)
    if isinstance(data, (tuple, list)) and data and all(isinstance(t, Tensor) for t in data):
        return tuple(data)
    return None


def train_loader(data: Data, batch_size: int, seed: int, shuffle: bool, rank: int, world_size: int) -> object:
    """A :class:`~flows.data.TensorLoader` over this process's share of each global batch, for tensor data."""
    tensors = as_tensors(data)
    if tensors is None:
        return data
    return TensorLoader(*tensors, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)


def val_loader(data: Data, batch_size: int, rank: int, world_size: int) -> object:
    """Batches of this process's share (every ``world_size``-th sample) of tensor validation data, in order."""
    tensors = as_tensors(data)
    if tensors is None:
        return data
    if world_size > 1:
        tensors = tuple(t[rank::world_size] for t in tensors)
    return TensorLoader(*tensors, batch_size=batch_size, shuffle=False)


def epoch_batches(
    loader: object, epoch: int, position: int, steps_per_epoch: int | None, device: torch.device
) -> Iterator[object]:
    """The remaining batches of epoch ``epoch`` from step ``position`` on, on ``device``.

    Exact for ``TensorLoader`` (whose state is the trainer's ``epoch`` and ``epoch_step``) and
    ``None``, which yields ``None`` batches (objectives that draw their own samples); any other
    iterable is iterated from its start.
    """
    if isinstance(loader, TensorLoader):
        loader.epoch, loader.position = epoch, position
        yield from on_device(loader, device)
    elif loader is None:
        for _ in range(position, steps_per_epoch or 0):
            yield None
    else:
        yield from on_device(loader, device)


def steps_in_epoch(loader: object, steps_per_epoch: int | None) -> int | None:
    """Number of batches per epoch, ``None`` when the iterable has no length."""
    if loader is None:
        return steps_per_epoch
    try:
        return len(loader)
    except TypeError:
        return None
