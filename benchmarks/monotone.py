"""Monotone-transformer flows against zuko's at equal wall clock on two moons: test NLL, step time, sampling time.

Contenders (``--contenders``; the ``zuko-*`` ones need ``pip install zuko``, in the ``bench`` extra):

* ``flows-naf``: ``flows.NAF(2, transforms=3, hidden=(64, 64), sigmoids=16)`` (deep sigmoidal transformer);
* ``zuko-naf``: ``zuko.flows.NAF(2, transforms=3, signal=16)`` (zuko's NAF: a monotonic MLP transformer
  with a 16-wide signal; not the same transformer as ours, the closest configuration);
* ``flows-unaf`` / ``zuko-unaf``: UMNN transformers, ``embedding=16, integrand=(64, 64)`` / ``signal=16``;
* ``flows-sospf`` / ``zuko-sospf``: sum-of-squares polynomials of degree 4, 3 squares;
* ``flows-bpf`` / ``zuko-bpf``: Bernstein polynomials of degree 16.

All: 3 autoregressive layers with (64, 64) MADEs, Adam lr 1e-3, batch 256, two moons (noise 0.05,
4000 train / 2000 test, standardised with the training statistics), float32, one thread. Each
contender trains for ``--budget`` seconds of its own step time; steps are interleaved in chunks
of ``--chunk`` steps (the contender with the least training time so far goes next), so that load
from other processes hits all alike. Reported: test NLL (nats, ± its standard error over the test
rows), steps taken, median step time, median time to draw ``--samples`` (1000) samples (3 repeats), and the step
time relative to the zuko contender of the same family.

    python benchmarks/monotone.py --budget 60          # ~8 minutes on a shared 2-core machine
    python benchmarks/monotone.py --budget 1 --contenders flows-naf flows-bpf   # smoke

Measured figures and their reading: docs/monotone.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

CONTENDERS = (
    "flows-naf",
    "zuko-naf",
    "flows-unaf",
    "zuko-unaf",
    "flows-sospf",
    "zuko-sospf",
    "flows-bpf",
    "zuko-bpf",
)


def _moons(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    import sklearn.datasets

    x, _ = sklearn.datasets.make_moons(6000, noise=0.05, random_state=seed)
    x = torch.from_numpy(x).float()
    train, test = x[:4000], x[4000:]
    mean, std = train.mean(0), train.std(0)
    return (train - mean) / std, (test - mean) / std


def _ours(name: str) -> tuple[torch.nn.Module, Callable, Callable]:
    import flows

    options = {
        "naf": (flows.NAF, {"sigmoids": 16}),
        "unaf": (flows.UNAF, {"embedding": 16, "integrand": (64, 64)}),
        "sospf": (flows.SOSPF, {"degree": 4, "squares": 3}),
        "bpf": (flows.BPF, {"degree": 16}),
    }
    cls, extra = options[name]
    model = cls(2, transforms=3, hidden=(64, 64), **extra)
    return model, model.log_prob, lambda n: model.sample((n,))


def _zuko(name: str) -> tuple[torch.nn.Module, Callable, Callable]:
    import zuko

    options = {
        "naf": (zuko.flows.NAF, {"transforms": 3, "signal": 16}),
        "unaf": (zuko.flows.UNAF, {"transforms": 3, "signal": 16}),
        "sospf": (zuko.flows.SOSPF, {"transforms": 3, "degree": 4, "polynomials": 3}),
        "bpf": (zuko.flows.BPF, {"transforms": 3, "degree": 16}),
    }
    cls, extra = options[name]
    model = cls(2, hidden_features=(64, 64), **extra)
    return model, lambda x: model().log_prob(x), lambda n: model().sample((n,))


def _make(contender: str):
    library, family = contender.split("-", 1)
    return (_ours if library == "flows" else _zuko)(family)


class _Run:
    """One contender's model, optimiser, data stream and measurements."""

    def __init__(self, contender: str, train: torch.Tensor, seed: int, batch: int, samples: int) -> None:
        torch.manual_seed(seed)
        self.name = contender
        self.model, self.log_prob, self.sample = _make(contender)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.train, self.batch = train, batch
        self.generator = torch.Generator().manual_seed(seed)
        self.step_times: list[float] = []
        self.spent = 0.0
        self.sample_size = samples

    def steps(self, n: int) -> None:
        self.model.train()
        for _ in range(n):
            rows = torch.randint(len(self.train), (self.batch,), generator=self.generator)
            start = time.perf_counter()
            loss = -self.log_prob(self.train[rows]).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            elapsed = time.perf_counter() - start
            self.step_times.append(elapsed)
            self.spent += elapsed

    @torch.no_grad()
    def evaluate(self, test: torch.Tensor) -> dict[str, float]:
        self.model.eval()
        lp = self.log_prob(test)
        sampling = []
        for _ in range(3):
            start = time.perf_counter()
            self.sample(self.sample_size)
            sampling.append(time.perf_counter() - start)
        return {
            "nll": float(-lp.mean()),
            "se": float(lp.std() / len(lp) ** 0.5),
            "steps": len(self.step_times),
            "step_ms": 1e3 * statistics.median(self.step_times),
            "sample_ms": 1e3 * statistics.median(sampling),
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="training seconds per contender")
    parser.add_argument("--chunk", type=int, default=20, help="steps per interleaved turn")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=1000, help="draws timed for the sampling column")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, test = _moons(args.seed)
    runs = [_Run(c, train, args.seed, args.batch, args.samples) for c in args.contenders]
    while True:
        active = [r for r in runs if r.spent < args.budget]
        if not active:
            break
        min(active, key=lambda r: r.spent).steps(args.chunk)
    results = {r.name: r.evaluate(test) for r in runs}
    print(f"two moons, {args.budget:g} s of training per contender, 1 thread, batch {args.batch}, seed {args.seed}")
    print(f"{'contender':<12} {'test NLL':>16} {'steps':>6} {'step ms':>8} {'vs zuko':>8} {'sample ms':>10}")
    for name, r in results.items():
        family = name.split("-", 1)[1]
        peer = results.get(f"zuko-{family}")
        ratio = f"{r['step_ms'] / peer['step_ms']:.2f}x" if peer and not name.startswith("zuko") else ""
        r["step_vs_zuko"] = r["step_ms"] / peer["step_ms"] if ratio else float("nan")
        nll = f"{r['nll']:.3f} ± {r['se']:.3f}"
        print(f"{name:<12} {nll:>16} {r['steps']:>6} {r['step_ms']:>8.2f} {ratio:>8} {r['sample_ms']:>10.1f}")
    return results


if __name__ == "__main__":
    main()
