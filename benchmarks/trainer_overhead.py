"""Per-step overhead of flows.train.Trainer over a bare PyTorch training loop on the same model.

Both train an identical copy of the model on the same data with Adam, interleaved so that machine
load hits both alike, in two ways:

* per step: a callback after every Trainer step runs one bare step; the Trainer's step time is the
  time between consecutive callbacks minus the bare step inside (so the loader, the loop, the NaN
  guard, metrics and callbacks all count). Ratio of the median step times.
* per epoch: a callback at the start of each Trainer epoch runs one bare epoch; the Trainer's epoch
  time is measured between consecutive epoch starts (end-of-epoch bookkeeping included) minus the
  bare epoch. Median of the per-epoch ratios.

One torch thread.

    python benchmarks/trainer_overhead.py                # ~1 minute
    python benchmarks/trainer_overhead.py --epochs 5     # quick look
"""

from __future__ import annotations

import copy
import statistics
import time

import _harness
import torch

import flows
from flows.train import Callback, Trainer, default_optimizer


def bare_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, batch: int, epoch: int):
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch))
    for i in range(0, len(data), batch):
        x = data[order[i : i + batch]]
        loss = -model.log_prob(x).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


class Interleave(Callback):
    """Runs one bare epoch at the start of every Trainer epoch and records both epoch times."""

    def __init__(self, bare_model, data, batch) -> None:
        self.bare_model = bare_model
        self.optimizer = default_optimizer(bare_model.parameters(), lr=1e-3)  # the Trainer's default
        self.data, self.batch = data, batch
        self.bare: list[float] = []
        self.trainer: list[float] = []
        self._mark: float | None = None
        self._inside = 0.0

    def on_epoch_start(self, trainer) -> None:
        now = time.perf_counter()
        if self._mark is not None:
            self.trainer.append(now - self._mark - self._inside)
        start = time.perf_counter()
        bare_epoch(self.bare_model, self.optimizer, self.data, self.batch, len(self.bare))
        self._inside = time.perf_counter() - start
        self.bare.append(self._inside)
        self._mark = now

    def on_fit_end(self, trainer) -> None:
        self.trainer.append(time.perf_counter() - self._mark - self._inside)


class InterleaveSteps(Callback):
    """Runs one bare step after every Trainer step and records both step times."""

    def __init__(self, bare_model, data, batch) -> None:
        self.bare_model = bare_model
        self.optimizer = default_optimizer(bare_model.parameters(), lr=1e-3)  # the Trainer's default
        self.batches = data.split(batch)
        self.bare: list[float] = []
        self.trainer: list[float] = []
        self._mark: float | None = None

    def on_step_end(self, trainer, metrics) -> None:
        now = time.perf_counter()
        if self._mark is not None:
            self.trainer.append(now - self._mark)
        x = self.batches[len(self.bare) % len(self.batches)]
        start = time.perf_counter()
        loss = -self.bare_model.log_prob(x).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        end = time.perf_counter()
        self.bare.append(end - start)
        self._mark = end


def run(name: str, features: int, transforms: int, hidden: int, n: int, batch: int, epochs: int) -> float:
    torch.manual_seed(0)
    model = flows.RealNVP(features, transforms=transforms, hidden=(hidden, hidden))
    bare_model = copy.deepcopy(model)
    data = torch.randn(n, features) * torch.linspace(0.5, 2.0, features)
    steps = -(-n // batch)
    per_step = InterleaveSteps(copy.deepcopy(model), data, batch)
    Trainer(copy.deepcopy(model), lr=1e-3, callbacks=[per_step], progress=False).fit(
        data, epochs=epochs + 1, batch_size=batch
    )
    # trainer[j] is the step after the bare step bare[j]; the first epoch warms up
    skip = steps if len(per_step.trainer) > steps else 0  # (toy sizes in the smoke test have too few steps)
    bare_steps, our_steps = per_step.bare[skip:-1], per_step.trainer[skip:]
    # ratio of medians: robust to the scheduler's time slices, which are as long as a step on a busy machine
    step_ratio = statistics.median(our_steps) / statistics.median(bare_steps)
    spy = Interleave(bare_model, data, batch)
    Trainer(model, lr=1e-3, callbacks=[spy], progress=False).fit(data, epochs=epochs + 1, batch_size=batch)
    bare, ours = spy.bare[1:], spy.trainer[1:]  # the first epoch of each warms up (allocations, lazy imports)
    b, t = statistics.median(bare_steps) * 1e3, statistics.median(our_steps) * 1e3
    epoch_ratio = statistics.median(o / r for o, r in zip(ours, bare, strict=True))
    print(f"{name:<34} {steps:>5} {b:>10.3f} {t:>12.3f} {step_ratio:>9.3f} {epoch_ratio:>10.3f}")
    return step_ratio


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = _harness.parser(__doc__, seed=None, epochs=15)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default data sizes (smoke tests)")
    args = _harness.setup(parser.parse_args(argv))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), medians over {args.epochs} interleaved epochs"
    )
    header = f"{'model (data)':<34} {'steps':>5} {'bare ms/step':>10} {'Trainer ms/step':>12}"
    print(f"{header} {'per step':>9} {'per epoch':>10}")
    results = {
        "tiny": run("RealNVP 2-D, 4x32 (batch 256)", 2, 4, 32, max(2, int(8192 * args.scale)), 256, args.epochs),
        "digits": run("RealNVP 64-D, 6x128 (batch 128)", 64, 6, 128, max(2, int(2560 * args.scale)), 128, args.epochs),
    }
    print("ratios = Trainer time / bare-loop time (median step times; median of per-epoch ratios); target <= 1.05")
    return results


if __name__ == "__main__":
    main()
