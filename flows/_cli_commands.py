"""The commands behind ``flows fit/eval/sample/check/models`` (argument parsing lives in :mod:`flows.cli`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

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
                model, data.test if data.test is not None else data.train, path, title=f"density ({data.name})"
            )
            written.append(path)
        else:
            samples = model.sample((2000,))
            reference = data.test if data.test is not None else data.train
            path = directory / "corner.png"
            plot_corner(samples, reference[:2000], path, title=f"samples vs data ({data.name})")
            written.append(path)
    return written


def fit(args: argparse.Namespace) -> int:
    from flows.data.dataset import load_dataset
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
    from flows.train.runs import evaluate_log_likelihood, model_for_data, write_run_file

    if args.threads < 1 or args.nproc < 1:
        raise ValueError(f"expected --threads >= 1 and --nproc >= 1, got {args.threads} and {args.nproc}")
    torch.set_num_threads(args.threads)
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = init_distributed(seed=args.seed) if distributed else torch.device("cpu")
    main_process = not distributed or int(os.environ["RANK"]) == 0
    say = print if main_process and not args.quiet else (lambda *a, **k: None)
    out = args.out or Path("runs") / Path(str(args.data)).stem
    checkpoint = out / "checkpoint.ckpt"
    if checkpoint.exists() and not (args.resume or args.overwrite):
        raise ValueError(
            f"{str(out)!r} already holds a run; pass --resume to continue it or --overwrite to start afresh"
        )
    if args.resume and not checkpoint.exists():
        raise FileNotFoundError(f"--resume: no checkpoint in {str(out)!r}")
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
    data = load_dataset(**spec)
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
    if args.patience:
        callbacks.insert(0, EarlyStopping(patience=args.patience))
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
        info={"data": spec},
        compile=args.compile,
    )
    if args.resume:
        saved = read_checkpoint_header(checkpoint)
        for what, now, before in (("model", config, saved.get("config")), ("data", spec, saved["info"].get("data"))):
            if json.dumps(now, sort_keys=True) != json.dumps(before, sort_keys=True):
                raise ValueError(
                    f"--resume: the {what} settings differ from the run in {str(out)!r}: it has {before}, "
                    f"this command asks for {now}; repeat the original command (see run.json) with --resume"
                )
        trainer.resume()
        say(f"resumed {str(out)!r} at epoch {trainer.epoch} (step {trainer.step})")
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_run_file(out, {"data": spec, "config": config, "fit": _plain(vars(args))})
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
    model = trainer.model
    model_path = save_model(model, out / "model.ckpt", config, info={"data": spec})
    epochs = trainer.history.last().get("epoch", trainer.epoch)
    result = {"epochs": epochs, "steps": trainer.step, "train_seconds": round(trainer.elapsed, 2)}
    if data.test is not None:
        result["test"] = evaluate_log_likelihood(
            model.cpu(), data.test, levels=data.levels, draws=10 if data.levels else 1
        )
    write_run_file(out, {"data": spec, "config": config, "fit": _plain(vars(args)), "result": result})
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
    return 0


def _plain(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


def eval(args: argparse.Namespace) -> int:
    from flows.train.runs import evaluate_log_likelihood, load_run

    model, data = load_run(args.run, data_dir=args.data_dir)
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


def sample(args: argparse.Namespace) -> int:
    from flows.flow import evaluating
    from flows.plot import plot_corner, plot_image_grid
    from flows.train.runs import load_run

    if args.num < 1:
        raise ValueError(f"expected -n/--num >= 1, got {args.num}")
    model, data = load_run(args.run)
    torch.manual_seed(args.seed)
    with evaluating(model), torch.no_grad():
        samples = model.sample((args.num,))
    base = args.run if args.run.is_dir() else args.run.parent
    out = args.out or base / "samples.npy"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, samples.numpy())
    picture = args.picture or out.with_suffix(".png")
    if data is not None and data.image_shape is not None:
        plot_image_grid(samples, picture, image_shape=data.image_shape, title=f"{args.num} samples")
    else:
        plot_corner(samples, None if data is None else data.test, picture, title=f"{args.num} samples")
    print(f"wrote {args.num} samples of shape {tuple(samples.shape[1:])} to {out} and a picture to {picture}")
    return 0


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
    model = model.double().eval()
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
