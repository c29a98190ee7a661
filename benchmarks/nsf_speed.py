"""Autoregressive NSF speed: training step against its conditioner floor and zuko; sampling against zuko.

Default configuration (the issue's): ``D = 64`` features, 8 autoregressive rational-quadratic
spline layers with 8 bins, MADE hidden widths ``(256, 256)``, batch 512, Adam, one thread.

* **train step** (forward ``log_prob``, backward, Adam step), interleaved round after round:
  ``floor`` is the bare conditioner networks, 8 plain ``nn.Linear`` stacks ``64 → 256 → 256 →
  8·(3K-1)`` with the same matmuls and Adam on a dummy loss; ``MADE floor`` is our 8 masked MADEs
  alone (the floor plus masking); ``flows NSF`` and ``zuko NSF`` are the full flows.
* **log_prob** without gradients, same batch.
* **sample**: 2048 samples (``D`` sequential steps per layer), ours against zuko's, interleaved.

Medians in ms and ratios are printed side by side, for wall-clock time and for the process's CPU
time (``time.process_time``; with one thread it excludes the time the process waits for a core, so
it is much steadier on a loaded machine). Only the ratios within one run mean anything.

    python benchmarks/nsf_speed.py                     # ~3 minutes (zuko's sampling dominates)
    python benchmarks/nsf_speed.py --rounds 5 --sample-rounds 1 --features 16
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import _harness
import torch
from _harness import interleaved_times
from torch import nn

import flows


def train_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = loss_fn()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def floor_networks(features: int, transforms: int, hidden: tuple[int, ...], outputs: int) -> nn.ModuleList:
    def net() -> nn.Sequential:
        widths = [features, *hidden, outputs]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    return nn.ModuleList(net() for _ in range(transforms))


def report(title: str, times: dict[str, list[tuple[float, float]]], reference: str) -> dict[str, tuple[float, float]]:
    """Print and return the (wall, CPU) medians; ratios to ``reference`` for both clocks."""
    medians = {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()
    }
    wall_ref, cpu_ref = medians[reference]
    print(f"\n{title} (medians of {len(next(iter(times.values())))} interleaved rounds)")
    print(f"  {'contender':<14} {'wall ms':>10} {'CPU ms':>10}   wall x {reference:<10} CPU x {reference}")
    for name, (wall, cpu) in medians.items():
        print(f"  {name:<14} {1e3 * wall:10.1f} {1e3 * cpu:10.1f}   {wall / wall_ref:17.2f} {cpu / cpu_ref:15.2f}")
    return medians


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = _harness.parser(__doc__)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the step timings")
    parser.add_argument("--sample-rounds", type=int, default=2, help="interleaved rounds of the sampling timings")
    parser.add_argument("--no-zuko", action="store_true", help="skip zuko (not installed, or to save time)")
    args = _harness.setup(parser.parse_args(argv))
    torch.manual_seed(args.seed)
    d, hidden = args.features, tuple(args.hidden)
    x = torch.randn(args.batch, d)
    print(
        f"NSF: D={d}, {args.transforms} autoregressive spline layers, {args.bins} bins, hidden {hidden}, "
        f"batch {args.batch}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )

    ours = flows.NSF(d, transforms=args.transforms, hidden=hidden, bins=args.bins)
    flows.testing.perturb_parameters(ours, 0.01)  # off the identity (timings do not depend on values)
    floor = floor_networks(d, args.transforms, hidden, d * (3 * args.bins - 1))
    bare = flows.NSF(d, transforms=args.transforms, hidden=hidden, bins=args.bins)
    mades = nn.ModuleList(layer.conditioner for layer in bare.transform)
    steps: dict[str, Callable[[], object]] = {
        "floor": train_step(floor, lambda: sum(net(x).mean() for net in floor)),
        "MADE floor": train_step(mades, lambda: sum(made(x).mean() for made in mades)),
        "flows NSF": train_step(ours, lambda: -ours.log_prob(x).mean()),
    }
    densities: dict[str, Callable[[], object]] = {"flows NSF": lambda: ours.log_prob(x)}
    samplers: dict[str, Callable[[], object]] = {"flows NSF": lambda: ours.sample((args.samples,))}
    if not args.no_zuko:
        import zuko

        theirs = zuko.flows.NSF(d, transforms=args.transforms, hidden_features=hidden, bins=args.bins)
        steps["zuko NSF"] = train_step(theirs, lambda: -theirs().log_prob(x).mean())
        densities["zuko NSF"] = lambda: theirs().log_prob(x)
        samplers["zuko NSF"] = lambda: theirs().sample((args.samples,))

    results: dict[str, float] = {}
    step = report("training step", interleaved_times(steps, rounds=args.rounds), "floor")
    with torch.no_grad():
        density = report("log_prob, no grad", interleaved_times(densities, rounds=args.rounds), "flows NSF")
        sample = report(
            f"sample {args.samples}", interleaved_times(samplers, rounds=args.sample_rounds, warmup=0), "flows NSF"
        )
    for clock, i in (("wall", 0), ("cpu", 1)):
        results[f"step_ratio_{clock}"] = step["flows NSF"][i] / step["floor"][i]
    results["step_ratio"] = results["step_ratio_wall"]
    print(
        f"\nflows NSF training step / floor: {results['step_ratio_wall']:.2f} wall, "
        f"{results['step_ratio_cpu']:.2f} CPU (target <= 1.3)"
    )
    print(f"flows NSF sample {args.samples} / its log_prob: {sample['flows NSF'][0] / density['flows NSF'][0]:.1f}")
    if "zuko NSF" in step:
        results["zuko_step_ratio"] = step["zuko NSF"][0] / step["floor"][0]
        results["sampling_speedup"] = sample["zuko NSF"][0] / sample["flows NSF"][0]
        print(
            f"zuko NSF training step / floor: {results['zuko_step_ratio']:.2f} wall, "
            f"{step['zuko NSF'][1] / step['floor'][1]:.2f} CPU"
        )
        print(f"zuko NSF sample {args.samples} / its log_prob: {sample['zuko NSF'][0] / density['zuko NSF'][0]:.1f}")
        print(f"sampling speed-up over zuko: {results['sampling_speedup']:.1f}x wall (target >= 3)")
    return results


if __name__ == "__main__":
    main()
