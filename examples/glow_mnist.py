"""Train Glow on MNIST (or the digits) within a wall-clock budget; save sample grids and a bits/dim curve.

MNIST is read from the data directory (``--data-dir`` or ``$FLOWS_DATA_DIR``, file ``mnist.npz``).
Pixels are dequantized (uniform noise, or a learned variational dequantizer), mapped through the
logit inside the flow, and modelled by :class:`flows.Glow`. Training uses Adam with a linear warm-up
and a cosine decay over the budget, gradient clipping, and an exponential moving average (EMA) of
the weights that is used for evaluation and sampling. Test bits/dim is the dequantization bound for
256 grey levels on the full test set (eval mode, EMA weights).

The loop is written out rather than run by :class:`flows.train.Trainer`, which has no moving
average of the weights: the EMA copy is updated after every step and scored on a test subset at
fixed intervals of training time (excluded from the clock) for the bits/dim curve.

    # the target run: <= 1.20 test bits/dim within 60 minutes of 2-core CPU training
    python examples/glow_mnist.py --time-budget 3600 --threads 2 --out runs/glow_mnist
    # a short look
    python examples/glow_mnist.py --time-budget 300 --out /tmp/glow_mnist
    # offline smoke run on the digits
    python examples/glow_mnist.py --data digits --time-budget 5 --steps 1 --hidden 8 --out /tmp/glow_digits

Outputs in ``--out``: ``samples.png`` (temperatures 1.0 and 0.7), ``curve.png`` (train and test
bits/dim against training time) and ``metrics.json`` (the curve and the final numbers).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
from torch import Tensor

import flows
from flows.bijections.auxiliary import AuxiliaryLosses
from flows.data import DIGITS_LEVELS, MNIST_LEVELS, VariationalDequantizer, load_digits, load_mnist, uniform_dequantize
from flows.metrics import bits_per_dim


def load(args: argparse.Namespace) -> tuple[Tensor, Tensor, int]:
    """Train and test images ``(N, 1, H, W)`` (uint8 grey levels) and the number of levels."""
    if args.data == "mnist":
        train, test = load_mnist(args.data_dir)
        levels = MNIST_LEVELS
    else:
        train, test = load_digits(image=True)
        levels = DIGITS_LEVELS
    if args.train_limit:
        train = train[: args.train_limit]
    if args.test_limit:
        test = test[: args.test_limit]
    return train, test, levels


class EMA:
    """Exponential moving average of a model's parameters; buffers are copied (ActNorm flags, EIW orders)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.model = copy.deepcopy(model).eval()
        self.decay, self.updates = decay, 0
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))  # short memory at the start
        for ema, p in zip(self.model.parameters(), model.parameters(), strict=True):
            ema.lerp_(p, 1 - decay)
        for ema, b in zip(self.model.buffers(), model.buffers(), strict=True):
            ema.copy_(b)


