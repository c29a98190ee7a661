"""``flows fit``: train a flow on a data set (resumable, optionally on several processes)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flows.cli._common import _check_writable_directory, _class_index, _pictures, _verify_fingerprint
from flows.cli.fit_flags import OBJECTIVE_OPTIONS, check_objective_flags, data_spec, resume_policy, run_settings

if TYPE_CHECKING:
    from flows.train.history import History

__all__ = ["OBJECTIVE_OPTIONS", "fit"]


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
        _check_option_value(builder_name, key, value, parameters[key])


def _check_option_value(builder_name: str, key: str, value: object, parameter) -> None:
    """The value of ``--option KEY=VALUE`` has the type the builder's annotation of ``KEY`` names."""
    import inspect

    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--option {key}={value}: expected a finite number, got {value}")
    annotation = parameter.annotation
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
        return
    if not any(accepted[k](value) for k in kinds):
        wanted = " or ".join(sorted("null" if k == "None" else k for k in kinds))
        default = parameter.default
        example = f" such as {key}={json.dumps(default)}" if default is not inspect.Parameter.empty else ""
        raise ValueError(f"--option {key}: expected {wanted}{example}, got {value!r}")


@dataclass
class _Run:
    """One ``flows fit`` run: where it goes, and what :func:`_prepare` built for the other steps."""

    args: argparse.Namespace
    out: Path
    distributed: bool
    main_process: bool = True
    say: Callable[..., None] = print
    replace: bool = False  # the old run's files go before this run writes its first one
    spec: dict = field(default_factory=dict)
    data: Any = None
    fingerprint: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    trainer: Any = None
    untrained: object = None  # the untrained model's validation loss, the yardstick of divergence
    record: dict = field(default_factory=dict)  # run.json

    @property
    def checkpoint(self) -> Path:
        return self.out / "checkpoint.ckpt"


def fit(args: argparse.Namespace) -> int:
    """``flows fit``, holding the run directory's lock (one writer per run) around all of it on the main process."""
    from flows.train._atomic import naming_os_errors, remove_stale_temporaries
    from flows.train._lock import hold_run_lock, lock_path
    from flows.train.runs import RUN_FILES

    out = args.out or Path("runs") / Path(str(args.data)).stem
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and int(os.environ["RANK"]) != 0:
        return _fit(_Run(args, out, distributed))
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
            return _fit(_Run(args, out, distributed))
    except BaseException:
        lock = lock_path(out / "checkpoint.ckpt")
        if created and out.is_dir() and list(out.iterdir()) == [lock]:  # a command that failed early leaves no run
            with contextlib.suppress(OSError):
                lock.unlink()
                out.rmdir()
        raise


def _fit(run: _Run) -> int:
    """The steps of a run: prepare it, start or resume it, train, finish (the exit status)."""
    _prepare(run)
    _start_or_resume(run)
    _train(run)
    return _finish(run)


