"""TarFlow on tables against NSF at equal training time: digits as vectors and MiniBooNE-small.

A transformer autoregressive flow (:class:`flows.TarFlow`, Zhai et al. 2024, arXiv:2412.06329)
treats each feature (or each group of ``--token-features`` features) of a table row as a token;
NSF (Durkan et al. 2019, arXiv:1906.04032) is the library's strongest tabular flow. Both are built
by :func:`flows.train.runs.model_for_data` (the same preprocessing: a ``Logit`` layer for the
integer digits, a ``Standardize`` layer for MiniBooNE), trained by Adam on the same batches in
interleaved rounds of ``--round`` seconds, each until its own training time reaches ``--budget``
seconds, one thread. After every round the validation split is scored and the best round's
parameters are kept; the test figure is computed once, at the end, from them.

* ``digits``: scikit-learn's 8×8 digits as 64-dimensional vectors (17 grey levels, uniformly
  dequantised), test **bits/dim** (10 dequantisation draws, lower is better).
* ``miniboone``: MiniBooNE-small (trained on the MAF paper's validation split, **not comparable to
  published numbers**), test **log-likelihood** in nats (higher is better).

    FLOWS_DATA_DIR=../shared/data python benchmarks/tarflow_tables.py               # both, 120 s each
    python benchmarks/tarflow_tables.py --data digits --budget 20
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics

import _harness
import torch
from _harness import Contender, print_table, test_bits_per_dim

import flows
from flows.data import load_dataset, uniform_dequantize
from flows.train.runs import model_for_data


def contenders(data, args: argparse.Namespace) -> dict[str, Contender]:
    """TarFlow and NSF for ``data``, seeded alike."""
    options = {
        "TarFlow": {
            "transforms": args.tarflow_transforms,
            "hidden": (args.tarflow_width,) * args.tarflow_layers,
            "token_features": args.token_features,
        },
        "NSF": {"transforms": args.nsf_transforms, "hidden": tuple(args.nsf_hidden)},
    }
    out = {}
    for name, kwargs in options.items():
        torch.manual_seed(args.seed)
        out[name] = Contender(name, model_for_data(data, name, **kwargs), lr=args.lr)
    return out


@torch.no_grad()
def score(model: torch.nn.Module, rows: torch.Tensor, levels: int | None, draws: int) -> float:
    """Bits/dim (integer data) or the mean log-likelihood in nats (continuous data)."""
    if levels is not None:
        return test_bits_per_dim(model, rows, levels=levels, draws=draws)
    with flows.evaluating(model):
        return float(torch.cat([model.log_prob(batch) for batch in rows.split(1024)]).mean())


def batches(rows: torch.Tensor, batch_size: int, levels: int | None, generator: torch.Generator):
    """Shuffled mini-batches, epoch after epoch (dequantised for integer data)."""
    while True:
        order = torch.randperm(len(rows), generator=generator)
        for i in range(0, len(rows), batch_size):
            x = rows[order[i : i + batch_size]]
            yield uniform_dequantize(x, levels, generator=generator) if levels is not None else x


def train_round(contender: Contender, stream, seconds: float) -> int:
    """Steps of ``contender`` until its training time grows by ``seconds``; the number of steps."""
    contender.model.train()
    end, steps = sum(contender.step_times) + seconds, 0
    while sum(contender.step_times) < end:
        contender.step(next(stream))
        steps += 1
    return steps


def run(name: str, args: argparse.Namespace) -> list[dict[str, object]]:
    """Train both contenders on data set ``name`` at equal time; their result rows."""
    data = load_dataset(name, data_dir=args.data_dir)
    better = min if data.levels is not None else max
    racers = contenders(data, args)
    streams = {
        n: batches(data.train, args.batch_size, data.levels, torch.Generator().manual_seed(args.seed)) for n in racers
    }
    best = {n: (math.inf if better is min else -math.inf, None, 0) for n in racers}
    steps = dict.fromkeys(racers, 0)
    while any(sum(c.step_times) < args.budget for c in racers.values()):
        for n, c in racers.items():
            left = args.budget - sum(c.step_times)
            if left <= 0:
                continue
            steps[n] += train_round(c, streams[n], min(args.round, left))
            value = score(c.model, data.val, data.levels, draws=1)
            if math.isfinite(value) and better(value, best[n][0]) == value:
                best[n] = (value, copy.deepcopy(c.model.state_dict()), steps[n])
    rows = []
    for n, c in racers.items():
        value, state, step = best[n]
        if state is not None:
            c.model.load_state_dict(state)
        test = score(c.model, data.test, data.levels, draws=10) if state is not None else math.nan
        rows.append(
            {
                "data": name,
                "model": n,
                "parameters": c.parameters,
                "test": test,
                "val": value,
                "best_step": step,
                "steps": steps[n],
                "epochs": steps[n] * args.batch_size / len(data.train),
                "seconds": sum(c.step_times),
                "step_ms": 1e3 * statistics.median(c.step_times),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    p = _harness.parser(__doc__, budget=120.0)
    p.add_argument("--data", nargs="+", default=["digits", "miniboone"], choices=["digits", "miniboone"])
    p.add_argument("--data-dir", default=None, help="holds miniboone_maf_valtest.npz (default: FLOWS_DATA_DIR)")
    p.add_argument("--round", type=float, default=10.0, help="training seconds between validations (default 10)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tarflow-transforms", type=int, default=4)
    p.add_argument("--tarflow-width", type=int, default=64)
    p.add_argument("--tarflow-layers", type=int, default=2)
    p.add_argument("--token-features", type=int, default=1, help="features per TarFlow token (default 1)")
    p.add_argument("--nsf-transforms", type=int, default=5)
    p.add_argument("--nsf-hidden", type=int, nargs="+", default=[128, 128])
    args = _harness.setup(p.parse_args(argv))
    rows = [row for name in args.data for row in run(name, args)]
    print(
        f"TarFlow vs NSF on tables, {args.budget:g} s of training each, batch {args.batch_size}, Adam lr {args.lr:g}, "
        f"{torch.get_num_threads()} thread(s), interleaved rounds of {args.round:g} s; best validation round kept "
        "(digits: bits/dim, lower is better; miniboone: log-likelihood in nats, higher is better, "
        "NOT comparable to published numbers)"
    )
    print_table(
        rows,
        [
            ("data", "data", "s"),
            ("model", "model", "s"),
            ("parameters", "parameters", ",d"),
            ("test", "test", ".3f"),
            ("val", "best val", ".3f"),
            ("best_step", "best step", "d"),
            ("steps", "steps", "d"),
            ("epochs", "epochs", ".1f"),
            ("seconds", "train s", ".1f"),
            ("step_ms", "median step ms", ".1f"),
        ],
    )
    return rows


if __name__ == "__main__":
    main()
