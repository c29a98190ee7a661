"""Monotone-transformer flows against zuko's at equal wall clock on two moons and digits: NLL, step and sampling time.

Contenders (``--contenders``; the ``zuko-*`` ones need ``pip install zuko``, in the ``bench`` extra):

* ``flows-naf``: ``flows.NAF(D, sigmoids=16)`` (deep sigmoidal transformer) / ``zuko-naf``:
  ``zuko.flows.NAF(D, signal=16)`` (zuko's NAF: a monotonic MLP transformer with a 16-wide signal;
  not the same transformer as ours, the closest configuration);
* ``flows-unaf`` / ``zuko-unaf``: UMNN transformers, ``embedding=16, integrand=(64, 64)`` / ``signal=16``;
* ``flows-sospf`` / ``zuko-sospf``: sum-of-squares polynomials of degree 4, 3 squares;
  ``flows-sospf-knee``: ours with ``knee=1`` (clips that leave ``[-1, 1]`` to the polynomials, for
  smooth data: chosen on the validation split of moons, seed 2, among knees 1, 2, 3);
* ``flows-bpf`` / ``zuko-bpf``: Bernstein polynomials of degree 16.

Data (``--data``): two moons (noise 0.05, 4000 train / 1000 validation / 1000 test) and the 8×8
digits (the library's 1293 / 144 / 360 split, dequantised once with uniform noise, divided by 17),
both standardised with the training statistics; float32, one thread, Adam lr 1e-3, batch 256.

Protocol: every contender has the same two candidate sizes per data set (``GRID``: MADE widths and
number of autoregressive layers). Every (contender, candidate) trains for ``--budget`` seconds of
its own step time; steps are interleaved in turns (the run with the least training time so far
goes next; a turn is ``--turn`` seconds of steps), so that load from other processes hits all
alike. Each contender's candidate is **chosen on the validation split**; only the chosen one is
evaluated on the test split (once). Reported: test NLL (nats, ± its standard error over the test
rows), the chosen candidate, steps, median step time, median time to draw ``--samples`` samples
(``--repeats``), and the step time relative to the zuko contender of the same family (of the
chosen sizes, which may differ, and at each size).

    python benchmarks/monotone.py --budget 15 --data moons
    python benchmarks/monotone.py --budget 20 --data digits --samples 20 --repeats 1
    python benchmarks/monotone.py --budget 1 --data moons --contenders flows-naf flows-bpf   # smoke

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
    "flows-sospf-knee",
    "zuko-sospf",
    "flows-bpf",
    "zuko-bpf",
)
DATA = ("moons", "digits")
GRID = {  # candidate -> (autoregressive layers, MADE hidden widths), the same for every contender
    "moons": {"3x64": (3, (64, 64)), "5x128": (5, (128, 128))},
    "digits": {"3x128": (3, (128, 128)), "5x256": (5, (256, 256))},
}


def _moons(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import sklearn.datasets

    x, _ = sklearn.datasets.make_moons(6000, noise=0.05, random_state=seed)
    x = torch.from_numpy(x).float()
    train, val, test = x[:4000], x[4000:5000], x[5000:]
    mean, std = train.mean(0), train.std(0)
    return (train - mean) / std, (val - mean) / std, (test - mean) / std


def _digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flows.data import load_dataset

    ds = load_dataset("digits")
    g = torch.Generator().manual_seed(seed)
    parts = [(part.float() + torch.rand(part.shape, generator=g)) / 17 for part in (ds.train, ds.val, ds.test)]
    mean, std = parts[0].mean(0), parts[0].std(0).clamp_min(1e-3)
    return tuple((part - mean) / std for part in parts)


def _ours(
    name: str, features: int, transforms: int, hidden: tuple[int, ...]
) -> tuple[torch.nn.Module, Callable, Callable]:
    import flows

    options = {
        "naf": (flows.NAF, {"sigmoids": 16}),
        "unaf": (flows.UNAF, {"embedding": 16, "integrand": (64, 64)}),
        "sospf": (flows.SOSPF, {"degree": 4, "squares": 3}),
        "sospf-knee": (flows.SOSPF, {"degree": 4, "squares": 3, "knee": 1.0}),
        "bpf": (flows.BPF, {"degree": 16}),
    }
    cls, extra = options[name]
    model = cls(features, transforms=transforms, hidden=hidden, **extra)
    return model, model.log_prob, lambda n: model.sample((n,))


def _zuko(
    name: str, features: int, transforms: int, hidden: tuple[int, ...]
) -> tuple[torch.nn.Module, Callable, Callable]:
    import zuko

    options = {
        "naf": (zuko.flows.NAF, {"signal": 16}),
        "unaf": (zuko.flows.UNAF, {"signal": 16}),
        "sospf": (zuko.flows.SOSPF, {"degree": 4, "polynomials": 3}),
        "bpf": (zuko.flows.BPF, {"degree": 16}),
    }
    cls, extra = options[name]
    model = cls(features, transforms=transforms, hidden_features=hidden, **extra)
    return model, lambda x: model().log_prob(x), lambda n: model().sample((n,))


def _make(contender: str, features: int, transforms: int, hidden: tuple[int, ...]):
    library, family = contender.split("-", 1)
    return (_ours if library == "flows" else _zuko)(family, features, transforms, hidden)


class _Run:
    """One contender's model, optimiser, data stream and measurements."""

    def __init__(
        self,
        contender: str,
        candidate: str,
        size: tuple,
        train: torch.Tensor,
        seed: int,
        batch: int,
        samples: int,
        repeats: int = 3,
    ) -> None:
        torch.manual_seed(seed)
        self.name, self.candidate = contender, candidate
        self.model, self.log_prob, self.sample = _make(contender, train.shape[1], *size)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.train, self.batch = train, batch
        self.generator = torch.Generator().manual_seed(seed)
        self.step_times: list[float] = []
        self.spent = 0.0
        self.sample_size, self.repeats = samples, repeats

    def steps(self, seconds: float) -> None:
        """Train for one turn: steps until ``seconds`` more of step time are spent (at least one step)."""
        self.model.train()
        until = self.spent + seconds
        while self.spent < until:
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
    def nll(self, rows: torch.Tensor) -> tuple[float, float]:
        """Mean negative log-likelihood of ``rows`` and its standard error."""
        self.model.eval()
        lp = self.log_prob(rows)
        return float(-lp.mean()), float(lp.std() / len(lp) ** 0.5)

    @torch.no_grad()
    def evaluate(self, test: torch.Tensor) -> dict[str, float]:
        nll, se = self.nll(test)
        sampling, failure = [], ""
        for _ in range(self.repeats):
            start = time.perf_counter()
            try:
                self.sample(self.sample_size)
            except Exception as error:  # a failed inverse is a result to report, not a crash of the table
                failure = f"sampling failed: {type(error).__name__}: {str(error)[:100]}"
                sampling.append(float("nan"))
                break
            sampling.append(time.perf_counter() - start)
        return {
            "failure": failure,
            "candidate": self.candidate,
            "nll": nll,
            "se": se,
            "steps": len(self.step_times),
            "step_ms": 1e3 * statistics.median(self.step_times),
            "sample_ms": 1e3 * statistics.median(sampling),
        }


