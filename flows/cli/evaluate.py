"""``flows eval``: a run's test log-likelihood (and bits per dimension for images)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from flows.cli._common import _verify_fingerprint

if TYPE_CHECKING:
    import torch

__all__ = ["eval", "load_run_model"]


def _model_source(run: Path) -> Path:
    """The file that holds a run's model: a run directory's model file, else its training checkpoint."""
    if not run.exists() and not run.with_suffix(".safetensors").exists():
        raise FileNotFoundError(f"no run directory or model file at {str(run)!r}")
    if not run.is_dir() and run.is_file() and run.suffix not in (".safetensors", ".json", ".ckpt"):
        raise ValueError(
            f"expected a run directory, a model file (.safetensors or .json) or a training checkpoint (.ckpt), "
            f"got the file {str(run)!r}"
        )
    if not run.is_dir():
        return run
    for name in ("model.safetensors", "model.json", "checkpoint.ckpt"):
        if (run / name).exists():
            return run / ("model.safetensors" if name == "model.json" else name)  # load_model names what lacks
    raise FileNotFoundError(
        f"no model.safetensors or checkpoint.ckpt in {str(run)!r}: is it a flows fit run directory?"
    )


def load_run_model(args: argparse.Namespace, command: str, *, refuse: bool = True) -> tuple[torch.nn.Module, object]:
    """The model of ``args.run`` and its data set, both from one verified file.

    A run directory's ``model.safetensors`` (or a ``.safetensors``/``.json`` path) and a training
    checkpoint (``checkpoint.ckpt`` of a run that has no model file yet, or a ``.ckpt`` path) are read
    with :func:`flows.load_model`, which verifies them; the data set and its fingerprint come from
    the same file (the model config's ``info``, or the checkpoint header's). A changed data set is
    refused (``refuse``, unless ``--allow-changed-data``) or warned about.
    """
    from flows.data.dataset import data_fingerprint, load_dataset
    from flows.model_file import load_model, read_model_config
    from flows.train import read_checkpoint_header

    source = _model_source(Path(args.run))
    model = load_model(source)
    header = read_checkpoint_header(source) if source.suffix == ".ckpt" else read_model_config(source)
    info = header.get("info") or {}
    spec = info.get("data") if isinstance(info, dict) else None
    if spec is None:
        return model, None
    spec = dict(spec)
    if getattr(args, "data_dir", None) is not None:
        spec["data_dir"] = str(args.data_dir)
    data = load_dataset(**spec)
    refuse = refuse and not getattr(args, "allow_changed_data", False)
    how = f"pass --allow-changed-data to {command} on it anyway"
    _verify_fingerprint(info, data_fingerprint(data), args.run, command, refuse=refuse, how=how)
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