def _prepare(run: _Run) -> None:
    """Check the arguments and the run directory, load the data, build the model, the objective and the trainer."""
    from flows.data.dataset import data_fingerprint, load_dataset
    from flows.train.distributed import init_distributed

    args = run.args
    if args.threads < 1 or args.nproc < 1:
        raise ValueError(f"expected --threads >= 1 and --nproc >= 1, got {args.threads} and {args.nproc}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"expected a finite --lr > 0, got {args.lr}")
    torch.set_num_threads(args.threads)
    device = init_distributed(seed=args.seed) if run.distributed else torch.device("cpu")
    run.main_process = not run.distributed or int(os.environ["RANK"]) == 0
    run.say = print if run.main_process and not args.quiet else (lambda *a, **k: None)
    _check_directory(run)
    run.spec = data_spec(args)
    _check_model_flags(args)
    run.data = load_dataset(**run.spec)
    _refuse_binary_columns(run.data)
    run.fingerprint = data_fingerprint(run.data)
    run.say(f"data {run.data.describe()}")
    model = _build_model(run).to(device)
    run.trainer = _trainer(run, model, _objective(args, model, run.data))


def _check_directory(run: _Run) -> None:
    """Refuse an unusable ``--out`` (again, under the lock); a ``--resume`` with no checkpoint starts afresh."""
    args, out = run.args, run.out
    _check_writable_directory(out, "--out")
    if run.main_process and not (args.resume or args.overwrite):  # again, under the lock
        _refuse_foreign_files(out)
    run.replace = args.overwrite and not args.resume
    if args.resume and not run.checkpoint.exists():
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
        run.replace = True  # the files of the run being started again are its own


def _check_model_flags(args: argparse.Namespace) -> None:
    """Refuse a builder that ``flows fit`` cannot train, its ill-typed options, and flags the objective ignores."""
    from flows.architectures.registry import get

    builder = get(args.model, None)
    if builder is not None and not getattr(builder, "likelihood_trainable", True):
        raise ValueError(
            f"flows fit trains by maximum likelihood, which is not how {args.model} is trained; "
            "use its objective from Python (for FreeFormInjectiveFlow: "
            "flows.train.Trainer(model, flows.train.FreeFormInjectiveObjective()))"
        )
    _check_options(args.model, args.option, args.objective)
    check_objective_flags(args)
    _check_labels_flags(args)


def _check_labels_flags(args: argparse.Namespace) -> None:
    """``--labels`` needs labelled data and a builder with ``num_classes=`` (from the data, never an ``--option``)."""
    import inspect

    from flows.architectures.registry import get

    if any(key == "num_classes" for key, _ in args.option):
        raise ValueError(
            "--option num_classes=...: expected --labels to train a class-conditional flow (the number of classes "
            "comes from the data), got num_classes as an --option"
        )
    if not args.labels:
        return
    from flows.data.dataset import LABELLED_DATASETS

    if str(args.data) not in LABELLED_DATASETS:
        raise ValueError(
            f"--labels: expected --data with class labels ({', '.join(LABELLED_DATASETS)}), got --data {args.data}"
        )
    builder = get(args.model, None)
    if builder is not None and "num_classes" not in inspect.signature(builder).parameters:
        raise ValueError(
            f"--labels: expected a builder that takes num_classes= (a class-conditional flow, e.g. TarFlow; see "
            f"flows models), got --model {args.model}, which has no num_classes"
        )


def _build_model(run: _Run) -> torch.nn.Module:
    """The model of ``--model`` for the data, seeded by ``--seed``; sets ``run.config``."""
    from flows.model_file import describe_model
    from flows.train.runs import model_for_data

    args = run.args
    torch.manual_seed(args.seed)
    options = {"transforms": args.transforms, "hidden": args.hidden, **dict(args.option)}
    if run.data.num_classes is not None:  # --labels: a class-conditional flow
        options["num_classes"] = run.data.num_classes
    model = model_for_data(run.data, args.model, standardize=not args.no_standardize, **options)
    run.config = describe_model(model)  # what the checkpoints, run.json and the model file record
    n_params = sum(p.numel() for p in model.parameters())
    classes = f", {run.data.num_classes} classes" if run.data.num_classes is not None else ""
    run.say(
        f"model {args.model} ({n_params:,} parameters{classes}), {run.config['preprocessing'] or 'no'} preprocessing"
    )
    return model


def _split(run: _Run, name: str) -> object:
    """A split as the trainer takes it: the rows, or ``(rows, class index)`` for labelled data (``--labels``)."""
    rows, labels = getattr(run.data, name), run.data.labels_of(name)
    if rows is None or labels is None:
        return rows
    return rows, _class_index(run.trainer.model, labels)


def _objective(args: argparse.Namespace, model: torch.nn.Module, data) -> object:
    """The objective of ``--objective`` with its flags, refusing a model or data it cannot train."""
    from flows.train import MaximumLikelihood

    if args.objective == "ml":
        _check_noise(args, model, data)
        return MaximumLikelihood(levels=data.levels, noise_std=args.noise_std or None)
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
    stable = args.velocity == "stable"
    return FlowMatching(
        sigma=args.sigma,
        coupling=args.coupling,
        time_power=args.time_power,
        velocity=args.velocity,
        reference=data.train if stable else None,
        reference_size=args.reference_size if stable else None,
    )


def _check_noise(args: argparse.Namespace, model: torch.nn.Module, data) -> None:
    """Refuse noise augmentation that would not be what ``--noise-std`` or the model's ``noise_std`` says.

    :class:`~flows.train.MaximumLikelihood` adds the noise to the data it is given, after any
    dequantization; for integer data that is the dequantized ``[0, 1)`` values in front of the
    ``Logit`` preprocessing layer, whose domain ends near 0 and 1, so the noise would push rows out
    of it. A ``--noise-std`` other than the model's own ``noise_std`` would silently replace it.
    """
    recorded = getattr(model, "noise_std", None)
    if args.noise_std and recorded and args.noise_std != recorded:
        raise ValueError(
            f"--noise-std {args.noise_std}: expected the noise_std the model records ({recorded}, from --option "
            f"noise_std=) or no --noise-std, got both"
        )
    sigma = args.noise_std or recorded
    if sigma and data.levels is not None:
        given = f"--noise-std {args.noise_std}" if args.noise_std else f"--option noise_std={recorded}"
        raise ValueError(
            f"{given}: expected continuous data, got integer data with {data.levels} levels: the noise would land "
            "on the dequantized values in [0, 1), in front of the Logit preprocessing layer, which is defined only "
            "around [0, 1); train noise-augmented flows on integer data from Python (see docs/transformer.md)"
        )


def _trainer(run: _Run, model: torch.nn.Module, objective: object):
    """The trainer of the run: schedule, callbacks, checkpoint, and the settings its checkpoints record."""
    from flows.train import EarlyStopping, MetricsLogger, PrintMetrics, Trainer

    args = run.args
    scheduler = None
    if args.schedule == "cosine":
        steps = max(1, args.epochs)
        scheduler = lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)  # noqa: E731
    elif args.schedule == "plateau":
        scheduler = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)  # noqa: E731
    callbacks = (
        [MetricsLogger(run.out), PrintMetrics(every=max(1, args.epochs // 10))]
        if not args.quiet
        else [MetricsLogger(run.out)]
    )
    # --patience 0 never stops early, but the model saved is still the best epoch's
    callbacks.insert(0, EarlyStopping(patience=args.patience or None))
    return Trainer(
        model,
        objective,
        lr=args.lr,
        scheduler=scheduler,
        clip_grad_norm=args.clip or None,
        callbacks=callbacks,
        checkpoint=run.checkpoint,
        checkpoint_every=args.checkpoint_every,
        config=run.config,
        info={"data": run.spec, "data_fingerprint": run.fingerprint, "fit": run_settings(args)},
        compile=args.compile,
    )


def _start_or_resume(run: _Run) -> None:
    """Resume the run from its checkpoint, or measure the untrained model; then write run.json (main process)."""
    from flows.train.runs import json_number, read_run_file, remove_run_files, write_run_file

    args = run.args
    resumes = _resume(run) if args.resume else None
    if args.resume:
        run.untrained = read_run_file(run.out).get("untrained_val_loss")
    else:  # the yardstick of divergence: the untrained model's validation loss (every process evaluates)
        run.untrained = run.trainer.evaluate(_split(run, "val"), batch_size=args.batch_size).get("loss")
    run.record = {
        "data": run.spec,
        "data_fingerprint": run.fingerprint,
        "config": run.config,
        "fit": _plain(vars(args)),
        "untrained_val_loss": json_number(run.untrained),
    }
    if resumes:
        run.record["resumes"] = resumes
    if run.main_process:
        run.out.mkdir(parents=True, exist_ok=True)
        if run.replace:
            remove_run_files(run.out)
        write_run_file(run.out, run.record)


def _resume(run: _Run) -> list[dict]:
    """Continue the trainer from the checkpoint, refusing another run's settings; the run's resumes, this one last.

    The policy of each flag is in :data:`~flows.cli.fit_flags.FIT_FLAGS` and applied by
    :func:`flows.train.runs.check_same_run` and :func:`~flows.train.runs.resume_changes`.
    """
    from flows.train import read_checkpoint_header
    from flows.train.runs import check_same_run, read_run_file, resume_changes

    trainer, out = run.trainer, run.out
    saved = read_checkpoint_header(run.checkpoint)
    _check_same_labels(saved, run.spec, out)
    check_same_run(saved, run.config, run.spec, out)
    _verify_fingerprint(saved.get("info", {}), run.fingerprint, run.checkpoint, "fit --resume", refuse=True)
    before = saved["info"].get("fit") or read_run_file(out).get("fit", {})
    changed = resume_changes(before, run_settings(run.args), resume_policy(), out)
    trainer.resume()
    record = {"step": trainer.step, "epoch": trainer.epoch, "changed": changed}
    note = ", ".join(f"--{k.replace('_', '-')} {new} (was {old})" for k, (old, new) in changed.items())
    trainer.history.event(trainer.step, f"resumed at epoch {trainer.epoch}" + (f" with {note}" if note else ""))
    run.say(f"resumed {str(out)!r} at epoch {trainer.epoch} (step {trainer.step})" + (f" with {note}" if note else ""))
    return [*read_run_file(out).get("resumes", []), record]


def _check_same_labels(header: dict, spec: dict, out: Path) -> None:
    """Refuse to resume a run with ``--labels`` without it, or the other way round (one line naming both)."""
    recorded = (header.get("info") or {}).get("data") or {}
    before, now = bool(recorded.get("labels")), bool(spec.get("labels"))
    if before != now:
        had = "with --labels (class-conditional)" if before else "without --labels (unconditional)"
        asked = "with --labels" if now else "without --labels"
        raise ValueError(
            f"--resume: expected the run's --labels setting, got a command {asked} for the run in {str(out)!r}, "
            f"trained {had}; repeat the original command (see run.json) with --resume"
        )


def _train(run: _Run) -> None:
    """Train to the stopping rules (or a signal), then leave the process group."""
    from flows.train.distributed import cleanup_distributed, is_distributed

    args = run.args
    run.trainer.fit(
        _split(run, "train"),
        _split(run, "val"),
        epochs=args.epochs,
        batch_size=args.batch_size,
        time_budget=args.time_budget,
        seed=args.seed,
    )
    if is_distributed():
        run.trainer.release_distributed()  # the DDP wrapper must go before the process group does
        cleanup_distributed()


def _finish(run: _Run) -> int:
    """Stop on a signal or a diverged run; else write the model, the test result and the pictures, and report."""
    trainer = run.trainer
    if trainer.interrupted is not None:
        from flows.cli import _interrupt

        _interrupt.ignore_further()  # stopping: a second Ctrl-C now would only lose this message and the status
        if run.main_process:
            print(
                f"flows fit: stopped by signal {trainer.interrupted}; {str(run.checkpoint)!r} holds the state at step "
                f"{trainer.step}: continue with the same command and --resume",
                file=sys.stderr,
            )
        return 130
    if not run.main_process:
        return 0
    worse = _no_training(trainer) or _worse_than_untrained(trainer.history, run.untrained)
    if worse:
        print(
            f"flows fit: error: training diverged: {worse}; no model file was written ({str(run.checkpoint)!r} holds "
            f"the last training state). Lower --lr (now {run.args.lr:g}), clip gradients with --clip, or check the "
            "data and the objective's flags",
            file=sys.stderr,
        )
        return 1
    written = _save_trained_model(run)
    result = _result(run)
    _write_outputs(run, result, written)
    return _report(run, result, written)


def _save_trained_model(run: _Run) -> list[Path]:
    """Write the trained model file (``model.safetensors`` + ``model.json``); the paths written."""
    from flows.model_file import save_model

    info = {"data": run.spec, "data_fingerprint": run.fingerprint}
    model_path = save_model(run.trainer.model, run.out, info=info)
    return [model_path, model_path.with_suffix(".json")]


def _result(run: _Run) -> dict:
    """The result for run.json: epochs, steps, training time, and the test log-likelihood (with a test split)."""
    from flows.train.runs import evaluate_log_likelihood

    trainer, data = run.trainer, run.data
    epochs = trainer.history.last().get("epoch", trainer.epoch)
    result = {"epochs": epochs, "steps": trainer.step, "train_seconds": round(trainer.elapsed, 2)}
    if data.test is not None:
        context = None if data.test_labels is None else _class_index(trainer.model, data.test_labels)
        result["test"] = evaluate_log_likelihood(
            trainer.model.cpu(), data.test, levels=data.levels, draws=10 if data.levels else 1, context=context
        )
        if context is not None:
            result["test"]["conditional"] = True  # log p(x | y), given the test labels
    return result


def _write_outputs(run: _Run, result: dict, written: list[Path]) -> None:
    """Write run.json with the result, and the pictures; ``written`` gains the files."""
    from flows.train.runs import write_run_file

    record = {k: v for k, v in run.record.items() if k != "resumes"} | {"result": result}
    if "resumes" in run.record:
        record["resumes"] = run.record["resumes"]
    write_run_file(run.out, record)
    written += [run.checkpoint, run.out / "metrics.json", run.out / "metrics.csv"]
    if not run.args.no_plots:
        from flows.plot import plot_history
        from flows.train._atomic import atomic_path

        with atomic_path(run.out / "curves.png") as temporary:
            plot_history(run.trainer.history, temporary)
        written += [run.out / "curves.png", *_pictures(run.trainer.model, run.data, run.out)]


def _report(run: _Run, result: dict, written: list[Path]) -> int:
    """Print the run's events, its test result and its files; 1 when the test log-likelihood is not finite."""
    trainer, say = run.trainer, run.say
    for event in trainer.history.events:
        say(f"step {event['step']}: {event['message']}")
    if "test" in result:
        test = result["test"]
        given = " (conditional, log p(x|y))" if test.get("conditional") else ""
        line = (
            f"test log-likelihood{given}: {test['log_likelihood']:.4f} ± {test['stderr']:.4f} nats "
            f"({test['n']} samples)"
        )
        if "bits_per_dim" in test:
            line = (
                f"test bits/dim{given}: {test['bits_per_dim']:.3f}  ({run.data.levels} levels, {test['n']} test "
                "samples)\n" + line
            )
        print(line)
    else:  # said, not left out silently: the data set has no test split (e.g. --test-fraction 0)
        print(
            f"no test split in {run.data.name!r}: no test log-likelihood "
            "(flows eval --split val scores the validation split)"
        )
    files = ", ".join(str(p) for p in written)
    say(f"trained {result['epochs']:g} epochs ({trainer.step} steps) in {trainer.elapsed:.1f} s; wrote {files}")
    say(f"load the model with flows.load_model({str(run.out)!r})")
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


def _plain(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}
