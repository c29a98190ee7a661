"""Fit RealNVP to scikit-learn's digits and report test bits/dim; save a picture of samples.

The digits (8×8, grey levels 0..16) ship inside scikit-learn, so this runs offline. Pixels are
uniformly dequantized to (0, 1), mapped to the real line by a logit layer that is part of the
flow (its log-determinant counts), and modelled by RealNVP. Test bits/dim is the dequantization
bound for 17 levels, averaged over several noise draws.

    python examples/fit_digits.py                 # 60 epochs, writes runs/fit_digits/samples.png
    python examples/fit_digits.py --epochs 2 --out /tmp/digits
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import flows
from flows.data import DIGITS_LEVELS, load_digits, uniform_dequantize
from flows.metrics import bits_per_dim


def build_model(*, transforms: int, hidden: int, alpha: float) -> flows.Flow:
    """Logit preprocessing followed by RealNVP couplings on the 64 pixels."""
    realnvp = flows.RealNVP(64, transforms=transforms, hidden=(hidden, hidden))
    return flows.Flow(flows.Chain(flows.Logit(64, alpha=alpha), realnvp.transform), realnvp.base)


@torch.no_grad()
def test_bits_per_dim(model: flows.Flow, test: torch.Tensor, draws: int, seed: int) -> float:
    """Average bits/dim over the test set and ``draws`` dequantization noise draws (eval mode)."""
    generator = torch.Generator().manual_seed(seed)
    with flows.evaluating(model):
        log_p = torch.stack(
            [model.log_prob(uniform_dequantize(test, DIGITS_LEVELS, generator=generator)) for _ in range(draws)]
        )
    return float(bits_per_dim(log_p, 64, DIGITS_LEVELS).mean())


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
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train), generator=generator)
        total = 0.0
        for i in range(0, len(train), args.batch_size):
            x = uniform_dequantize(train[order[i : i + args.batch_size]], DIGITS_LEVELS, generator=generator)
            loss = -model.log_prob(x).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(x)
        train_bpd = float(bits_per_dim(torch.tensor(-total / len(train)), 64, DIGITS_LEVELS))
        if (epoch + 1) % 10 == 0 or epoch == 0 or epoch + 1 == args.epochs:
            print(f"epoch {epoch + 1:3d}  train bits/dim {train_bpd:.3f}  ({time.perf_counter() - start:.1f} s)")
        if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
            print(f"time budget of {args.time_budget:g} s reached after {epoch + 1} epochs")
            break

    bpd = test_bits_per_dim(model, test, draws=10, seed=args.seed + 1)
    args.out.mkdir(parents=True, exist_ok=True)
    picture = args.out / "samples.png"
    save_samples(model, picture)
    print(f"test bits/dim: {bpd:.3f}  (17 grey levels, {len(test)} test images)")
    print(f"samples written to {picture}")
    return bpd


if __name__ == "__main__":
    main()
