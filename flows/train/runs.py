"""Run directories: what ``flows fit`` leaves behind and what ``flows eval/sample/check`` read back.

A run directory holds::

    run.json          data spec, model config, fit settings, final test metrics
    model.safetensors/json  the trained model (best weights) as a model file (:func:`flows.load_model`),
                      with the data spec in its config's ``info``
    checkpoint.ckpt   the resumable training state (``flows fit ... --resume``), with the same model config
    metrics.json/csv  the per-epoch history
    *.png             training curves and pictures of samples
    tensorboard/      TensorBoard scalars, when ``tensorboard`` is installed

:data:`RUN_FILES` names every entry ``flows fit`` writes there: those names are what a run owns.
``flows fit`` refuses a directory that holds any of them before it trains (a user's own
``metrics.csv`` or ``model.json`` is never replaced silently), and ``--overwrite`` removes all of
them first, so a run that fails midway never leaves the old run's model next to its own files.

The data spec is the set of :func:`flows.data.load_dataset` arguments, so the same splits come
back. :func:`model_for_data` builds a registered builder for a data set, with the preprocessing
that makes ``log_prob`` refer to the raw data: a logit layer for dequantized integer data, a
:class:`~flows.bijections.Standardize` fitted on the training split for continuous data.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from flows.bijections.elementwise import Logit
from flows.bijections.standardize import Standardize
from flows.data.dataset import Dataset
from flows.data.dequantization import uniform_dequantize
from flows.flow import evaluating
from flows.metrics.density import bits_per_dim
from flows.train._atomic import atomic_write_text

__all__ = [
    "REFUSED_POLICIES",
    "RESUME_POLICIES",
    "RUN_FILES",
    "check_same_run",
    "evaluate_log_likelihood",
    "json_number",
    "model_for_data",
    "read_run_file",
    "remove_run_files",
    "resume_changes",
    "run_files_in",
    "write_run_file",
]

#: Every entry a ``flows fit`` run writes in its directory (the pictures by data kind: an image grid, 2-D density
#: contours or a corner plot), and what it holds. These are the names a run owns; the lock file
#: (``.checkpoint.ckpt.lock``) and the temporaries of atomic writes (``.<name>.<random>.tmp``) derive from them.
RUN_FILES: dict[str, str] = {
    "run.json": "data spec, model config, fit settings, final test metrics",
    "checkpoint.ckpt": "the resumable training state",
    "model.safetensors": "the trained model's weights (model file, best weights)",
    "model.json": "the trained model's configuration (model file)",
    "metrics.json": "the per-epoch history",
    "metrics.csv": "the per-epoch history",
    "curves.png": "training curves",
    "samples.png": "an image grid of samples (image data)",
    "density.png": "density contours (2-D data)",
    "corner.png": "a corner plot of samples against the data (other data)",
    "tensorboard": "TensorBoard scalars (a directory, when tensorboard is installed)",
}


#: What ``flows fit --resume`` does with a setting whose value differs from the run's. Every flag of ``flows fit``
#: has one (the table :data:`flows.cli.fit_flags.FIT_FLAGS`); a resume never silently trains a different run.
RESUME_POLICIES: dict[str, str] = {
    "data": "refused: part of the data spec (run.json 'data'), compared as a whole",
    "model": "refused: part of the model config (run.json 'config'), compared as a whole",
    "refuse": "refused: a training setting (run.json 'fit'), compared on its own",
    "record": "may change (a stopping rule): the change is recorded in run.json 'resumes' and the history",
    "free": "may change: it changes only how the run executes",
}

#: The policies under which a resume refuses a changed setting.
REFUSED_POLICIES = ("data", "model", "refuse")


def json_number(value: object) -> object:
    """``value``, with a non-finite float as its string (``"inf"``), which JSON headers cannot hold."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def check_same_run(header: dict[str, Any], config: dict[str, Any], spec: dict[str, Any], where: Path) -> None:
    """Refuse to resume the checkpoint of ``header`` with another model config or data spec (``model``, ``data``).

    Raises:
        ValueError: naming the settings that differ, the run's and this command's.
    """
    for what, now, before in (
        ("model", config, header.get("config")),
        ("data", spec, (header.get("info") or {}).get("data")),
    ):
        if json.dumps(now, sort_keys=True) != json.dumps(before, sort_keys=True):
            raise ValueError(
                f"--resume: the {what} settings differ from the run in {str(where)!r}: it has {before}, "
                f"this command asks for {now}; repeat the original command (see run.json) with --resume"
            )


def resume_changes(
    before: dict[str, Any], now: dict[str, Any], policy: dict[str, str], where: Path
) -> dict[str, list[object]]:
    """The settings of a resume that differ from the run's, ``{name: [the run's, this command's]}``.

    Settings the run did not record (older runs) are not compared.

    Raises:
        ValueError: when a setting of policy ``refuse`` differs, listing each (``--lr 0.01 (the run has 0.002)``).
    """
    changed = {k: [before[k], new] for k, new in now.items() if k in before and before[k] != new}
    refused = [
        f"--{k.replace('_', '-')} {new} (the run has {old})"
        for k, (old, new) in changed.items()
        if policy.get(k) == "refuse"
    ]
    if refused:
        recorded = " and ".join("--" + k.replace("_", "-") for k, p in policy.items() if p == "record")
        raise ValueError(
            f"--resume: expected the settings of the run in {str(where)!r}, got {', '.join(refused)}; repeat the "
            f"original command (see run.json) with --resume (only {recorded} may change), "
            "or start afresh with --overwrite"
        )
    return changed


