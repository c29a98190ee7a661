"""Shift-invariant signals on a ring: where a circulant-diagonal (CDFlow) layer has the right inductive bias.

Each signal lives on a ring of ``n`` sites: a weak smooth stationary Gaussian field (white noise
convolved with a fixed periodic kernel, standard deviation 0.3), plus a half-sine pulse of width 8
and amplitude uniform in [2, 3] at a uniformly random cyclic position, plus white noise of standard
deviation 0.05. The distribution is invariant under cyclic shifts, so its covariance is circulant:
the linear part of the best model is a circulant, which ``CirculantDiagonal`` holds with ``O(n)``
parameters where ``LULinear`` needs ``n²``; the pulse makes the data far from Gaussian.

Models (same base N(0, I), same optimiser, best validation checkpoint, test NLL in nats per site):

* Gaussian models: ``Affine`` (diagonal), ``LULinear`` (any covariance), ``CirculantDiagonal``
  (``m = 2``); and two closed-form references, the full-covariance Gaussian MLE and the
  shift-averaged (circulant) Gaussian MLE;
* coupling flows: affine couplings with alternating masks, each preceded by a random permutation,
  an ``LULinear`` or a ``CirculantDiagonal`` mixer.

The training loop is written out rather than run by :class:`flows.train.Trainer`: it validates
every ``--eval-every`` steps (not once per pass over the data) and keeps the best parameters,
with the same random mini-batches for every model.

    python examples/periodic_signals.py                       # n = 64, 512 training signals, ~2 min
    python examples/periodic_signals.py --train-size 4096     # more data
    python examples/periodic_signals.py --steps 50 --models cd-gaussian --out /tmp/ring
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch

import flows
from flows.bijections import alternating_mask

MODELS = ("diagonal", "lu-gaussian", "cd-gaussian", "coupling-permutation", "coupling-lu", "coupling-cd")


def ring_signals(num: int, n: int, *, generator: torch.Generator) -> torch.Tensor:
    """``num`` shift-invariant signals of length ``n``: smooth stationary field + randomly placed pulse + noise."""
    sites = torch.arange(n, dtype=torch.float64)
    distance = torch.minimum(sites, n - sites)  # distance to site 0 around the ring
    smooth = torch.exp(-0.5 * (distance / 2.0) ** 2)
    smooth = smooth / smooth.norm()
    field = 0.3 * torch.fft.irfft(
        torch.fft.rfft(smooth) * torch.fft.rfft(torch.randn(num, n, generator=generator, dtype=torch.float64)), n=n
    )
    pulse = torch.where(sites < 8, torch.sin(math.pi * sites / 8), torch.zeros(n, dtype=torch.float64))
    shifts = torch.randint(0, n, (num,), generator=generator)
    pulses = torch.stack([torch.roll(pulse, int(s)) for s in shifts])
    amplitude = 2.0 + torch.rand(num, 1, generator=generator, dtype=torch.float64)
    noise = 0.05 * torch.randn(num, n, generator=generator, dtype=torch.float64)
    return (field + amplitude * pulses + noise).float()


def build(kind: str, n: int, *, transforms: int, hidden: int, generator: torch.Generator) -> flows.Flow:
    """One of :data:`MODELS` on signals of length ``n``."""
    if kind == "diagonal":
        layers: list[flows.Bijection] = [flows.Affine(n)]
    elif kind == "lu-gaussian":
        layers = [flows.LULinear(n)]
    elif kind == "cd-gaussian":
        layers = [flows.CirculantDiagonal(n, factors=2)]
    elif kind.startswith("coupling-"):
        mixer = kind.removeprefix("coupling-")
        layers = []
        for i in range(transforms):
            if mixer == "permutation":
                layers.append(flows.Permutation(n, generator=generator))
            elif mixer == "lu":
                layers.append(flows.LULinear(n))
            else:
                layers.append(flows.CirculantDiagonal(n, factors=2))
            mask = alternating_mask(n, keep_even=i % 2 == 0)
            layers.append(flows.AffineCoupling(n, mask=mask, hidden=(hidden, hidden)))
    else:
        raise ValueError(f"expected a model in {MODELS}, got {kind!r}")
    return flows.Flow(flows.Chain(*layers), flows.StandardNormal(n))


@torch.no_grad()
def nll_per_site(model: flows.Flow, x: torch.Tensor) -> float:
    with flows.evaluating(model):
        return float(-model.log_prob(x).mean() / x.shape[-1])


def gaussian_nll(train: torch.Tensor, test: torch.Tensor, *, circulant: bool) -> float:
    """Test NLL per site of the Gaussian MLE fitted on ``train`` (optionally averaged over cyclic shifts)."""
    train, test = train.double(), test.double()
    n = train.shape[-1]
    if circulant:  # the MLE among shift-invariant Gaussians: constant mean, shift-averaged covariance
        mean = train.mean().expand(n)
        centred = train - mean
        cov = sum(torch.roll(centred, k, dims=-1).T @ torch.roll(centred, k, dims=-1) for k in range(n))
        cov = cov / (n * len(train))
    else:
        mean = train.mean(0)
        cov = torch.cov(train.T, correction=0)
    dist = torch.distributions.MultivariateNormal(mean, covariance_matrix=cov)
    return float(-dist.log_prob(test).mean() / n)


def fit(model: flows.Flow, train: torch.Tensor, val: torch.Tensor, args: argparse.Namespace, seed: int) -> float:
    """Adam on the NLL; keeps the parameters with the best validation NLL. Returns the seconds spent."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(seed)
    best, best_state = math.inf, copy.deepcopy(model.state_dict())
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        model.train()
        batch = train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]
        loss = -model.log_prob(batch).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            val_nll = nll_per_site(model, val)
            if val_nll < best:
                best, best_state = val_nll, copy.deepcopy(model.state_dict())
        if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
            print(f"  ({args.time_budget:g} s budget reached after {step} steps)")
            break
    model.load_state_dict(best_state)
    return time.perf_counter() - start


