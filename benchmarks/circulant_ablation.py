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

import statistics

import _harness
import torch
from _harness import Contender, print_table, test_bits_per_dim, train_epoch

import flows
from flows.bijections import alternating_mask
from flows.data import DIGITS_LEVELS, load_digits

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


def train(model: flows.Flow, data: torch.Tensor, *, epochs: int, batch_size: int, lr: float, seed: int) -> float:
    """Maximum-likelihood training in the neutral loop; returns the seconds spent per epoch."""
    contender = Contender("mixer", model, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        train_epoch(contender, data, batch_size=batch_size, generator=generator, levels=DIGITS_LEVELS)
    return sum(contender.epoch_times) / max(epochs, 1)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = _harness.parser(__doc__, seed=None, epochs=100)
    parser.add_argument("--mixers", nargs="+", default=list(MIXERS), choices=MIXERS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = _harness.setup(parser.parse_args(argv))
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
            bpd = test_bits_per_dim(model, test_data, levels=DIGITS_LEVELS, draws=10, seed=1000 + seed)
            runs[kind].append((bpd, seconds))
            print(f"  seed {seed}  {kind:<12} test bits/dim {bpd:.4f}  {seconds:.3f} s/epoch", flush=True)

    base = statistics.median(s for _, s in runs[args.mixers[0]])
    results: dict[str, dict[str, float]] = {}
    rows = []
    for kind, values in runs.items():
        bpds = [b for b, _ in values]
        seconds = statistics.median(s for _, s in values)
        params = sum(
            p.numel() for p in build(kind, transforms=args.transforms, hidden=args.hidden, seed=0).parameters()
        )
        sd = statistics.stdev(bpds) if len(bpds) > 1 else float("nan")
        results[kind] = {"bpd": statistics.mean(bpds), "bpd_sd": sd, "seconds_per_epoch": seconds, "params": params}
        bpd = f"{statistics.mean(bpds):.4f} ± {sd:.4f}"
        rows.append(
            {"mixer": kind, "params": params, "bpd": bpd, "seconds": seconds, "ratio": f"{seconds / base:.2f}x"}
        )
    columns = [("mixer", "mixer", "s"), ("params", "params", "d"), ("bpd", "test bits/dim", "s")]
    print_table(rows, [*columns, ("seconds", "s/epoch", ".3f"), ("ratio", "time ratio", "s")])
    return results


if __name__ == "__main__":
    main()
