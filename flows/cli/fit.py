"""``flows fit``: train a flow on a data set (resumable, optionally on several processes)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flows.cli._common import _check_writable_directory, _pictures, _verify_fingerprint

if TYPE_CHECKING:
    from flows.train.history import History

__all__ = ["fit"]


#: Builder options that only the named objective uses. Flow matching regresses the field directly and never solves
#: the ODE in training, so the RNODE penalties (``kinetic``, ``jacobian``) and the adjoint method would be ignored.
OBJECTIVE_OPTIONS: dict[str, tuple[str, ...]] = {"ml": ("kinetic", "jacobian", "adjoint"), "fm": ()}


def _check_options(builder_name: str, options: list[tuple[str, object]], objective: str = "ml") -> None:
    """``--option KEY=VALUE``: the builder has the option, the objective uses it, and the value has the option's type.

    Types are read from the builder's annotations (``float``, ``int``, ``bool``, ``str``,
    ``None``); options of other types (activations, sequences) are left to the builder.
    """
    import inspect

    from flows.architectures.registry import get
    from flows.cli.models import fit_can_build

    builder = get(builder_name, None)
    if builder is None:
        return
    parameters = inspect.signature(builder).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    names = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if not fit_can_build(builder):
        raise ValueError(
            f"--model {builder_name}: expected a builder that flows fit can build and train (see flows models), "
            f"got one with options {names}; build {builder_name} from Python"
        )
    renamed = getattr(builder.__init__ if isinstance(builder, type) else builder, "renamed_keywords", {})
    for i, (key, value) in enumerate(options):
        if key in renamed:  # an old keyword: still accepted for one release, under its new name
            print(f"flows fit: warning: --option {key}= is deprecated, use {renamed[key]}=", file=sys.stderr)
            key = renamed[key]
            options[i] = (key, value)
        users = [name for name, keys in OBJECTIVE_OPTIONS.items() if key in keys]
        if users and objective not in users:
            raise ValueError(
                f"--option {key}={json.dumps(value)}: expected it only with --objective {' or '.join(users)} "
                f"(the only objective that uses it), got --objective {objective}, which would ignore it"
            )
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


RUN_FLAGS = (
    "lr",
    "batch_size",
    "schedule",
    "clip",
    "patience",
    "objective",
    "sigma",
    "coupling",
    "target",
    "reference_size",
    "time_power",
)
STOP_FLAGS = ("epochs", "time_budget")


def fit(args: argparse.Namespace) -> int:
    """``flows fit``, holding the run directory's lock (one writer per run) around all of it on the main process."""
    from flows.train._atomic import naming_os_errors, remove_stale_temporaries
    from flows.train._lock import hold_run_lock, lock_path
    from flows.train.runs import RUN_FILES

    out = args.out or Path("runs") / Path(str(args.data)).stem
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and int(os.environ["RANK"]) != 0:
        return _fit(args)
    _check_writable_directory(out, "--out")  # before the lock file creates the directory
    if not (args.resume or args.overwrite):
        _refuse_foreign_files(out)  # before the lock file appears beside a user's files (checked again under it)
    created = not out.exists()
    try:
        with contextlib.ExitStack() as held:
            with naming_os_errors(lock_path(out / "checkpoint.ckpt")):  # only its creation: a full disk names it
                held.enter_context(hold_run_lock(out / "checkpoint.ckpt"))
            for name in RUN_FILES:  # left by a killed run's atomic writes (of its own files only); no other writer
                remove_stale_temporaries(out, name)
            return _fit(args)
    except BaseException:
        lock = lock_path(out / "checkpoint.ckpt")
        if created and out.is_dir() and list(out.iterdir()) == [lock]:  # a command that failed early leaves no run
            with contextlib.suppress(OSError):
                lock.unlink()
                out.rmdir()
        raise