def save_samples(data: torch.Tensor, samples: dict[str, torch.Tensor], path: Path) -> None:
    """Plot a few data signals next to samples of each model (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {"data": data, **samples}
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 1.6 * len(panels)), sharex=True, sharey=True)
    for ax, (name, signals) in zip(axes, panels.items(), strict=True):
        for s in signals[:4]:
            ax.plot(s.numpy(), lw=1)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1].set_xlabel("site on the ring")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64, help="ring size (sites per signal)")
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--val-size", type=int, default=1024)
    parser.add_argument("--test-size", type=int, default=4096)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--time-budget", type=float, default=None, help="seconds per model")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--transforms", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("runs/periodic_signals"))
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    data_gen = torch.Generator().manual_seed(args.seed)
    train = ring_signals(args.train_size, args.n, generator=data_gen)
    val = ring_signals(args.val_size, args.n, generator=data_gen)
    test = ring_signals(args.test_size, args.n, generator=data_gen)
    print(f"ring of {args.n} sites: {len(train)} train / {len(val)} val / {len(test)} test signals")
    print(f"{'model':<22}{'params':>8}{'test NLL/site':>15}{'seconds':>9}")
    results: dict[str, float] = {}
    for name, circulant in (("gaussian-mle-full", False), ("gaussian-mle-circulant", True)):
        results[name] = gaussian_nll(train, test, circulant=circulant)
        print(f"{name:<22}{'-':>8}{results[name]:>15.4f}{'-':>9}")
    samples: dict[str, torch.Tensor] = {}
    for kind in args.models:
        torch.manual_seed(args.seed)
        model = build(kind, args.n, transforms=args.transforms, hidden=args.hidden, generator=torch.Generator())
        seconds = fit(model, train, val, args, seed=args.seed)
        results[kind] = nll_per_site(model, test)
        params = sum(p.numel() for p in model.parameters())
        print(f"{kind:<22}{params:>8}{results[kind]:>15.4f}{seconds:>9.1f}", flush=True)
        with flows.evaluating(model):
            samples[kind] = model.sample((4,))
    args.out.mkdir(parents=True, exist_ok=True)
    picture = args.out / "samples.png"
    save_samples(test, samples, picture)
    print(f"samples written to {picture}")
    return results


if __name__ == "__main__":
    main()
