"""Fit a continuous normalizing flow (FFJORD) to a 2-D toy and plot its density and samples.

The flow is one CNF block: an ODE whose time-dependent field (an MLP of ``[z, t]``) carries the
data to a standard normal over t in [0, 1], after a fixed standardisation of the data (inside the
flow, so densities are in data units). In 2-D the trace of the Jacobian is computed exactly.
``--rnode`` adds the RNODE kinetic-energy and Jacobian-Frobenius penalties (Finlay et al. 2020),
which keep the dynamics simple and the number of function evaluations (NFE) of the solver low.
Training runs on :class:`flows.train.Trainer`, which adds the penalties to the loss.

    python examples/cnf_toy.py                          # moons, 100 epochs (~5 min on one core)
    python examples/cnf_toy.py --rnode 0.01 --out runs/cnf_toy_rnode
    python examples/cnf_toy.py --data circles --time-budget 120
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

import flows
from flows.bijections.continuous import total_nfe
from flows.data import load_dataset
from flows.train import PrintMetrics, RecordNFE, Trainer
from flows.train.runs import evaluate_log_likelihood, model_for_data


def save_plot(model: flows.Flow, data: torch.Tensor, path: Path, title: str) -> None:
    """Density on a grid, model samples and data side by side (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = data.min(0).values - 0.5, data.max(0).values + 0.5
    xs, ys = torch.linspace(low[0], high[0], 100), torch.linspace(low[1], high[1], 100)
    grid = torch.cartesian_prod(xs, ys)
    with flows.evaluating(model), torch.no_grad():
        density = model.log_prob(grid).exp().reshape(100, 100).T
        samples = model.sample((2000,))
    extent = (float(low[0]), float(high[0]), float(low[1]), float(high[1]))
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    axes[0].imshow(density.numpy(), origin="lower", extent=extent, aspect="auto", cmap="viridis")
    axes[0].set_title("model density")
    axes[1].scatter(*samples.T.numpy(), s=1)
    axes[1].set_title("model samples")
    axes[2].scatter(*data.T.numpy(), s=1, color="k")
    axes[2].set_title("training data")
    for ax in axes[1:]:
        ax.set_xlim(extent[:2])
        ax.set_ylim(extent[2:])
    fig.suptitle(title)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("moons", "circles"), default="moons")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--time-budget", type=float, default=None, help="stop training after this many seconds")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--rnode", type=float, default=0.0, help="RNODE weight (kinetic and Jacobian)")
    parser.add_argument("--limit", type=int, default=None, help="use only this many points of each split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/cnf_toy"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = load_dataset(args.data, seed=args.seed)
    train, val, test = (t[: args.limit] for t in (data.train, data.val, data.test))
    model = model_for_data(
        data, "FFJORD", hidden=[args.hidden, args.hidden], trace="exact", kinetic=args.rnode, jacobian=args.rnode
    )
    print(f"{data.describe()}; {sum(p.numel() for p in model.parameters())} parameters")
    every = max(1, args.epochs // 10)
    trainer = Trainer(model, lr=args.lr, progress=False, callbacks=[RecordNFE(), PrintMetrics(every)])
    trainer.fit(train, val, epochs=args.epochs, batch_size=args.batch_size, time_budget=args.time_budget)

    result = evaluate_log_likelihood(model, test)
    nll = -result["log_likelihood"]
    print(f"test NLL: {nll:.3f} ± {result['stderr']:.3f} nats  (NFE {total_nfe(model)}, {len(test)} test points)")
    args.out.mkdir(parents=True, exist_ok=True)
    picture = args.out / "density.png"
    save_plot(model, train, picture, f"FFJORD on {args.data}, test NLL {nll:.3f}")
    print(f"density and samples written to {picture}")
    if not math.isfinite(nll):
        raise RuntimeError("the test NLL is not finite")
    return nll


if __name__ == "__main__":
    main()
