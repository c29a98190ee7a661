"""The commands behind ``flows fit/eval/sample/check/models`` (argument parsing lives in :mod:`flows.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from flows.train.history import History

__all__ = ["check", "eval", "fit", "models", "sample"]


def _pictures(model: torch.nn.Module, data, directory: Path, name: str = "samples", n: int = 64) -> list[Path]:
    """Pictures of samples: an image grid, 2-D density contours, or a corner plot, by data kind."""
    from flows.flow import evaluating
    from flows.plot import plot_corner, plot_density_2d, plot_image_grid

    written = []
    with evaluating(model), torch.no_grad():
        if data.image_shape is not None:
            samples = model.sample((n,))
            path = directory / f"{name}.png"
            plot_image_grid(samples, path, image_shape=data.image_shape, title=f"samples ({data.name})")
            written.append(path)
        elif data.features == 2:
            path = directory / "density.png"
            plot_density_2d(
                model,
                data.test if data.test is not None else data.train,
                path,
                title=f"density ({data.name})",
                labels=data.columns,
            )
            written.append(path)
        else:
            samples = model.sample((2000,))
            reference = data.test if data.test is not None else data.train
            path = directory / "corner.png"
            plot_corner(samples, reference[:2000], path, title=f"samples vs data ({data.name})", labels=data.columns)
            written.append(path)
    return written


class DataChanged(ValueError):
    """The data a command loaded no longer matches the fingerprint its run recorded."""


def _run_checkpoint(run: Path) -> Path:
    """The checkpoint file :func:`flows.train.runs.load_run` reads for ``run`` (a directory or a file)."""
    if run.is_dir():
        return next((c for c in (run / "model.ckpt", run / "checkpoint.ckpt") if c.is_file()), run / "model.ckpt")
    return run


def _verify_fingerprint(info: dict, now: dict, where: Path, command: str, *, refuse: bool, how: str = "") -> None:
    """Compare the data fingerprint recorded in a checkpoint's ``info`` with the data loaded now.

    Runs written before fingerprints were recorded have none and are not checked. A mismatch
    raises :class:`DataChanged` when ``refuse``, else prints a one-line warning.
    """
    recorded = info.get("data_fingerprint") if isinstance(info, dict) else None
    if not isinstance(recorded, dict) or "sha256" not in recorded or recorded["sha256"] == now["sha256"]:
        return
    message = (
        f"the data changed since the run in {str(where)!r} was trained: expected data with sha256 "
        f"{recorded['sha256'][:16]}... (recorded by the run), got {now['sha256'][:16]}..."
    )
    if recorded.get("file_sha256") and now.get("file_sha256") and recorded["file_sha256"] != now["file_sha256"]:
        message += f" (the file {now.get('file', '')!r} was modified)"
    if refuse:
        raise DataChanged(f"{message}; {how}" if how else message)
    print(f"flows {command}: warning: {message}", file=sys.stderr)


def _check_writable_directory(path: Path, what: str) -> None:
    """Fail early, before any work, when ``path`` cannot be (or become) a writable directory."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what}: expected a directory, got the file {str(path)!r}")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{what}: cannot create {str(path)!r}: {str(existing)!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{what}: cannot write to {str(path)!r}: {str(existing)!r} is not writable")


def _check_output_file(path: Path, what: str) -> None:
    """Fail early when ``path`` is a directory or lies where no file can be written."""
    if path.is_dir():
        raise IsADirectoryError(f"{what}: expected a file path, got the directory {str(path)!r}")
    _check_writable_directory(path.parent, what)


def _check_options(builder_name: str, options: list[tuple[str, object]]) -> None:
    """``--option KEY=VALUE``: the builder has the option, and the value has the option's type.

    Types are read from the builder's annotations (``float``, ``int``, ``bool``, ``str``,
    ``None``); options of other types (activations, sequences) are left to the builder.
    """
    import inspect

    from flows.train.config import _architectures

    builder = _architectures().get(builder_name)
    if builder is None:
        return
    parameters = inspect.signature(builder).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    names = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if not takes_any and not {"transforms", "hidden"} <= set(names):
        raise ValueError(
            f"--model {builder_name}: expected a builder with transforms= and hidden= options (a flow on vectors), "
            f"got one with {names}; build {builder_name} from Python"
        )
    for key, value in options:
        if key in ("transforms", "hidden"):
            raise ValueError(f"--option {key}=...: expected --{key} to set the {key}, got it as an --option")
        if key not in parameters or parameters[key].kind is not inspect.Parameter.KEYWORD_ONLY:
            if takes_any:
                continue
            raise ValueError(f"--option {key}=...: expected one of {builder_name}'s options {names}, got {key!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--option {key}={value}: expected a finite number, got {value}")
        annotation = parameters[key].annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
        kinds = {part.strip() for part in text.split("|")}
        accepted = {
            "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "bool": lambda v: isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
            "None": lambda v: v is None,
        }
        if not kinds <= set(accepted):
            if any(word in text for word in ("Callable", "type[", "Module", "Generator", "Flow")):
                raise ValueError(
                    f"--option {key}: expected a plain value (number, string, bool, null), but {builder_name} takes "
                    f"a Python object there ({text}); set {key} from Python"
                )
            continue
        if not any(accepted[k](value) for k in kinds):
            wanted = " or ".join(sorted("null" if k == "None" else k for k in kinds))
            default = parameters[key].default
            example = f" such as {key}={json.dumps(default)}" if default is not inspect.Parameter.empty else ""
            raise ValueError(f"--option {key}: expected {wanted}{example}, got {value!r}")


# `flows fit --resume` policy: flags that change the run are refused when they differ from the run's; stopping rules
# are applied and recorded (history event and run.json "resumes"); the other flags only change how it executes.
RUN_FLAGS = ("lr", "batch_size", "schedule", "clip", "patience")
STOP_FLAGS = ("epochs", "time_budget")


def fit(args: argparse.Namespace) -> int:
    """``flows fit``, holding the run directory's lock (one writer per run) around all of it on the main process."""
    from flows.train._atomic import remove_stale_temporaries
    from flows.train._lock import hold_run_lock, lock_path

    out = args.out or Path("runs") / Path(str(args.data)).stem
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and int(os.environ["RANK"]) != 0:
        return _fit(args)
    _check_writable_directory(out, "--out")  # before the lock file creates the directory
    created = not out.exists()
    try:
        with hold_run_lock(out / "checkpoint.ckpt"):
            remove_stale_temporaries(out)  # left by a killed run's atomic writes; no other writer can be here
            return _fit(args)
    except BaseException:
        lock = lock_path(out / "checkpoint.ckpt")
        if created and out.is_dir() and list(out.iterdir()) == [lock]:  # a command that failed early leaves no run
            with contextlib.suppress(OSError):
                lock.unlink()
                out.rmdir()
        raise


def _fit(args: argparse.Namespace) -> int:
    from flows.data.dataset import data_fingerprint, load_dataset
    from flows.train import (
        EarlyStopping,
        MaximumLikelihood,
        MetricsLogger,
        PrintMetrics,
        Trainer,
        read_checkpoint_header,
        save_model,
    )
    from flows.train.config import _architectures
    from flows.train.distributed import cleanup_distributed, init_distributed, is_distributed
    from flows.train.runs import evaluate_log_likelihood, model_for_data, read_run_file, write_run_file

    if args.threads < 1 or args.nproc < 1:
        raise ValueError(f"expected --threads >= 1 and --nproc >= 1, got {args.threads} and {args.nproc}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"expected a finite --lr > 0, got {args.lr}")
    torch.set_num_threads(args.threads)
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = init_distributed(seed=args.seed) if distributed else torch.device("cpu")
    main_process = not distributed or int(os.environ["RANK"]) == 0
    say = print if main_process and not args.quiet else (lambda *a, **k: None)
    out = args.out or Path("runs") / Path(str(args.data)).stem
    _check_writable_directory(out, "--out")
    checkpoint = out / "checkpoint.ckpt"
    if checkpoint.exists() and not (args.resume or args.overwrite):
        raise ValueError(
            f"{str(out)!r} already holds a run; pass --resume to continue it or --overwrite to start afresh"
        )
    if args.resume and not checkpoint.exists():
        if not (out / "run.json").is_file():
            raise FileNotFoundError(f"--resume: expected a run with a checkpoint in {str(out)!r}, got none")
        # a run stopped before its first checkpoint (written after the first epoch or 5 s) has no state to
        # continue: it starts again from the beginning, and says so
        print(
            f"flows fit: warning: --resume: the run in {str(out)!r} stopped before its first checkpoint; "
            "starting it again from the beginning",
            file=sys.stderr,
        )
        args.resume = False
    spec = {
        "name": str(args.data),
        "data_dir": args.data_dir,
        "key": args.key,
        "levels": args.levels,
        "val_fraction": args.val_fraction,
        "test_fraction": args.test_fraction,
        "seed": args.seed,
    }
    builder = _architectures().get(args.model)
    if builder is not None and not getattr(builder, "likelihood_trainable", True):
        raise ValueError(
            f"flows fit trains by maximum likelihood, which is not how {args.model} is trained; "
            "use its objective from Python (for FreeFormInjectiveFlow: "
            "flows.train.Trainer(model, flows.train.FreeFormInjectiveObjective()))"
        )
    _check_options(args.model, args.option)
    data = load_dataset(**spec)
    fingerprint = data_fingerprint(data)
    say(f"data {data.describe()}")
    torch.manual_seed(args.seed)
    options = {"transforms": args.transforms, "hidden": args.hidden, **dict(args.option)}
    model, config = model_for_data(data, args.model, standardize=not args.no_standardize, **options)
    model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model {args.model} ({n_params:,} parameters), {config['preprocessing'] or 'no'} preprocessing")
    objective = MaximumLikelihood(levels=data.levels)
    if args.objective == "fm":
        from flows.train.flow_matching import FlowMatching, flow_matching_parts

        try:
            flow_matching_parts(model)
        except TypeError as error:
            raise ValueError(
                f"--objective fm trains a continuous flow (one CNF: --model FFJORD --transforms 1), "
                f"got --model {args.model} --transforms {args.transforms}; {error}"
            ) from None
        if data.levels is not None:
            raise ValueError(f"--objective fm: expected continuous data, got integer data with {data.levels} levels")
        objective = FlowMatching(sigma=args.sigma, coupling=args.coupling)
    scheduler = None
    if args.schedule == "cosine":
        steps = max(1, args.epochs)
        scheduler = lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)  # noqa: E731
    elif args.schedule == "plateau":
        scheduler = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)  # noqa: E731
    callbacks = (
        [MetricsLogger(out), PrintMetrics(every=max(1, args.epochs // 10))] if not args.quiet else [MetricsLogger(out)]
    )
    # --patience 0 never stops early, but the model saved is still the best epoch's
    callbacks.insert(0, EarlyStopping(patience=args.patience or None))
    trainer = Trainer(
        model,
        objective,
        lr=args.lr,
        scheduler=scheduler,
        clip_grad_norm=args.clip or None,
        callbacks=callbacks,
        checkpoint=checkpoint,
        checkpoint_every=args.checkpoint_every,
        config=config,
        info={
            "data": spec,
            "data_fingerprint": fingerprint,
            "fit": {k: _json_number(getattr(args, k)) for k in RUN_FLAGS + STOP_FLAGS},
        },
        compile=args.compile,
    )
    resumes = []
    untrained = None
    if args.resume:
        untrained = read_run_file(out).get("untrained_val_loss")
        saved = read_checkpoint_header(checkpoint)
        for what, now, before in (
            ("model", config, saved.get("config")),
            ("data", spec, (saved.get("info") or {}).get("data")),
        ):
            if json.dumps(now, sort_keys=True) != json.dumps(before, sort_keys=True):
                raise ValueError(
                    f"--resume: the {what} settings differ from the run in {str(out)!r}: it has {before}, "
                    f"this command asks for {now}; repeat the original command (see run.json) with --resume"
                )
        _verify_fingerprint(saved.get("info", {}), fingerprint, checkpoint, "fit --resume", refuse=True)
        before = saved["info"].get("fit") or read_run_file(out).get("fit", {})
        changed = {k: (before[k], _json_number(getattr(args, k))) for k in RUN_FLAGS + STOP_FLAGS if k in before}
        changed = {k: v for k, v in changed.items() if v[0] != v[1]}
        refused = [
            f"--{k.replace('_', '-')} {new} (the run has {old})" for k, (old, new) in changed.items() if k in RUN_FLAGS
        ]
        if refused:
            raise ValueError(
                f"--resume: expected the settings of the run in {str(out)!r}, got {', '.join(refused)}; repeat the "
                "original command (see run.json) with --resume (only --epochs and --time-budget may change), "
                "or start afresh with --overwrite"
            )
        trainer.resume()
        record = {"step": trainer.step, "epoch": trainer.epoch, "changed": {k: list(v) for k, v in changed.items()}}
        resumes = [*read_run_file(out).get("resumes", []), record]
        note = ", ".join(f"--{k.replace('_', '-')} {new} (was {old})" for k, (old, new) in changed.items())
        trainer.history.event(trainer.step, f"resumed at epoch {trainer.epoch}" + (f" with {note}" if note else ""))
        say(f"resumed {str(out)!r} at epoch {trainer.epoch} (step {trainer.step})" + (f" with {note}" if note else ""))
    else:  # the yardstick of divergence: the untrained model's validation loss (every process evaluates)
        untrained = trainer.evaluate(data.val, batch_size=args.batch_size).get("loss")
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
        run_file = {"data": spec, "data_fingerprint": fingerprint, "config": config, "fit": _plain(vars(args))}
        run_file["untrained_val_loss"] = _json_number(untrained)
        if resumes:
            run_file["resumes"] = resumes
        write_run_file(out, run_file)
    trainer.fit(
        data.train,
        data.val,
        epochs=args.epochs,
        batch_size=args.batch_size,
        time_budget=args.time_budget,
        seed=args.seed,
    )
    if is_distributed():
        trainer.release_distributed()  # the DDP wrapper must go before the process group does
        cleanup_distributed()
    if trainer.interrupted is not None:
        if main_process:
            print(
                f"flows fit: stopped by signal {trainer.interrupted}; {str(checkpoint)!r} holds the state at step "
                f"{trainer.step}: continue with the same command and --resume",
                file=sys.stderr,
            )
        return 130
    if not main_process:
        return 0
    worse = _worse_than_untrained(trainer.history, untrained)
    if worse:
        print(
            f"flows fit: error: training diverged: {worse}; no model file was written ({str(checkpoint)!r} holds the "
            f"last training state). Lower --lr (now {args.lr:g}) or clip gradients with --clip",
            file=sys.stderr,
        )
        return 1
    model = trainer.model
    model_path = save_model(model, out / "model.ckpt", config, info={"data": spec, "data_fingerprint": fingerprint})
    model_file = _write_model_file(model, out)
    epochs = trainer.history.last().get("epoch", trainer.epoch)
    result = {"epochs": epochs, "steps": trainer.step, "train_seconds": round(trainer.elapsed, 2)}
    if data.test is not None:
        result["test"] = evaluate_log_likelihood(
            model.cpu(), data.test, levels=data.levels, draws=10 if data.levels else 1
        )
    run_file = {
        "data": spec,
        "data_fingerprint": fingerprint,
        "config": config,
        "fit": _plain(vars(args)),
        "untrained_val_loss": _json_number(untrained),
        "result": result,
    }
    if resumes:
        run_file["resumes"] = resumes
    write_run_file(out, run_file)
    written = [model_path, checkpoint, out / "metrics.json", out / "metrics.csv"]
    if not args.no_plots:
        from flows.plot import plot_history

        plot_history(trainer.history, out / "curves.png")
        written += [out / "curves.png", *_pictures(model, data, out)]
    for event in trainer.history.events:
        say(f"step {event['step']}: {event['message']}")
    if "test" in result:
        test = result["test"]
        line = f"test log-likelihood: {test['log_likelihood']:.4f} ± {test['stderr']:.4f} nats ({test['n']} samples)"
        if "bits_per_dim" in test:
            line = (
                f"test bits/dim: {test['bits_per_dim']:.3f}  ({data.levels} levels, {test['n']} test samples)\n" + line
            )
        print(line)
    files = ", ".join(str(p) for p in written)
    say(f"trained {epochs:g} epochs ({trainer.step} steps) in {trainer.elapsed:.1f} s; wrote {files}")
    if model_file is not None:
        say(f"model file: {model_file} + {model_file.with_suffix('.json').name} (flows.load_model({str(out)!r}))")
    if "test" in result and not math.isfinite(result["test"]["log_likelihood"]):
        print(
            f"flows fit: error: expected a finite test log-likelihood, got {result['test']['log_likelihood']}: the "
            "model gives some test points no density (a non-finite log_prob); see run.json",
            file=sys.stderr,
        )
        return 1
    return 0


def _worse_than_untrained(history: History, untrained: object) -> str | None:
    """Why the run counts as diverged (``None`` if it does not): its best validation loss is far above the untrained's.

    The guard catches non-finite steps; a learning rate that is merely too large gives finite losses
    of 1e6..1e16 nats, and the model with the best of them is still far worse than the model before
    training. "Far" is a margin of max(1, |L0|/2) nats over the untrained loss L0, so a short run
    that has not yet improved is not called diverged.
    """
    try:
        baseline = float(untrained)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(baseline):
        return None
    losses = [v for v in history["val_loss"] if math.isfinite(v)]
    if not losses:
        return None
    best = min(losses)
    if best <= baseline + max(1.0, abs(baseline) / 2):
        return None
    return f"expected a validation loss near or below the untrained model's {baseline:.4g} nats, got at best {best:.4g}"


def _json_number(value: object) -> object:
    """``value``, with a non-finite float as its string (``"inf"``), which JSON headers cannot hold."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _write_model_file(model: torch.nn.Module, out: Path) -> Path | None:
    """Write ``model.safetensors`` and ``model.json`` in ``out`` (None, with a note, if no config fits)."""
    from flows.model_file import ModelFileError, save_model

    try:
        return save_model(model, out)
    except ModelFileError as error:
        print(f"flows fit: no model.safetensors written: {error}", file=sys.stderr)
        return None


def _plain(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


def _check_run_data(args: argparse.Namespace, data, command: str, *, refuse: bool = True) -> None:
    """Refuse (or with ``--allow-changed-data``, warn) when the run's data changed since it was trained."""
    from flows.data.dataset import data_fingerprint
    from flows.train import read_checkpoint_header

    info = read_checkpoint_header(_run_checkpoint(args.run)).get("info") or {}
    refuse = refuse and not getattr(args, "allow_changed_data", False)
    how = f"pass --allow-changed-data to {command} on it anyway"
    _verify_fingerprint(info, data_fingerprint(data), args.run, command, refuse=refuse, how=how)


def eval(args: argparse.Namespace) -> int:
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


def _unused_names(out: Path, picture: Path) -> tuple[Path, Path]:
    """``out`` and ``picture``, or their ``-2``, ``-3``, ... versions, the first number that neither file has."""
    first_out, first_picture, number = out, picture, 1
    while out.exists() or picture.exists():
        number += 1
        out = first_out.with_name(f"{first_out.stem}-{number}{first_out.suffix}")
        picture = first_picture.with_name(f"{first_picture.stem}-{number}{first_picture.suffix}")
    return out, picture


def sample(args: argparse.Namespace) -> int:
    from flows.flow import evaluating
    from flows.plot import plot_corner, plot_image_grid
    from flows.train.runs import load_run

    if args.num < 1:
        raise ValueError(f"expected -n/--num >= 1, got {args.num}")
    base = args.run if args.run.is_dir() else args.run.parent
    out = args.out or base / "samples.npy"
    _check_output_file(out, "--out")
    if out.suffix != ".npy":  # what numpy.save would do silently: say it, and report the real path
        out = out.with_name(out.name + ".npy")
    picture = args.picture or out.with_suffix(".png")
    if not args.overwrite:  # earlier samples stay: default names get a number, named files need --overwrite
        if args.out is None and args.picture is None:
            out, picture = _unused_names(out, picture)
        elif taken := [str(p) for p in dict.fromkeys((args.out, out, picture)) if p is not None and p.exists()]:
            raise ValueError(f"expected new output files, got existing {taken}; pass --overwrite to replace them")
    _check_output_file(out, "--out")
    _check_output_file(picture, "--picture")
    _check_picture_format(picture)
    model, data = load_run(args.run)
    if data is not None:
        _check_run_data(args, data, "sample", refuse=False)  # samples do not depend on the data: warn only
    torch.manual_seed(args.seed)
    with evaluating(model), torch.no_grad():
        samples = model.sample((args.num,))
    finite = torch.isfinite(samples.reshape(len(samples), -1)).all(dim=1)
    if not bool(finite.all()):
        print(
            f"flows sample: warning: {int((~finite).sum())} of {args.num} samples have non-finite values "
            "(kept in the .npy file, left out of the picture)",
            file=sys.stderr,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as handle:
        np.save(handle, samples.numpy())
    shown = samples[finite]
    if len(shown) == 0:
        print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} (no picture: none is finite)")
        return 0
    picture.parent.mkdir(parents=True, exist_ok=True)
    if data is not None and data.image_shape is not None:
        plot_image_grid(shown, picture, image_shape=data.image_shape, title=f"{len(shown)} samples")
    else:
        labels = None if data is None else data.columns
        plot_corner(shown, None if data is None else data.test, picture, title=f"{len(shown)} samples", labels=labels)
    print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} and a picture to {picture}")
    return 0


def _check_picture_format(path: Path) -> None:
    """The picture's suffix is a format matplotlib writes (checked before sampling, not after)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ValueError(
            f"--picture: expected a file name ending in one of {', '.join('.' + f for f in sorted(formats))}, "
            f"got {str(path)!r}"
        )


def _layers(transform: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    from flows.bijections.base import Chain

    if isinstance(transform, Chain):
        found = []
        for i, member in enumerate(transform):
            found += _layers(member, f"{prefix}{i}.")
        return found
    return [(prefix.rstrip(".") or "0", transform)]


def check(args: argparse.Namespace) -> int:
    from flows.data.dequantization import uniform_dequantize
    from flows.testing import BijectionCheckError, check_bijection
    from flows.train.runs import load_run

    model, data = load_run(args.run, data_dir=args.data_dir)
    if data is not None:
        _check_run_data(args, data, "check")
    model = model.double().eval()
    if args.num < 1:
        raise ValueError(f"expected --num >= 1, got {args.num}")
    if data is not None:
        source = data.test if data.test is not None else data.train
        x = source[: args.num]
        x = uniform_dequantize(x, data.levels, dtype=torch.float64) if data.levels else x.double()
    else:
        with torch.no_grad():
            x = model.sample((args.num,))
    failures = 0
    inputs = x
    print(f"{'layer':>8}  {'transform':<22} {'worst error':>12}  result")
    for name, layer in [*_layers(model.transform), ("all", model.transform)]:
        if name == "all":
            x = inputs
        try:
            report = check_bijection(layer, x, atol=args.atol, rtol=args.atol)
            worst, status = max(report.values(), default=0.0), "ok"
        except BijectionCheckError as error:
            worst, status = math.nan, f"FAILED: {error}"
            failures += 1
        print(f"{name:>8}  {type(layer).__name__:<22} {worst:12.2e}  {status}")
        if name != "all":
            with torch.no_grad():
                x = layer(x)
    print(
        f"{failures} failure(s)" if failures else "every layer passed (round trips, fused calls, log-det vs autograd)"
    )
    return 1 if failures else 0


def models(args: argparse.Namespace) -> int:
    from flows.train.config import available_models

    for name in available_models():
        print(name)
    print("(use with: flows fit --model NAME; extra keyword options with --option KEY=VALUE)", file=sys.stderr)
    return 0
