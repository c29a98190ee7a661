"""Fit RealNVP to scikit-learn's digits and report test bits/dim; save a picture of samples.

The digits (8×8, grey levels 0..16) ship inside scikit-learn, so this runs offline. Pixels are
uniformly dequantized to (0, 1), mapped to the real line by a logit layer that is part of the
flow (its log-determinant counts), and modelled by RealNVP, trained in
:class:`flows.train.Trainer` (maximum likelihood on freshly dequantized batches,
``MaximumLikelihood(levels=17)``). Test bits/dim is the dequantization bound for 17 levels,
averaged over several noise draws (``flows.train.runs.evaluate_log_likelihood``).

    python examples/fit_digits.py                 # 60 epochs, writes runs/fit_digits/samples.png
    python examples/fit_digits.py --epochs 2 --out /tmp/digits
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

import flows
from flows.data import DIGITS_LEVELS, load_digits
from flows.train import MaximumLikelihood, PrintMetrics, Trainer
from flows.train.runs import evaluate_log_likelihood


def build_model(*, transforms: int, hidden: int, alpha: float) -> flows.Flow:
    """Logit preprocessing followed by RealNVP couplings on the 64 pixels."""
    realnvp = flows.RealNVP(64, transforms=transforms, hidden=(hidden, hidden))
    return flows.Flow(flows.Chain(flows.Logit(64, alpha=alpha), realnvp.transform), realnvp.base)


def save_samples(model: flows.Flow, path: Path, n: int = 64) -> None:
    """Save an n-image grid of samples (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with flows.evaluating(model), torch.no_grad():
        images = model.sample((n,)).clamp(0, 1).reshape(n, 8, 8)
    side = math.ceil(math.sqrt(n))
    fig, axes = plt.subplots(side, side, figsize=(side, side))
    for ax, image in zip(axes.flat, images, strict=False):
        ax.imshow(image.numpy(), cmap="gray_r", vmin=0, vmax=1)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("RealNVP samples (digits)")
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--time-budget", type=float, default=None, help="stop training after this many seconds")
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--alpha", type=float, default=0.05, help="logit squeeze alpha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("runs/fit_digits"))
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, test = load_digits(test_size=0.2, seed=0)
    model = build_model(transforms=args.transforms, hidden=args.hidden, alpha=args.alpha)
    trainer = Trainer(model, MaximumLikelihood(levels=DIGITS_LEVELS), lr=args.lr, callbacks=[PrintMetrics(10)])
    trainer.fit(train, epochs=args.epochs, batch_size=args.batch_size, time_budget=args.time_budget, seed=args.seed)
    bpd = evaluate_log_likelihood(model, test, levels=DIGITS_LEVELS, draws=10, seed=args.seed + 1)["bits_per_dim"]
    args.out.mkdir(parents=True, exist_ok=True)
    picture = args.out / "samples.png"
    save_samples(model, picture)
    print(f"test bits/dim: {bpd:.3f}  (17 grey levels, {len(test)} test images)")
    print(f"samples written to {picture}")
    return bpd


if __name__ == "__main__":
    main()
