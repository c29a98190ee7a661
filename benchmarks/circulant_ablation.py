"""Density ablation on the digits: the mixing layer between couplings (none, permutation, LU, CirculantDiagonal).

The flow is RealNVP-style on the 64 pixels of scikit-learn's digits: a logit layer, then
``transforms`` affine couplings with alternating masks, each followed by a mixing layer:

* ``none``: nothing (the alternating masks are the only mixing);
* ``permutation``: a fixed random permutation;
* ``lu``: ``LULinear(64, init="orthogonal")`` (Glow's LU-parameterised 1x1 convolution, as a vector layer);
* ``cd2`` / ``cd4``: ``CirculantDiagonal(64, factors=m, init="orthogonal")``.

Every variant trains for the same number of epochs with the same seeds, data order and optimiser;
the script prints test bits/dim (dequantization bound, 17 grey levels, 10 noise draws) as mean ±
standard deviation over seeds, the parameter count, and the training time per epoch (relative to
``none``; all variants run interleaved seed by seed in one process, 1 thread by default).

    python benchmarks/circulant_ablation.py                     # 3 seeds x 5 mixers x 100 epochs
    python benchmarks/circulant_ablation.py --epochs 2 --seeds 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import flows
from flows.bijections import alternating_mask
from flows.data import DIGITS_LEVELS, load_digits, uniform_dequantize
from flows.metrics import bits_per_dim

MIXERS = ("none", "permutation", "lu", "cd2", "cd4")
D = 64


def mixer(kind: str, generator: torch.Generator) -> list[flows.Bijection]:
    """The mixing layer placed after each coupling (an empty list for ``none``)."""
    if kind == "none":
        return []
    if kind == "permutation":
        return [flows.Permutation(D, generator=generator)]
    if kind == "lu":
        return [flows.LULinear(D, init="orthogonal", generator=generator)]
    if kind in ("cd2", "cd4"):
        return [flows.CirculantDiagonal(D, factors=int(kind[2:]), init="orthogonal", generator=generator)]
    raise ValueError(f"expected a mixer in {MIXERS}, got {kind!r}")


def build(kind: str, *, transforms: int, hidden: int, seed: int) -> flows.Flow:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    layers: list[flows.Bijection] = [flows.Logit(D, alpha=0.05)]
    for i in range(transforms):
        mask = alternating_mask(D, keep_even=i % 2 == 0)
        layers.append(flows.AffineCoupling(D, mask=mask, hidden=(hidden, hidden)))
        if i < transforms - 1:
            layers.extend(mixer(kind, generator))
    return flows.Flow(flows.Chain(*layers), flows.StandardNormal(D))


@torch.no_grad()
def test_bpd(model: flows.Flow, test: torch.Tensor, seed: int, draws: int = 10) -> float:
    generator = torch.Generator().manual_seed(seed)
    with flows.evaluating(model):
        log_p = torch.stack(
            [model.log_prob(uniform_dequantize(test, DIGITS_LEVELS, generator=generator)) for _ in range(draws)]
        )
    return float(bits_per_dim(log_p, D, DIGITS_LEVELS).mean())


def train(model: flows.Flow, data: torch.Tensor, *, epochs: int, batch_size: int, lr: float, seed: int) -> float:
    """Maximum-likelihood training; returns the seconds spent per epoch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    start = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        for i in range(0, len(data), batch_size):
            x = uniform_dequantize(data[order[i : i + batch_size]], DIGITS_LEVELS, generator=generator)
            loss = -model.log_prob(x).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return (time.perf_counter() - start) / max(epochs, 1)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", nargs="+", default=list(MIXERS), choices=MIXERS)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    train_data, test_data = load_digits(test_size=0.2, seed=0)
    print(
        f"digits: {len(train_data)} train / {len(test_data)} test, {args.transforms} couplings "
        f"(hidden {args.hidden}x2), {args.epochs} epochs, {args.seeds} seed(s), {torch.get_num_threads()} thread(s)"
    )
    runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in args.mixers}
    for seed in range(args.seeds):
        for kind in args.mixers:  # interleaved: seed by seed, every mixer
            model = build(kind, transforms=args.transforms, hidden=args.hidden, seed=seed)
            seconds = train(model, train_data, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed)
            bpd = test_bpd(model, test_data, seed=1000 + seed)
            runs[kind].append((bpd, seconds))
            print(f"  seed {seed}  {kind:<12} test bits/dim {bpd:.4f}  {seconds:.3f} s/epoch", flush=True)

    base = statistics.median(s for _, s in runs[args.mixers[0]])
    print(f"\n{'mixer':<12}{'params':>9}{'test bits/dim':>22}{'s/epoch':>10}{'time ratio':>12}")
    results: dict[str, dict[str, float]] = {}
    for kind, values in runs.items():
        bpds = [b for b, _ in values]
        seconds = statistics.median(s for _, s in values)
        params = sum(
            p.numel() for p in build(kind, transforms=args.transforms, hidden=args.hidden, seed=0).parameters()
        )
        sd = statistics.stdev(bpds) if len(bpds) > 1 else float("nan")
        print(f"{kind:<12}{params:>9}{statistics.mean(bpds):>14.4f} ± {sd:.4f}{seconds:>10.3f}{seconds / base:>11.2f}x")
        results[kind] = {"bpd": statistics.mean(bpds), "bpd_sd": sd, "seconds_per_epoch": seconds, "params": params}
    return results


if __name__ == "__main__":
    main()