def model_for_data(
    data: Dataset,
    builder: str = "RealNVP",
    *,
    standardize: bool = True,
    logit_alpha: float = 0.05,
    **options: Any,
) -> nn.Module:
    """Build ``builder`` (a name of :func:`flows.architectures.registry.builders`) for a data set, preprocessing inside.

    Integer data with ``levels`` gets a ``Logit(alpha)`` layer (the dequantized values lie in
    ``[0, 1)``); continuous data gets a :class:`~flows.bijections.Standardize` layer with the
    training split's statistics (``standardize=False`` to skip it). Either way ``log_prob`` is the
    density of the raw (dequantized) data, preprocessing log-determinant included. The flow records
    its preprocessing, so :func:`flows.model_file.describe_model` and :func:`flows.save_model`
    describe it whole.

    Example:
        >>> from flows.data import load_dataset
        >>> data = load_dataset("iris")
        >>> model = model_for_data(data, "RealNVP", transforms=2, hidden=[16])
        >>> [p["layer"] for p in model.preprocessing], model.log_prob(data.test).shape
        (['Standardize'], torch.Size([30]))
    """
    from flows.architectures.registry import get

    model = get(builder)(data.features, **options)
    if data.levels is not None:
        model.prepend(Logit(model.event_shape, alpha=logit_alpha), options=[{"alpha": logit_alpha}])
    elif standardize:
        fitted = Standardize.fit(data.train.reshape(len(data.train), -1))
        layer = Standardize(model.event_shape)
        layer.loc.copy_(fitted.loc.reshape(layer.loc.shape))
        layer.scale.copy_(fitted.scale.reshape(layer.scale.shape))
        model.prepend(layer, options=[{}])
    return model


def run_files_in(directory: str | os.PathLike) -> list[Path]:
    """The entries of :data:`RUN_FILES` that exist in ``directory`` (files, directories or links)."""
    directory = Path(directory)
    return [directory / name for name in RUN_FILES if os.path.lexists(directory / name)]


def remove_run_files(directory: str | os.PathLike) -> list[Path]:
    """Delete every entry of :data:`RUN_FILES` in ``directory`` and the temporaries their atomic writes left.

    Nothing else in the directory is touched. Returns the paths removed.
    """
    import shutil

    from flows.train._atomic import remove_stale_temporaries

    removed = []
    for path in run_files_in(directory):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path)
    for name in RUN_FILES:
        removed += remove_stale_temporaries(directory, name)
    return removed


def write_run_file(directory: str | os.PathLike, content: dict[str, Any]) -> Path:
    """Write ``run.json`` atomically."""
    return atomic_write_text(Path(directory) / "run.json", json.dumps(content, indent=1, default=str) + "\n")


def read_run_file(directory: str | os.PathLike) -> dict[str, Any]:
    """Read ``run.json`` (an empty dict when there is none)."""
    path = Path(directory) / "run.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@torch.no_grad()
def evaluate_log_likelihood(
    model: nn.Module,
    x: Tensor,
    *,
    levels: int | None = None,
    draws: int = 1,
    batch_size: int = 1024,
    seed: int = 0,
    context: Tensor | None = None,
) -> dict[str, float]:
    """Average test log-likelihood (nats) with its standard error, and bits/dim for dequantized data.

    For integer data (``levels``) every sample is dequantized ``draws`` times with noise from
    ``seed`` and the log-likelihoods are averaged over draws (the dequantization bound). With
    ``context`` (one row per sample, e.g. a class-conditional flow's class index) it is the
    conditional log-likelihood ``log p(x | c)``.

    Returns:
        ``{"log_likelihood", "stderr", "n"}`` plus ``"bits_per_dim"`` with ``levels``.
    """
    if context is not None and len(context) != len(x):
        raise ValueError(f"evaluate_log_likelihood: expected one context row per sample ({len(x)}), got {len(context)}")
    anchor = next(iter(model.parameters()))
    generator = torch.Generator().manual_seed(seed)
    per_sample = torch.zeros(len(x), dtype=torch.float64)
    with evaluating(model):
        for _ in range(draws if levels is not None else 1):
            for start in range(0, len(x), batch_size):
                chunk = x[start : start + batch_size]
                if levels is not None:
                    chunk = uniform_dequantize(chunk, levels, generator=generator, dtype=torch.float64)
                chunk = chunk.to(anchor.device, anchor.dtype)
                if context is None:
                    log_p = model.log_prob(chunk)
                else:
                    log_p = model.log_prob(chunk, context[start : start + len(chunk)].to(anchor.device, anchor.dtype))
                per_sample[start : start + len(chunk)] += log_p.double().cpu()
    per_sample /= draws if levels is not None else 1
    n = len(per_sample)
    result = {
        "log_likelihood": float(per_sample.mean()),
        "stderr": float(per_sample.std() / math.sqrt(n)) if n > 1 else math.nan,
        "n": n,
    }
    if levels is not None:
        dims = math.prod(x.shape[1:])
        result["bits_per_dim"] = float(bits_per_dim(per_sample.mean(), dims, levels))
    return result