@torch.no_grad()
def test_bits_per_dim(
    model: flows.Glow, dequantizer: VariationalDequantizer | None, test: Tensor, levels: int, batch_size: int, seed: int
) -> float:
    """Mean test bits/dim (one dequantization draw per image), in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    dims = math.prod(test.shape[1:])
    total = 0.0
    with flows.evaluating(model):
        for i in range(0, len(test), batch_size):
            v = test[i : i + batch_size]
            if dequantizer is None:
                log_p = model.log_prob(uniform_dequantize(v, levels, generator=generator))
            else:
                with flows.evaluating(dequantizer):
                    x, log_q = dequantizer(v, generator=generator)
                log_p = model.log_prob(x) - log_q
            total += float(bits_per_dim(log_p, dims, levels).sum())
    return total / len(test)


def save_samples(model: flows.Glow, path: Path, seed: int, n: int = 64) -> None:
    """Two grids of samples (temperature 1.0 and 0.7); matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    side = int(math.sqrt(n))
    fig, axes = plt.subplots(1, 2, figsize=(10, 5.3))
    torch.manual_seed(seed)
    with flows.evaluating(model), torch.no_grad():
        for ax, temperature in zip(axes, (1.0, 0.7), strict=True):
            images = model.sample((side * side,), temperature=temperature).clamp(0, 1)[:, 0]
            images = torch.nn.functional.pad(images, (1, 1, 1, 1), value=0.5)  # a grey frame around each
            h, w = images.shape[-2:]
            grid = images.reshape(side, side, h, w).permute(0, 2, 1, 3).reshape(side * h, side * w)
            ax.imshow(grid.numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_title(f"temperature {temperature}")
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def save_curve(history: list[dict], path: Path, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    minutes = [h["time"] / 60 for h in history]
    ax.plot(minutes, [h["train_bpd"] for h in history], label="train (running mean)")
    ax.plot(minutes, [h["test_bpd"] for h in history], "o-", label="random test subset (EMA weights)")
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", label=f"target {target}")
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("bits/dim")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("mnist", "digits"), default="mnist")
    parser.add_argument("--data-dir", default=None, help="folder with mnist.npz (default: $FLOWS_DATA_DIR)")
    parser.add_argument("--time-budget", type=float, default=3600.0, help="training seconds (evaluation excluded)")
    parser.add_argument("--epochs", type=int, default=None, help="stop after this many epochs (default: budget only)")
    parser.add_argument("--levels", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="flow steps per level")
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--split", choices=("static", "eiw"), default="static")
    parser.add_argument("--mixer", choices=("1x1", "lu", "circulant"), default="1x1")
    parser.add_argument(
        "--share-conditioner", action="store_true", help="NanoFlow sharing: one coupling network per level"
    )
    parser.add_argument("--dequantization", choices=("uniform", "variational"), default="uniform")
    parser.add_argument("--alpha", type=float, default=1e-6, help="alpha of the logit preprocessing")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=200, help="linear learning-rate warm-up steps")
    parser.add_argument("--clip", type=float, default=50.0, help="gradient-norm clipping (per-dim loss)")
    parser.add_argument("--ema", type=float, default=0.999, help="decay of the weight average (0: off)")
    parser.add_argument("--eval-every", type=float, default=300.0, help="seconds between test-subset evaluations")
    parser.add_argument("--eval-size", type=int, default=2000, help="random test images in the periodic evaluations")
    parser.add_argument("--train-limit", type=int, default=0, help="use only the first N training images")
    parser.add_argument("--test-limit", type=int, default=0, help="use only the first N test images")
    parser.add_argument("--goal", type=float, default=1.20, help="bits/dim line drawn on the curve")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/glow_mnist"))
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, test, levels = load(args)
    shape = tuple(train.shape[1:])
    dims = math.prod(shape)
    model = flows.Glow(
        shape,
        scales=args.levels,
        steps=args.steps,
        hidden=(args.hidden, args.hidden),
        split=args.split,
        mixer=args.mixer,
        logit_alpha=args.alpha,
        share_conditioner=args.share_conditioner,
    )
    dequantizer = VariationalDequantizer(shape, levels) if args.dequantization == "variational" else None
    params = list(model.parameters()) + (list(dequantizer.parameters()) if dequantizer else [])
    optimizer = torch.optim.Adam(params, lr=args.lr, foreach=True)
    generator = torch.Generator().manual_seed(args.seed)
    n_params = sum(p.numel() for p in params)
    print(
        f"{args.data}: {len(train)} train / {len(test)} test images {shape}, Glow levels={args.levels} "
        f"steps={args.steps} hidden={args.hidden} split={args.split} mixer={args.mixer} "
        f"shared={args.share_conditioner} dequantization={args.dequantization}, {n_params} parameters, "
        f"torch threads {torch.get_num_threads()}"
    )

    # a fixed random subset of the test set for the periodic evaluations (the full set is scored at the end)
    subset_index = torch.randperm(len(test), generator=torch.Generator().manual_seed(123))[: args.eval_size]
    ema: EMA | None = None
    history: list[dict] = []
    step, epoch, running, seen = 0, 0, 0.0, 0
    elapsed, last_eval = 0.0, 0.0
    done = False
    while not done:
        order = torch.randperm(len(train), generator=generator)
        model.train()
        for i in range(0, len(train), args.batch_size):
            start = time.perf_counter()
            progress = elapsed / args.time_budget
            if args.epochs:
                progress = max(progress, (epoch + i / len(train)) / args.epochs)
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
            for group in optimizer.param_groups:
                group["lr"] = lr
            v = train[order[i : i + args.batch_size]]
            with AuxiliaryLosses() as aux:
                if dequantizer is None:
                    log_p = model.log_prob(uniform_dequantize(v, levels, generator=generator))
                else:
                    x, log_q = dequantizer(v, generator=generator)
                    log_p = model.log_prob(x) - log_q
                nll = -log_p.mean()
            loss = (nll + aux.total()) / dims
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.clip)
            optimizer.step()
            if args.ema:
                ema = EMA(model, args.ema) if ema is None else ema
                ema.update(model)
            step += 1
            running += float(nll.detach()) * len(v)
            seen += len(v)
            elapsed += time.perf_counter() - start
            if elapsed >= args.time_budget:
                done = True
            if done or elapsed - last_eval >= args.eval_every:
                last_eval = elapsed
                scored = ema.model if ema else model
                subset = test[subset_index]
                test_bpd = test_bits_per_dim(scored, dequantizer, subset, levels, 256, seed=1)
                train_bpd = float(bits_per_dim(torch.tensor(-running / seen), dims, levels))
                running, seen = 0.0, 0
                point = {"time": elapsed, "epoch": epoch + (i + len(v)) / len(train), "step": step, "lr": lr}
                history.append({**point, "train_bpd": train_bpd, "test_bpd": test_bpd})
                print(
                    f"{elapsed / 60:6.1f} min  epoch {history[-1]['epoch']:6.2f}  step {step:6d}  "
                    f"train bpd {train_bpd:.4f}  test bpd ({len(subset)} images) {test_bpd:.4f}",
                    flush=True,
                )
            if done:
                break
        epoch += 1
        if args.epochs and epoch >= args.epochs:
            done = True

    final_model = ema.model if ema else model
    start = time.perf_counter()
    final = test_bits_per_dim(final_model, dequantizer, test, levels, 256, seed=2)
    print(
        f"final test bits/dim {final:.4f} on all {len(test)} test images (EMA weights: {bool(ema)}), "
        f"after {elapsed / 60:.1f} min of training ({step} steps, {epoch} epochs); "
        f"evaluation took {time.perf_counter() - start:.1f} s"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    save_samples(final_model, args.out / "samples.png", args.seed)
    save_curve(history, args.out / "curve.png", args.goal if args.data == "mnist" else None)
    metrics = {"final_test_bpd": final, "train_seconds": elapsed, "steps": step, "history": history}
    metrics["args"] = {k: str(v) for k, v in vars(args).items()}
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    print(f"wrote {args.out / 'samples.png'}, {args.out / 'curve.png'} and {args.out / 'metrics.json'}")
    return metrics


if __name__ == "__main__":
    main()
