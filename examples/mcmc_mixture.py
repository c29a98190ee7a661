"""Sample a 4-mode Gaussian mixture in 32-D: MALA stays put, flow-based global-local MCMC mixes.

The target is the 4-mode mixture of Grenioux et al. (2023) (unit covariances, modes about 12 apart).
The chains start **unevenly** (55 % of them in one mode, 15 % in each other), so the mode weights
tell whether a sampler moves between modes. Three samplers get the same budget of target
evaluations per chain:

* MALA: local moves only; it keeps the starting split (mode-weight error ≈ 0.30);
* global-local (the flowMC scheme): one independent-MH move with a RealNVP proposal, then five
  MALA moves, per step; during warm-up the flow is trained on the chains' positions (forward KL),
  starting from the identity;
* NeuTra-MALA with that trained flow: MALA in the flow's latent space. It samples the target
  exactly, but crosses between modes only as far as the flow has made the latent landscape flat.

Pictures (trace of one coordinate from each half, chains over the exact samples) go to ``--out``.

    python examples/mcmc_mixture.py                                # d=32: 2-8 minutes on one shared core
    python examples/mcmc_mixture.py --dim 16 --budget 600 --chains 64
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from flows import RealNVP
from flows.mcmc import IMH, MALA, CountingTarget, GlobalLocal, NeuTra, sample
from flows.metrics import mode_weight_error, mode_weights
from flows.plot import plot_chain_pairs, plot_trace
from flows.targets import GaussianMixture


def uneven_start(target: GaussianMixture, chains: int) -> torch.Tensor:
    """Exact draws from the components, 55 % of the chains in the first mode and 15 % in each other."""
    counts = [int(0.55 * chains), int(0.15 * chains), int(0.15 * chains)]
    counts.append(chains - sum(counts))
    return torch.cat([target.locs[k] + torch.randn(c, target.dim) for k, c in enumerate(counts)])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--budget", type=int, default=2000, help="target evaluations per chain and sampler")
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--transforms", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("runs/mcmc_mixture"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    target = GaussianMixture.four_modes(args.dim)
    counter = CountingTarget(target)
    start = uneven_start(target, args.chains)
    n_local = 5
    flow = RealNVP(args.dim, transforms=args.transforms, hidden=(args.hidden, args.hidden))
    samplers = {
        "MALA": (lambda: MALA(counter, 0.5), args.budget),
        "global-local": (
            lambda: GlobalLocal(
                IMH(counter, flow), MALA(counter, 0.5), local_steps=n_local, train=True, train_steps=2, batch_size=512
            ),
            args.budget // (n_local + 1),
        ),
        "NeuTra-MALA": (lambda: NeuTra(counter, flow, step_size=0.5), args.budget),  # after global-local
    }
    print(f"4-mode mixture in d={args.dim}, {args.chains} chains starting 55/15/15/15 %, budget {args.budget}")
    print(f"{'sampler':14s} {'evals/chain':>11s} {'seconds':>8s} {'accept':>7s}  mode weights               error")
    errors, traces = {}, {}
    for name, (make, steps) in samplers.items():
        counter.reset()
        began = time.perf_counter()
        trace = sample(make(), start, steps - steps // 4, warmup=steps // 4)
        seconds = time.perf_counter() - began
        weights = mode_weights(trace.samples, target.locs)
        errors[name] = mode_weight_error(trace.samples, target.locs)
        traces[name] = trace
        shown = " ".join(f"{w:.3f}" for w in weights.tolist())
        print(
            f"{name:14s} {counter.evaluations / args.chains:11.0f} {seconds:8.1f} {trace.acceptance_rate():7.3f}  "
            f"{shown}  {errors[name]:.3f}"
        )
        if name == "global-local":
            flow.requires_grad_(False)  # frozen from here on

    args.out.mkdir(parents=True, exist_ok=True)
    dims = [0, args.dim // 2]  # one coordinate from each half: the four modes are the four sign pairs
    for name, trace in traces.items():
        slug = name.lower().replace(" ", "_")
        plot_trace(trace, args.out / f"trace_{slug}.png", dims=dims, title=f"{name}: trace")
    reference = target.sample(2000)
    for name in ("MALA", "global-local"):
        plot_chain_pairs(
            traces[name], reference, args.out / f"pairs_{name.lower()}.png", dims=dims, title=f"{name} vs exact"
        )
    print(f"pictures in {args.out}")
    return errors


if __name__ == "__main__":
    main()
