"""Two processes (gloo on CPU) train to the same model as one process with the same global batch."""

from __future__ import annotations

import faulthandler
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flows
from flows.train import MaximumLikelihood, Trainer
from flows.train.distributed import all_reduce_weighted_mean, cleanup_distributed

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def _setup() -> tuple[flows.Flow, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    realnvp = flows.RealNVP(3, transforms=2, hidden=(16,))
    model = flows.Flow(flows.Chain(flows.ActNorm(3), realnvp.transform), realnvp.base).double()
    g = torch.Generator().manual_seed(1)
    data = torch.randn(96, 3, generator=g, dtype=torch.float64) * torch.tensor([3.0, 1.0, 0.2], dtype=torch.float64)
    return model, data[:64], data[64:]


def _fit(model: flows.Flow, train: torch.Tensor, val: torch.Tensor):
    trainer = Trainer(model, MaximumLikelihood(), lr=1e-2, clip_grad_norm=5.0)
    history = trainer.fit(train, val, epochs=3, batch_size=16, seed=5)
    return trainer, history


def _worker(rank: int, store: str, out: str) -> None:
    # Where each process is after 60 s (a hang): the test prints these files if it times out.
    stacks = open(f"{out}.stacks{rank}.txt", "w")
    faulthandler.dump_traceback_later(60, file=stacks)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    finished = False
    try:
        model, train, val = _setup()
        torch.manual_seed(100 + rank)  # different per-process random state must not matter here
        trainer, history = _fit(model, train, val)
        mean = all_reduce_weighted_mean({"x": float(rank)}, weight=1.0 + rank, device=torch.device("cpu"))
        if rank == 0:
            torch.save(
                {
                    "state": trainer.model.state_dict(),
                    "val_loss": history["val_loss"],
                    "loss": history["loss"],
                    "mean": mean,
                },
                out,
            )
        finished = True
        trainer.release_distributed()  # its DDP wrapper must go before the process group does
        assert trainer.world_size == 1 and "DistributedDataParallel" not in repr(trainer._forward)
    finally:
        cleanup_distributed(barrier=finished)
    Path(f"{out}.left{rank}").write_text("trained, saved and left the process group\n")


def test_two_processes_match_one(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "ddp.pt"
    # spawn, not fork: by this point the pytest process may hold OpenMP, inter-op, tqdm or gloo threads
    # from earlier tests, and a forked child that inherits a lock held by one of them hangs forever
    # (seen on CI). Spawn re-imports torch in each child, a few seconds more, but is always safe.
    context = mp.start_processes(
        _worker, args=(str(tmp_path / "store"), str(out)), nprocs=2, start_method="spawn", join=False
    )
    deadline = time.monotonic() + 240
    while True:
        try:
            if context.join(timeout=1):
                break
        except mp.ProcessExitedException as error:
            # gloo can abort a process at interpreter exit ("terminate called without an active exception"), after
            # it has trained, saved and left the group: seen once in CI on a loaded machine, not reproduced in 14
            # runs. Say so, and still check the numbers; an abort before a process left the group fails the test.
            left = [(tmp_path / f"ddp.pt.left{rank}").exists() for rank in (0, 1)]
            if not (all(left) and out.exists()):
                raise
            warnings.warn(f"a training process aborted at exit, after leaving the process group: {error}", stacklevel=1)
            break
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            stacks = "\n".join(p.read_text() for p in sorted(tmp_path.glob("ddp.pt.stacks*.txt")))
            pytest.fail(f"the two training processes did not finish within 240 s; their stacks:\n{stacks}")
    result = torch.load(out, weights_only=True)

    model, train, val = _setup()
    trainer, history = _fit(model, train, val)
    single = trainer.model.state_dict()
    assert bool(single["transform.transforms.0.initialized"])
    for name, value in single.items():  # float64; only the summation order differs (ActNorm's two-pass
        # statistics and the gradients), and training amplifies those 1e-16 differences about 1e6 times
        torch.testing.assert_close(result["state"][name], value, rtol=1e-8, atol=1e-9, msg=name)
    assert result["val_loss"] == pytest.approx(history["val_loss"], rel=1e-9)
    assert result["loss"] == pytest.approx(history["loss"], rel=1e-9)
    assert result["mean"] == {"x": pytest.approx(2 / 3)}  # (0 * 1 + 1 * 2) / (1 + 2)