def _fit(args: argparse.Namespace) -> int:
    from flows.architectures.registry import get
    from flows.data.dataset import data_fingerprint, load_dataset
    from flows.model_file import describe_model, save_model
    from flows.train import (
        EarlyStopping,
        MaximumLikelihood,
        MetricsLogger,
        PrintMetrics,
        Trainer,
        read_checkpoint_header,
    )
    from flows.train.distributed import cleanup_distributed, init_distributed, is_distributed
    from flows.train.runs import (
        evaluate_log_likelihood,
        model_for_data,
        read_run_file,
        remove_run_files,
        write_run_file,
    )

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
    if main_process and not (args.resume or args.overwrite):  # again, under the lock
        _refuse_foreign_files(out)
    replace = args.overwrite and not args.resume  # the old run's files go before this run writes its first one
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
        replace = True  # the files of the run being started again are its own
    spec = {
        "name": str(args.data),
        "data_dir": args.data_dir,
        "key": args.key,
        "levels": args.levels,
        "val_fraction": args.val_fraction,
        "test_fraction": args.test_fraction,
        "seed": args.seed,
    }
    builder = get(args.model, None)
    if builder is not None and not getattr(builder, "likelihood_trainable", True):
        raise ValueError(
            f"flows fit trains by maximum likelihood, which is not how {args.model} is trained; "
            "use its objective from Python (for FreeFormInjectiveFlow: "
            "flows.train.Trainer(model, flows.train.FreeFormInjectiveObjective()))"
        )
    _check_options(args.model, args.option, args.objective)
    _check_objective_flags(args)
    data = load_dataset(**spec)
    _refuse_binary_columns(data)
    fingerprint = data_fingerprint(data)
    say(f"data {data.describe()}")
    torch.manual_seed(args.seed)
    options = {"transforms": args.transforms, "hidden": args.hidden, **dict(args.option)}
    model = model_for_data(data, args.model, standardize=not args.no_standardize, **options)
    config = describe_model(model)  # what the checkpoints, run.json and the model file record
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
        stable = args.target == "stable"
        objective = FlowMatching(
            sigma=args.sigma,
            coupling=args.coupling,
            time_power=args.time_power,
            target=args.target,
            reference=data.train if stable else None,
            reference_size=args.reference_size if stable else None,
        )
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
        if replace:
            remove_run_files(out)
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
        from flows.cli import _interrupt

        _interrupt.ignore_further()  # stopping: a second Ctrl-C now would only lose this message and the status
        if main_process:
            print(
                f"flows fit: stopped by signal {trainer.interrupted}; {str(checkpoint)!r} holds the state at step "
                f"{trainer.step}: continue with the same command and --resume",
                file=sys.stderr,
            )
        return 130
    if not main_process:
        return 0
    worse = _no_training(trainer) or _worse_than_untrained(trainer.history, untrained)
    if worse:
        print(
            f"flows fit: error: training diverged: {worse}; no model file was written ({str(checkpoint)!r} holds the "
            f"last training state). Lower --lr (now {args.lr:g}), clip gradients with --clip, or check the data and "
            "the objective's flags",
            file=sys.stderr,
        )
        return 1
    model = trainer.model
    model_path = save_model(model, out, info={"data": spec, "data_fingerprint": fingerprint})
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
    written = [model_path, model_path.with_suffix(".json"), checkpoint, out / "metrics.json", out / "metrics.csv"]
    if not args.no_plots:
        from flows.plot import plot_history
        from flows.train._atomic import atomic_path

        with atomic_path(out / "curves.png") as temporary:
            plot_history(trainer.history, temporary)
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
    say(f"load the model with flows.load_model({str(out)!r})")
    if "test" in result and not math.isfinite(result["test"]["log_likelihood"]):
        print(
            f"flows fit: error: expected a finite test log-likelihood, got {result['test']['log_likelihood']}: the "
            "model gives some test points no density (a non-finite log_prob); see run.json",
            file=sys.stderr,
        )
        return 1
    return 0


def _refuse_foreign_files(out: Path) -> None:
    """Refuse a ``--out`` that holds any file a run writes (:data:`~flows.train.runs.RUN_FILES`), before any work.

    Such a file is a user's own or another run's: it is never replaced without ``--overwrite``
    (which replaces all of them) and never mixed with this run's files.
    """
    from flows.train.runs import run_files_in

    found = [p.name for p in run_files_in(out)]
    if not found:
        return
    listed = ", ".join(found)
    if "checkpoint.ckpt" in found or "run.json" in found:
        raise ValueError(
            f"{str(out)!r} already holds a run ({listed}); pass --resume to continue it, --overwrite to replace all "
            "of flows fit's files in it, or another --out"
        )
    raise ValueError(
        f"--out {str(out)!r}: expected a directory without the files flows fit writes, got {listed} (no run of "
        "flows wrote them: they are kept); pass --overwrite to replace them, or another --out"
    )


def _refuse_binary_columns(data) -> None:
    """Refuse continuous training on columns that only hold 0 and 1 (a boolean file, or a bool ``.npy``).

    A density on ℝ fitted to a two-point variable has no maximum: the likelihood grows without
    bound as the density peaks at 0 and 1, so its "log-likelihood" would be a meaningless number.
    Integer data is dequantized with ``--levels`` (``--levels 2`` for 0/1 data).
    """
    if data.levels is not None or data.image_shape is not None:
        return
    rows = data.train.reshape(len(data.train), -1)
    binary = ((rows == 0) | (rows == 1)).all(dim=0)
    if not bool(binary.any()):
        return
    names = data.columns or [str(i + 1) for i in range(rows.shape[1])]
    found = [names[i] for i in binary.nonzero().flatten().tolist()]
    how = (
        "pass --levels 2 to fit it as binary data (dequantized)"
        if bool(binary.all())
        else "drop those columns or fit them apart with --levels 2"
    )
    raise ValueError(
        f"--data {data.name}: expected continuous values, got column(s) {found[:5]}{' ...' if len(found) > 5 else ''} "
        f"holding only 0 and 1 (a continuous density has no maximum likelihood there); {how}"
    )


def _no_training(trainer) -> str | None:
    """Why the run trained nothing (``None`` if it did): every step was skipped, or no validation loss was finite."""
    guard = trainer.guard
    if guard is not None and trainer.step > 0 and guard.skipped >= trainer.step:
        return f"expected some finite training steps, got all {trainer.step} skipped as non-finite (an untrained model)"
    losses = trainer.history["val_loss"]
    if losses and not any(math.isfinite(v) for v in losses):
        return f"expected a finite validation loss in some epoch, got none in {len(losses)} (the model is not usable)"
    return None


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


def _check_objective_flags(args: argparse.Namespace) -> None:
    """Refuse flow-matching flags that the run would ignore, instead of training without them."""
    from flows.cli.parser import FLOW_MATCHING_DEFAULTS

    changed = [k for k, default in FLOW_MATCHING_DEFAULTS.items() if getattr(args, k) != default]
    given = ", ".join(f"--{k.replace('_', '-')} {getattr(args, k)}" for k in changed)
    if args.objective != "fm" and changed:
        raise ValueError(
            f"{given}: expected flow-matching flags only with --objective fm, got --objective {args.objective}"
        )
    if args.target != "stable" and "reference_size" in changed:
        raise ValueError(
            f"--reference-size {args.reference_size}: expected it only with --target stable, got --target {args.target}"
        )


def _json_number(value: object) -> object:
    """``value``, with a non-finite float as its string (``"inf"``), which JSON headers cannot hold."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _plain(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}
