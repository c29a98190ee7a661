"""Free-form injective flow (FIF) on a sine manifold, against a full-dimensional RealNVP.

``--dim 1``: the FIF toy, points (t, sin(πt/2)) with t ~ N(0, 1), a curve in R^2.
``--dim 2``: a wavy sheet (t1, t2, sin(πt1/2)·cos(πt2/2)) in R^3.

Both models see the same training data with the same Gaussian training noise (σ = 0.1). Reported
on held-out data: the FIF reconstruction error, its exact on-manifold NLL next to the true one, the
mean distance of samples to the manifold for both models (FIF samples lie on the learned
manifold; RealNVP's spread around it), and a picture of the samples.

    python examples/injective_sine.py                    # the curve, 3000 steps per model
    python examples/injective_sine.py --dim 2            # the sheet in R^3
    python examples/injective_sine.py --steps 100 --out /tmp/sine
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch

import flows
from flows.data import SineManifold
from flows.train import PrintMetrics, Trainer
from flows.train.batching import split_batch


def train(
    model: torch.nn.Module, loss_fn: Callable[[torch.Tensor], torch.Tensor], data: torch.Tensor, args, label: str
) -> None:
    """In :class:`flows.train.Trainer`: Adam, a cosine schedule over the steps, gradient clipping at 10."""
    epochs = math.ceil(args.steps / math.ceil(len(data) / args.batch_size))
    print(f"  {label}:")
    trainer = Trainer(
        model,
        lambda model, batch: loss_fn(split_batch(batch)[0]).mean(),
        lr=args.lr,
        scheduler=lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps),
        scheduler_interval="step",
        clip_grad_norm=10.0,
        callbacks=[PrintMetrics(max(1, epochs // 5))],
        progress=False,
    )
    trainer.fit(data, batch_size=args.batch_size, max_steps=args.steps, time_budget=args.time_budget, seed=args.seed)
    if trainer.step < args.steps:
        print(f"  {label}: time budget of {args.time_budget:g} s reached after {trainer.step} steps")


def save_picture(path: Path, manifold: SineManifold, data: torch.Tensor, samples: dict[str, torch.Tensor]) -> None:
    """Samples of each model over the data and the true manifold (matplotlib imported here only).

    For the sheet in R^3 the top row is a 3-D view and the bottom row the slice |x2| < 0.2 seen
    from the side, where the thickness of a sample cloud around the manifold shows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = manifold.dim
    fig = plt.figure(figsize=(4.5 * len(samples), 4 * rows))
    for i, (name, x) in enumerate(samples.items()):
        if rows == 2:
            ax = fig.add_subplot(2, len(samples), i + 1, projection="3d")
            ax.scatter(*x.T.numpy(), s=1, alpha=0.6, c=x[:, 2].numpy(), cmap="viridis", vmin=-1, vmax=1)
            ax.set(xlim=(-3, 3), ylim=(-3, 3), zlim=(-1.5, 1.5), title=f"{name} samples")
            ax.view_init(elev=25, azim=-60)
            ax = fig.add_subplot(2, len(samples), len(samples) + i + 1)
            background, x = (v[v[:, 1].abs() < 0.2][:, [0, 2]] for v in (data, x))
            title = f"{name}: slice |x2| < 0.2"
        else:
            ax = fig.add_subplot(1, len(samples), i + 1)
            background, title = data, f"{name} samples"
        t = torch.zeros(400, manifold.dim)
        t[:, 0] = torch.linspace(-3.5, 3.5, 400)
        curve = manifold.embed(t)[:, [0, manifold.dim]]
        ax.scatter(*background[:2000].T.numpy(), s=2, color="0.8", label="noisy training data")
        ax.scatter(*x.T.numpy(), s=2, color="C3", label="samples")
        ax.plot(*curve.T.numpy(), color="k", lw=0.6, label="true manifold")
        ax.set(xlim=(-3.5, 3.5), ylim=(-2, 2), title=title)
        ax.legend(loc="lower right", fontsize=7, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=1, choices=(1, 2), help="manifold dimension")
    parser.add_argument("--steps", type=int, default=3000, help="training steps per model")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds of training per model")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--noise", type=float, default=0.1, help="training noise σ (both models)")
    parser.add_argument("--beta", type=float, default=10.0, help="FIF reconstruction weight")
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/injective_sine"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    manifold = SineManifold(args.dim)
    features, sigma = manifold.features, args.noise
    train_data = manifold.sample(args.train_size, generator=torch.Generator().manual_seed(args.seed))
    test = manifold.sample(args.test_size, generator=torch.Generator().manual_seed(args.seed + 1))
    noisy_test = test + sigma * torch.randn(test.shape, generator=torch.Generator().manual_seed(args.seed + 2))
    hidden = (args.hidden, args.hidden)

    fif = flows.FreeFormInjectiveFlow(
        features, latent_features=args.dim, hidden=hidden, beta=args.beta, noise_std=sigma
    )
    realnvp = flows.RealNVP(features, transforms=8, hidden=hidden)
    print(f"FIF ({args.dim}-D manifold in R^{features}):")
    train(fif, fif.loss, train_data, args, "FIF")
    print("RealNVP on the same noisy data:")
    train(realnvp, lambda x: -realnvp.log_prob(x + sigma * torch.randn_like(x)), train_data, args, "RealNVP")

    with torch.no_grad(), flows.evaluating(fif), flows.evaluating(realnvp):
        reconstruction = (fif.reconstruct(test) - test).square().sum(-1).mean()
        nll_manifold = -fif.log_prob(test).mean()
        # full-space density of the noisy data ≈ on-manifold density × normal noise across the manifold
        residual = (noisy_test - fif.reconstruct(noisy_test)).square().sum(-1)
        codim = features - args.dim
        log_noisy = (
            fif.log_prob(noisy_test) - residual / (2 * sigma**2) - 0.5 * codim * math.log(2 * math.pi * sigma**2)
        )
        samples = {"FIF": fif.sample((args.test_size,)), "RealNVP": realnvp.sample((args.test_size,))}
        results = {
            "fif_reconstruction_mse": float(reconstruction),
            "fif_nll_on_manifold": float(nll_manifold),
            "true_nll_on_manifold": float(-manifold.log_prob(test).mean()),
            "fif_nll_noisy_approx": float(-log_noisy.mean()),
            "realnvp_nll_noisy": float(-realnvp.log_prob(noisy_test).mean()),
            "fif_sample_distance": float(manifold.distance(samples["FIF"]).mean()),
            "realnvp_sample_distance": float(manifold.distance(samples["RealNVP"]).mean()),
            "noisy_data_distance": float(manifold.distance(noisy_test).mean()),
        }

    print(f"\nheld-out results ({args.test_size} points, training noise σ = {sigma:g}):")
    print(f"  FIF reconstruction error  E||x - g(f(x))||^2   {results['fif_reconstruction_mse']:.5f}")
    print(
        f"  on-manifold NLL (nats)    FIF {results['fif_nll_on_manifold']:.4f}   "
        f"true {results['true_nll_on_manifold']:.4f}"
    )
    print(
        f"  noisy-data NLL in R^{features} (nats)  FIF (≈, normal noise across the manifold) "
        f"{results['fif_nll_noisy_approx']:.4f}   RealNVP {results['realnvp_nll_noisy']:.4f}"
    )
    print(
        f"  mean distance of samples to the manifold   FIF {results['fif_sample_distance']:.4f}   "
        f"RealNVP {results['realnvp_sample_distance']:.4f}   (noisy data: {results['noisy_data_distance']:.4f}, "
        f"target for FIF: <= {2 * sigma:g})"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    picture = args.out / f"samples_dim{args.dim}.png"
    save_picture(picture, manifold, train_data + sigma * torch.randn_like(train_data), samples)
    print(f"samples written to {picture}")
    return results


if __name__ == "__main__":
    main()
