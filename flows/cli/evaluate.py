"""``flows eval``: a run's test log-likelihood (and bits per dimension for images)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from flows.cli._common import _check_run_data, _verify_fingerprint

if TYPE_CHECKING:
    import torch

__all__ = ["eval", "load_run_model"]


def _has_model_file(run: Path) -> bool:
    if run.is_dir():
        return (run / "model.safetensors").exists() or (run / "model.json").exists()
    return run.suffix in (".safetensors", ".json")


def load_run_model(args: argparse.Namespace, command: str) -> tuple[torch.nn.Module, object]:
    """The model of ``args.run`` and its data set, from the one verified model file when the run has one.

    A run directory with ``model.safetensors`` (or a ``.safetensors``/``.json`` path) is read with
    :func:`flows.load_model`, which verifies the file's digests and refuses a ``model.json`` that
    differs from it; the data set and its fingerprint come from the same file. A ``.ckpt`` path,
    or a run directory written before model files existed, is read from its checkpoint.
    """
    run = Path(args.run)
    if not _has_model_file(run):
        from flows.train.runs import load_run

        model, data = load_run(run, data_dir=args.data_dir)
        if data is not None:
            _check_run_data(args, data, command)
        return model, data
    from flows.data.dataset import data_fingerprint, load_dataset
    from flows.model_file import load_model, read_model_config

    model = load_model(run)
    info = read_model_config(run).get("info") or {}
    spec = info.get("data") if isinstance(info, dict) else None
    if spec is None:
        return model, None
    spec = dict(spec)
    if args.data_dir is not None:
        spec["data_dir"] = str(args.data_dir)
    data = load_dataset(**spec)
    refuse = not getattr(args, "allow_changed_data", False)
    how = f"pass --allow-changed-data to {command} on it anyway"
    _verify_fingerprint(info, data_fingerprint(data), run, command, refuse=refuse, how=how)
    return model, data


def eval(args: argparse.Namespace) -> int:
    """``flows eval RUN``: print the run's test log-likelihood (and bits/dim for images); returns 0."""
    from flows.train.runs import evaluate_log_likelihood

    model, data = load_run_model(args, "eval")
    if data is None:
        raise ValueError(
            f"{str(args.run)!r} does not say which data it was trained on; evaluate it with flows.train.runs"
        )
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
