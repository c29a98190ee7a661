"""How the trainer turns training data into batches: loaders, process shards, devices, resumable epochs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from flows.data.loader import TensorLoader

__all__ = ["Data", "as_tensors", "epoch_batches", "steps_in_epoch", "to_device", "train_loader", "val_loader"]

Data = Tensor | Sequence[Tensor] | TensorLoader | Iterable[Any] | None
"""What :meth:`flows.train.Trainer.fit` accepts as training or validation data."""


def to_device(batch: object, device: torch.device) -> object:
    """Move the tensors of a batch (a tensor, tuple or list of tensors) to ``device``."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


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


def epoch_batches(loader: object, epoch: int, position: int, steps_per_epoch: int | None) -> Iterator[object]:
    """The remaining batches of epoch ``epoch`` from step ``position`` on (exact for ``TensorLoader`` and ``None``).

    ``None`` data yields ``None`` batches (objectives that draw their own samples); any other
    iterable is iterated from its start.
    """
    if isinstance(loader, TensorLoader):
        loader.epoch, loader.position = epoch, position
        yield from loader
    elif loader is None:
        for _ in range(position, steps_per_epoch or 0):
            yield None
    else:
        yield from loader


def steps_in_epoch(loader: object, steps_per_epoch: int | None) -> int | None:
    """Number of batches per epoch, ``None`` when the iterable has no length."""
    if loader is None:
        return steps_per_epoch
    try:
        return len(loader)
    except TypeError:
        return None
