"""Class-conditional TarFlow on MNIST (or the 8×8 digits): bits/dim, Bayes accuracy, step time, samples.

Protocol: the reference notebook's architecture at width 64 (``patch 4, 4 blocks × 2 layers``,
about 0.43 M parameters on MNIST), class-conditional (10 classes), trained for a wall-clock budget
on **uniformly dequantised** images ``v = (x + u) / 256`` mapped to ``[-1, 1]`` (the map's log-det
``D log 2`` is counted), AdamW (betas 0.9/0.95, weight decay 1e-4), a linear warm-up, gradient
clipping at 1, one thread. Reported:

* test bits/dim (:func:`flows.metrics.bits_per_dim` of the density on ``[0, 1]^D``, one
  dequantisation draw) on the first ``--eval-images`` test images and, with ``--all-test``, all of them;
* Bayes accuracy (:func:`flows.classify.bayes_classifier`, uniform prior, ``K`` passes) on the first
  ``--classify-images`` test images, scored the way the model was trained (dequantised inputs);
* the median training step time and the number of steps;
* the time to draw 100 samples (10 per class) and how many are finite; a 10 × 10 grid (``--out``).

The reference code (apple/ml-tarflow) is not run by this script; run it unchanged from a scratch
folder and compare at the same budget.

    python benchmarks/transformer_flows.py                              # MNIST, 10 minutes
    python benchmarks/transformer_flows.py --data digits --seconds 60 --patch 2 --out /tmp/tarflow
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import flows
from flows.classify import bayes_classifier
from flows.data import uniform_dequantize
from flows.metrics import bits_per_dim


def load(name: str, data_dir: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(train images, train labels, test images, test labels, levels)``, images ``(N, 1, H, W)`` uint8."""
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_tr, x_te, y_tr, y_te = train_test_split(
            digits.data.astype("uint8"), digits.target, test_size=0.2, random_state=0
        )
        shape, levels = (-1, 1, 8, 8), 17
    else:
        from flows.data.files import data_file

        with np.load(data_file("mnist.npz", data_dir)) as arrays:
            x_tr, y_tr, x_te, y_te = (arrays[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        shape, levels = (-1, 1, 28, 28), 256
    images = [torch.from_numpy(np.ascontiguousarray(a)).reshape(shape) for a in (x_tr, x_te)]
    labels = [torch.from_numpy(np.asarray(a)).long() for a in (y_tr, y_te)]
    return images[0], labels[0], images[1], labels[1], levels


def to_model(v: torch.Tensor) -> torch.Tensor:
    """``[0, 1]`` → ``[-1, 1]`` (log-det ``D log 2``, added back by :func:`log_density`)."""
    return 2 * v - 1


def log_density(flow: flows.TarFlow, v: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log-density of dequantised images ``v`` in ``[0, 1]^D``."""
    dims = v[0].numel()
    return flow.log_prob(to_model(v), context=flow.class_context(y)) + dims * math.log(2)


def train(flow: flows.TarFlow, images, labels, levels: int, args: argparse.Namespace) -> list[float]:
    """Train for ``args.seconds`` of wall clock; returns the step times."""
    optimizer = torch.optim.AdamW(flow.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=1e-4)
    generator = torch.Generator().manual_seed(args.seed)
    dims, times, step, start = images[0].numel(), [], 0, time.perf_counter()
    flow.train()
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        index = torch.randint(len(images), (args.batch,), generator=generator)
        v = uniform_dequantize(images[index], levels, generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / args.warmup)
        loss = -log_density(flow, v, labels[index]).mean() / dims
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(flow.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - t0)
        step += 1
        if args.verbose and step % 100 == 0:
            print(f"step {step}  loss/dim {loss.item():.4f}  {time.perf_counter() - start:.0f} s", flush=True)
    return times


@torch.no_grad()
def evaluate(flow: flows.TarFlow, images, labels, levels: int, args: argparse.Namespace) -> dict[str, float]:
    flow.eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    dims = images[0].numel()

    def bpd(n: int) -> float:
        values = []
        for i in range(0, n, 500):
            v = uniform_dequantize(images[i : i + 500], levels, generator=generator)
            values.append(bits_per_dim(log_density(flow, v, labels[i : i + 500]), dims, levels))
        return torch.cat(values).mean().item()

    n_eval = min(args.eval_images, len(images))
    result = {"bits_per_dim": bpd(n_eval), "eval_images": n_eval}
    if args.all_test:
        result["bits_per_dim_all"] = bpd(len(images))
    n_cls = min(args.classify_images, len(images))
    v = uniform_dequantize(images[:n_cls], levels, generator=generator)
    predicted = bayes_classifier(flow, to_model(v), flow.num_classes).argmax(-1)
    result["bayes_accuracy"] = (predicted == labels[:n_cls]).double().mean().item()
    result["classify_images"] = n_cls
    y = flow.class_context(torch.arange(100) % 10)
    t0 = time.perf_counter()
    x = flow.sample(context=y)
    result["sample_100_s"] = time.perf_counter() - t0
    result["finite_samples"] = int(torch.isfinite(x.flatten(1)).all(1).sum())
    result["samples"] = x
    return result


def sample_grid(samples: torch.Tensor, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = ((samples.nan_to_num(0.0).clamp(-1, 1) + 1) / 2).squeeze(1)  # (100, H, W), column k: class k
    grid = v.reshape(10, 10, *v.shape[1:]).permute(0, 2, 1, 3).reshape(10 * v.shape[1], 10 * v.shape[2])
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(grid.numpy(), cmap="gray_r", vmin=0, vmax=1)
    ax.set_axis_off()
    ax.set_title(title)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--data-dir", default=None, help="folder holding mnist.npz (default: $FLOWS_DATA_DIR)")
    p.add_argument("--seconds", type=float, default=600.0, help="training wall clock (default: 10 minutes)")
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--scale", default="exp", choices=["exp", "softplus", "sigmoid"])
    p.add_argument("--label-dropout", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--eval-images", type=int, default=2000)
    p.add_argument("--all-test", action="store_true", help="also score every test image")
    p.add_argument("--classify-images", type=int, default=500)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for the sample grid")
    p.add_argument("--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te, levels = load(args.data, args.data_dir)
    flow = flows.TarFlow(
        tuple(x_tr.shape[1:]),
        patch=args.patch,
        transforms=args.blocks,
        hidden=(args.width,) * args.layers,
        num_classes=10,
        scale=args.scale,
        label_dropout=args.label_dropout,
    )
    parameters = sum(p.numel() for p in flow.parameters())
    times = train(flow, x_tr, y_tr, levels, args)
    result = evaluate(flow, x_te, y_te, levels, args)
    samples = result.pop("samples")
    result.update(steps=len(times), median_step_s=statistics.median(times) if times else float("nan"))
    result["parameters"] = parameters
    print(f"TarFlow on {args.data}: {parameters:,} parameters, {args.threads} thread(s), {args.seconds:g} s budget")
    for key, value in result.items():
        print(f"  {key:18s} {value:.4g}" if isinstance(value, float) else f"  {key:18s} {value}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        title = f"TarFlow {args.data}, {result['bits_per_dim']:.3f} bits/dim; column k: class k"
        sample_grid(samples, out / f"tarflow_{args.data}_samples.png", title)
    return result


if __name__ == "__main__":
    main()
