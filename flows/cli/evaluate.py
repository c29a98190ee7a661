"""``flows eval``: a run's test log-likelihood (and bits per dimension for images), or its Bayes accuracy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from flows.cli._common import _class_index, _num_classes, _verify_fingerprint

if TYPE_CHECKING:
    import torch

__all__ = ["bayes_accuracy", "eval", "load_run_model"]


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
    """``flows eval RUN``: print the run's test log-likelihood (and bits/dim for images), or its accuracy; returns 0.

    For a class-conditional run (``flows fit --labels``) the log-likelihood is the conditional one,
    ``log p(x|y)`` given the split's labels; ``--classify`` prints the Bayes-rule accuracy instead.
    """
    from flows.train.runs import evaluate_log_likelihood

    model, data = load_run_model(args, "eval")
    if getattr(args, "classify", False) and not _num_classes(model):
        raise ValueError(
            f"--classify: expected a run of a class-conditional flow (flows fit --labels), got {str(args.run)!r}, "
            "whose model has no classes"
        )
    if data is None:
        raise ValueError(
            f"{str(args.run)!r} does not say which data it was trained on; evaluate it with flows.train.runs"
        )
    x = getattr(data, args.split)
    if x is None:
        raise ValueError(f"the data set {data.name!r} has no {args.split} split")
    labels = data.labels_of(args.split) if _num_classes(model) else None
    draws = getattr(args, "draws", None)
    if getattr(args, "classify", False):
        if draws is not None:
            raise ValueError(
                f"--draws {draws}: expected it without --classify (the accuracy scores one dequantization draw, "
                "the first of eval's), got both"
            )
        return _print_accuracy(args, model, data, x, labels)
    draws = 10 if draws is None else draws
    context = None if labels is None else _class_index(model, labels)
    if context is None and getattr(model, "context_features", None):
        raise ValueError(
            f"expected a run whose data gives the model its context, got {str(args.run)!r}: a conditional model "
            f"({model.context_features} context features) whose data spec has no labels for the {args.split} split; "
            "evaluate it with flows.train.runs.evaluate_log_likelihood(model, x, context=...)"
        )
    result = evaluate_log_likelihood(model, x, levels=data.levels, draws=draws, context=context)
    given = ""
    if context is not None:
        result["conditional"] = True
        given = " (conditional, log p(x|y))"
    if args.json:
        print(json.dumps(result))
    else:
        ll, se, n = result["log_likelihood"], result["stderr"], result["n"]
        print(f"{args.split} log-likelihood{given}: {ll:.4f} ± {se:.4f} nats ({n} samples)")
        if "bits_per_dim" in result:
            print(f"{args.split} bits/dim{given}: {result['bits_per_dim']:.4f}  ({data.levels} levels, {draws} draws)")
    return 0


def _print_accuracy(args: argparse.Namespace, model: torch.nn.Module, data, x: torch.Tensor, labels) -> int:
    """``flows eval --classify``: print the Bayes-rule accuracy on the split (one line, or JSON); returns 0."""
    if labels is None:
        raise ValueError(
            f"--classify: expected a run trained on labelled data (flows fit --labels), got {str(args.run)!r}, "
            f"whose data spec has no labels for the {data.name!r} {args.split} split"
        )
    classes = _num_classes(model)
    accuracy = bayes_accuracy(model, x, labels, classes, levels=data.levels)
    n = len(labels)
    if args.json:
        print(json.dumps({"accuracy": accuracy, "n": n, "num_classes": classes, "rule": "bayes"}))
    else:
        print(f"{args.split} accuracy: {accuracy:.3f} ({n} samples, {classes} classes, Bayes rule)")
    return 0


def bayes_accuracy(
    model: torch.nn.Module,
    x: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    *,
    levels: int | None = None,
    seed: int = 0,
    batch_size: int = 512,
) -> float:
    """The fraction of ``x`` that :func:`flows.classify.bayes_classifier` (uniform prior) puts in its class.

    Integer data (``levels``) is dequantized once, as :func:`flows.train.runs.evaluate_log_likelihood`
    does its first draw (uniform noise from ``seed``, in float64, then the model's dtype); a model
    that records a ``noise_std`` scores its inputs noised alike (``noise_std="model"``, noise from
    ``seed`` too).
    """
    import torch

    from flows.classify import bayes_classifier
    from flows.data.dequantization import uniform_dequantize
    from flows.flow import evaluating

    anchor = next(iter(model.parameters()))
    generator = torch.Generator().manual_seed(seed)
    if levels is not None:
        x = uniform_dequantize(x, levels, generator=generator, dtype=torch.float64)
    x = x.to(anchor.device, anchor.dtype)
    noise = "model" if getattr(model, "noise_std", None) else None
    correct = 0
    with evaluating(model), torch.no_grad():
        for start in range(0, len(x), batch_size):
            chunk = x[start : start + batch_size]
            log_posterior = bayes_classifier(model, chunk, num_classes, noise_std=noise, generator=generator)
            predicted = log_posterior.argmax(-1).cpu()
            correct += int((predicted == labels[start : start + batch_size]).sum())
    return correct / len(labels)