def _benchmark(data: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Train every (contender, candidate) interleaved, choose on validation, test the choice once."""
    train, val, test = (_moons if data == "moons" else _digits)(args.seed)
    runs = [
        _Run(c, name, size, train, args.seed, args.batch, args.samples, args.repeats)
        for c in args.contenders
        for name, size in GRID[data].items()
    ]
    while True:
        active = [r for r in runs if r.spent < args.budget]
        if not active:
            break
        min(active, key=lambda r: r.spent).steps(args.turn)
    results = {}
    for contender in args.contenders:
        mine = [r for r in runs if r.name == contender]
        scores = {r.candidate: r.nll(val)[0] for r in mine}
        best = min(mine, key=lambda r: scores[r.candidate])
        results[contender] = best.evaluate(test) | {"val": scores}
    print(f"{data}, {args.budget:g} s of training per run, 1 thread, batch {args.batch}, seed {args.seed}")
    head = f"{'contender':<16} {'test NLL':>18} {'chosen':>7} {'steps':>6} {'step ms':>8} {'vs zuko':>8}"
    print(f"{head} {'sample ms':>10}  validation NLL per candidate")
    for name, r in results.items():
        peer = results.get(f"zuko-{name.split('-')[1]}")  # flows-sospf-knee is measured against zuko-sospf
        ratio = f"{r['step_ms'] / peer['step_ms']:.2f}x" if peer and not name.startswith("zuko") else ""
        r["step_vs_zuko"] = r["step_ms"] / peer["step_ms"] if ratio else float("nan")
        nll = f"{r['nll']:.3f} ± {r['se']:.3f}"
        val_text = ", ".join(f"{k} {v:.3f}" for k, v in r["val"].items())
        line = f"{name:<16} {nll:>18} {r['candidate']:>7} {r['steps']:>6} {r['step_ms']:>8.2f} {ratio:>8}"
        print(f"{line} {r['sample_ms']:>10.1f}  {val_text}  {r['failure']}".rstrip())
    _same_size_ratios(runs, results)
    return results


def _same_size_ratios(runs: list[_Run], results: dict[str, dict]) -> None:
    """Median step time of each of ours against zuko's of the same family at the same size (printed, and stored)."""
    median = {(r.name, r.candidate): statistics.median(r.step_times) for r in runs}
    for name, r in results.items():
        peer = f"zuko-{name.split('-')[1]}"
        if name.startswith("zuko") or peer not in results:
            continue
        by_size = {size: median[(name, size)] / median[(peer, size)] for (n, size) in median if n == name}
        r["step_vs_zuko_by_size"] = by_size
        print(
            f"{name}: step time vs {peer} at the same size: " + ", ".join(f"{k} {v:.2f}x" for k, v in by_size.items())
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=30.0, help="training seconds per (contender, candidate)")
    parser.add_argument("--turn", type=float, default=1.0, help="seconds of training per interleaved turn")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=1000, help="draws timed for the sampling column")
    parser.add_argument("--repeats", type=int, default=3, help="timed sampling repeats (the median is reported)")
    parser.add_argument("--data", nargs="+", default=list(DATA), choices=DATA)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return {data: _benchmark(data, args) for data in args.data}


if __name__ == "__main__":
    main()
