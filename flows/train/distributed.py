"""Multi-process data-parallel training on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Launch one process per device with ``torchrun --nproc-per-node N script.py`` (or ``flows fit
--nproc N``); each process calls :func:`init_distributed` and then trains with the same
:class:`~flows.train.Trainer` code as a single process. The trainer then

* wraps the objective in :class:`torch.nn.parallel.DistributedDataParallel` (through
  :class:`ObjectiveModule`, so objectives that call ``log_prob``, ``sample_and_log_prob`` or
  anything else all have their gradients averaged),
* gives every process its share of each **global** batch: ``batch_size`` is the number of samples
  per optimizer step over all processes together, so N processes with ``batch_size=B`` compute the
  same gradient (the mean over the same ``B`` samples) as one process with ``batch_size=B``, up to
  floating-point summation order. ``B`` must be divisible by N;
* averages validation metrics over all processes (weighted by their number of samples),
* takes the NaN-guard and stopping decisions jointly, so no process is left waiting,
* writes checkpoints, metrics and progress from rank 0 only; every process loads the checkpoint
  when resuming.

Per-process randomness (dequantization noise, samples drawn by an objective) comes from each
process's own global generator, seeded differently per rank by :func:`init_distributed`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "ObjectiveModule",
    "all_reduce_weighted_mean",
    "cleanup_distributed",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_distributed",
]


def is_distributed() -> bool:
    """Whether a process group with more than one process is active."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """Number of processes (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def init_distributed(backend: str | None = None, *, seed: int | None = None) -> torch.device:
    """Join the process group described by the ``torchrun`` environment and pick this process's device.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. The backend
    defaults to NCCL when CUDA is available and gloo otherwise. With ``seed`` given, the global
    generators are seeded with ``seed + rank``.

    Returns:
        The device of this process (``cuda:LOCAL_RANK`` or ``cpu``).

    Raises:
        RuntimeError: when the environment variables of a launcher are missing.
    """
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_distributed: expected the torchrun environment variables, missing {missing}; launch with "
            "torchrun --nproc-per-node N ... or flows fit --nproc N"
        )
    use_cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if use_cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda and backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    if seed is not None:
        torch.manual_seed(seed + dist.get_rank())
    return device


def cleanup_distributed(*, barrier: bool = True) -> None:
    """Leave the process group (if one is active).

    With ``barrier`` (the default) every process first waits for the others, so that no process
    tears its gloo connections down while a peer is still using them (a peer that is still saving
    a checkpoint, say): gloo then aborts the process that is left behind ("terminate called without
    an active exception"). Pass ``barrier=False`` when leaving after an error, where the peers may
    never arrive.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_weighted_mean(values: dict[str, float], weight: float, device: torch.device) -> dict[str, float]:
    """Average per-process means over all processes, weighting each by its ``weight`` (sample count).

    Every process must pass the same keys. Without a process group the values are returned unchanged.
    """
    if not is_distributed() or not values:
        return values
    keys = sorted(values)
    packed = torch.tensor([values[k] * weight for k in keys] + [weight], dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    total = float(packed[-1])
    reduced = {k: float(packed[i]) / total for i, k in enumerate(keys)}
    return {k: reduced[k] for k in values}


class ObjectiveModule(nn.Module):
    """``forward(batch) = objective(model, batch)``: lets DDP see whatever the objective computes.

    ``DistributedDataParallel`` averages gradients of everything computed inside its module's
    ``forward``. Wrapping the (model, objective) pair makes that the whole loss, whichever of the
    model's methods the objective calls.

    Args:
        model: the model being trained (its parameters are this module's parameters).
        objective: the training objective.
    """

    def __init__(self, model: nn.Module, objective) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: object) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        return self.objective(self.model, batch)

    def parallel(self, device: torch.device, find_unused_parameters: bool = False) -> nn.Module:
        """This module wrapped in ``DistributedDataParallel`` for ``device`` (needs a process group)."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(self, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
