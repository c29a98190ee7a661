"""In-memory mini-batches with a resumable position: what the trainer iterates over.

:class:`TensorLoader` shuffles with a permutation seeded by ``(seed, epoch)``, so its whole state is
two integers (``epoch``, ``position``). A checkpoint that stores them resumes a run in the middle of
an epoch on exactly the batches it would have seen. With ``world_size > 1`` every process draws the
same permutation and takes its own share of each **global** batch (``batch_size`` counts the samples
of all processes together).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from flows._validation import check_count

__all__ = ["TensorLoader"]


class TensorLoader:
    """Shuffled mini-batches of one or more tensors that share their first dimension.

    Each batch is a tuple ``(t1[idx], t2[idx], ...)`` (e.g. ``(x,)`` or ``(x, context)``). Iterating
    runs through the rest of the current epoch, then advances :attr:`epoch`; ``break`` out of the
    loop and iterate again to continue where it stopped.

    Args:
        *tensors: tensors with the same length ``N`` along dimension 0.
        batch_size: samples per global batch (all processes together).
        shuffle: draw a new permutation every epoch (seeded by ``seed + epoch``).
        drop_last: drop the last incomplete batch. With ``world_size > 1`` an incomplete last batch
            is cut to a multiple of ``world_size`` (at most ``world_size - 1`` samples of the epoch's
            permutation are left out), so that every process contributes the same number of samples
            to the averaged gradient.
        seed: seed of the permutations.
        rank: this process's index in ``0..world_size-1``.
        world_size: number of processes sharing each global batch.

    Raises:
        ValueError: for no tensors, mismatched lengths, a non-positive batch size or a batch size
            that is not a multiple of ``world_size``.

    Example:
        >>> import torch
        >>> loader = TensorLoader(torch.arange(10.0), batch_size=4, shuffle=False)
        >>> [b[0].tolist() for b in loader]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
        >>> len(loader), loader.epoch
        (3, 1)
    """

    def __init__(
        self,
        *tensors: Tensor,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not tensors:
            raise ValueError("TensorLoader: expected at least one tensor, got none")
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"TensorLoader: expected tensors, got {type(t).__name__}")
        n = tensors[0].shape[0] if tensors[0].dim() else 0
        if any(t.dim() == 0 or t.shape[0] != n for t in tensors):
            raise ValueError(
                f"TensorLoader: expected tensors of the same length, got shapes {[tuple(t.shape) for t in tensors]}"
            )
        if n == 0:
            raise ValueError("TensorLoader: expected at least one sample, got an empty tensor")
        check_count("TensorLoader", "batch_size", batch_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"TensorLoader: expected 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if batch_size % world_size:
            raise ValueError(
                f"TensorLoader: expected a global batch_size divisible by world_size={world_size}, got {batch_size}"
            )
        self.tensors = tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = int(seed)
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.position = 0

    @property
    def num_samples(self) -> int:
        """Number of samples ``N`` (all processes together)."""
        return self.tensors[0].shape[0]

    def __len__(self) -> int:
        """Number of batches per epoch."""
        full, rest = divmod(self.num_samples, self.batch_size)
        keep_rest = not self.drop_last and rest - rest % self.world_size > 0
        return full + int(keep_rest)

    def _order(self) -> Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        order = self._order()
        batches = len(self)
        while self.position < batches:
            start = self.position * self.batch_size
            index = order[start : start + self.batch_size]
            if self.world_size > 1:
                index = index[: len(index) - len(index) % self.world_size]
                index = index[self.rank :: self.world_size]
            self.position += 1
            # index_select: faster than t[index] on CPU (docs/guide/data.md); the index follows each tensor's device
            yield tuple(t.index_select(0, index.to(t.device, non_blocking=True)) for t in self.tensors)
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        """``epoch``, ``position`` (batches already served in this epoch) and ``seed``."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the position saved by :meth:`state_dict`."""
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
