"""``flows eval``: a run's test log-likelihood (and bits per dimension for images)."""

from __future__ import annotations

import argparse
import json

from flows.cli._common import _check_run_data

__all__ = ["eval"]


def eval(args: argparse.Namespace) -> int:
    """``flows eval RUN``: print the run's test log-likelihood (and bits/dim for images); returns 0."""
    from flows.train.runs import evaluate_log_likelihood, load_run

    model, data = load_run(args.run, data_dir=args.data_dir)
    if data is None:
        raise ValueError(
            f"{str(args.run)!r} does not say which data it was trained on; evaluate it with flows.train.runs"
        )
    _check_run_data(args, data, "eval")
    x = getattr(data, args.split)
    if x is None:
        raise ValueError(f"the data set {data.name!r} has no {args.split} split")
    result = evaluate_log_likelihood(model, x, levels=data.levels, draws=args.draws)
    if args.json:
        print(json.dumps(result))
    else:
        ll, se, n = result["log_likelihood"], result["stderr"], result["n"]
        print(f"{args.split} log-likelihood: {ll:.4f} ± {se:.4f} nats ({n} samples)")
        if "bits_per_dim" in result:
            print(f"{args.split} bits/dim: {result['bits_per_dim']:.4f}  ({data.levels} levels, {args.draws} draws)")
    return 0
