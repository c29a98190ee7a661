"""Digits bits/dim and training time at equal epochs: our Glow variants against normflows and nflows.

All contenders have the same multi-scale architecture on the 8×8 digits (17 grey levels): ``levels``
scales of squeeze → ``steps`` × (ActNorm → 1×1 convolution → affine coupling) → split, with the
same coupling network (3×3, 1×1, 3×3 convolutions with ``hidden`` channels, zero-initialised
output), the same logit preprocessing (Glow's default alpha 1e-6, its log-determinant counted), the same uniform
dequantization noise, batches, optimiser (Adam) and seeds. What differs is the library:

* ``ours/...``: :class:`flows.Glow` (Glow's learned conditional prior at each split), with the
  static split or our EIW shuffle, and the dense, LU or circulant channel mixer; the ablation
  ``ours/eiw-weights-only`` keeps EIW's channel weighting but never updates the channel order;
* ``normflows``: ``normflows.MultiscaleFlow`` of ``GlowBlock`` s (LU 1×1 convolutions, sigmoid
  coupling scale) with ``GlowBase`` priors (per-channel learned Gaussians, not conditional);
* ``nflows``: ``MultiscaleCompositeTransform`` of ``ActNorm``, ``OneByOneConvolution`` and
  ``AffineCouplingTransform`` with a standard normal base (no learned prior).

Contenders are trained in turn, one epoch each, round-robin, so that machine load affects all alike.
Times are training time only, single thread (``torch.set_num_threads(1)``). Test bits/dim averages
several dequantization draws, in eval mode. With several seeds, means and standard deviations.

    python benchmarks/image_density.py                     # 30 epochs, 3 seeds, the default contenders
    python benchmarks/image_density.py --epochs 2 --seeds 1 --contenders ours/static/1x1 normflows
    python benchmarks/image_density.py --seeds 1 --first-seed 2   # one seed per run, to split a long job
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import _harness
import torch
from _harness import Contender, print_table, test_bits_per_dim, train_epoch
from torch import Tensor, nn

import flows
from flows.data import DIGITS_LEVELS, load_digits
from flows.nn import ConvNet

SHAPE = (1, 8, 8)
OPTIONAL = ("ours/eiw/lu", "ours/static/circulant-m4")  # run only when named in --contenders
DIMS = 64
LEVELS = DIGITS_LEVELS
ALPHA = 1e-6


def ours(split: str, mixer: str, args: argparse.Namespace, **options) -> Callable[[], tuple[nn.Module, Callable]]:
    def build():
        model = flows.Glow(
            SHAPE,
            scales=args.levels,
            steps=args.steps,
            hidden=(args.hidden, args.hidden),
            split=split,
            mixer=mixer,
            logit_alpha=ALPHA,
            **options,
        )
        return model, model.log_prob

    return build


def _with_logit(peer_log_prob: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """The peers get the same logit preprocessing, its log-determinant added."""
    logit = flows.Logit(SHAPE, alpha=ALPHA)

    def log_prob(x: Tensor) -> Tensor:
        y, ladj = logit.forward_and_log_det(x)
        return peer_log_prob(y) + ladj

    return log_prob


def normflows_glow(args: argparse.Namespace) -> Callable[[], tuple[nn.Module, Callable]]:
    def build():
        import normflows as nf

        c, h, w = SHAPE
        levels = args.levels
        q0, merges, blocks = [], [], []
        for i in range(levels):  # level 0 is the coarsest (normflows' sampling order)
            level = [
                nf.flows.GlowBlock(c * 2 ** (levels + 1 - i), args.hidden, split_mode="channel", scale=True)
                for _ in range(args.steps)
            ]
            blocks.append([*level, nf.flows.Squeeze()])
            if i > 0:
                merges.append(nf.flows.Merge())
                latent = (c * 2 ** (levels - i), h // 2 ** (levels - i), w // 2 ** (levels - i))
            else:
                latent = (c * 2 ** (levels + 1), h // 2**levels, w // 2**levels)
            q0.append(nf.distributions.GlowBase(latent))
        model = nf.MultiscaleFlow(q0, blocks, merges, class_cond=False)
        return model, _with_logit(lambda y: model.log_prob(y, None))

    return build


def nflows_multiscale(args: argparse.Namespace) -> Callable[[], tuple[nn.Module, Callable]]:
    def build():
        from nflows import distributions, transforms
        from nflows.flows import Flow as NflowsFlow

        composite = transforms.MultiscaleCompositeTransform(args.levels, split_dim=1)
        c, h, w = SHAPE
        for _ in range(args.levels):
            c, h, w = 4 * c, h // 2, w // 2
            layers = [transforms.SqueezeTransform()]
            for _ in range(args.steps):
                mask = torch.zeros(c)
                mask[c // 2 :] = 1  # nflows: entries > 0 are transformed

                def net(n_in: int, n_out: int) -> nn.Module:
                    return ConvNet(n_in, n_out, (args.hidden, args.hidden), channels_last=False)  # plain layout

                layers += [
                    transforms.ActNorm(c),
                    transforms.OneByOneConvolution(c),
                    transforms.AffineCouplingTransform(mask, net),
                ]
            shape = composite.add_transform(transforms.CompositeTransform(layers), (c, h, w))
            if shape is not None:
                c, h, w = shape
        model = NflowsFlow(composite, distributions.StandardNormal([DIMS]))
        return model, _with_logit(model.log_prob)

    return build


def contender_builders(args: argparse.Namespace) -> dict[str, Callable[[], tuple[nn.Module, Callable]]]:
    builders = {
        "ours/static/1x1": ours("static", "1x1", args),
        "ours/static/lu": ours("static", "lu", args),
        "ours/eiw/1x1": ours("eiw", "1x1", args),
        "ours/eiw/lu": ours("eiw", "lu", args),
        # ablation: EIW's channel weighting alone, the entropy-informed order never updated
        "ours/eiw-weights-only/1x1": ours("eiw", "1x1", args, eiw_update_steps=0),
        "normflows": normflows_glow(args),
        "nflows": nflows_multiscale(args),
    }
    builders["ours/static/circulant"] = ours("static", "circulant", args)
    # CDFlow ablation (issue 4): the circulant mixer with m = 4 diagonal factors instead of 2
    builders["ours/static/circulant-m4"] = ours("static", "circulant", args, circulant_factors=4)
    return builders


def run_seed(seed: int, names: list[str], args: argparse.Namespace, train: Tensor, test: Tensor) -> dict[str, dict]:
    builders = contender_builders(args)
    contenders = []
    for name in names:
        torch.manual_seed(seed)
        model, log_prob = builders[name]()
        contenders.append(Contender(name, model, log_prob=log_prob, lr=args.lr))
    generators = {c.name: torch.Generator().manual_seed(1000 + seed) for c in contenders}  # same batches for all
    for epoch in range(args.epochs):
        rotation = contenders[epoch % len(contenders) :] + contenders[: epoch % len(contenders)]
        for c in rotation:  # the loss per dimension, as the peers' examples train
            train_epoch(
                c, train, batch_size=args.batch_size, generator=generators[c.name], levels=LEVELS, scale=1 / DIMS
            )
    return {
        c.name: {
            "bpd": test_bits_per_dim(c.model, test, levels=LEVELS, draws=args.draws, seed=7, log_prob=c.log_prob),
            "time": sum(c.epoch_times),
            "epoch_median": statistics.median(c.epoch_times),
            "parameters": c.parameters,
        }
        for c in contenders
    }


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    parser = _harness.parser(__doc__, seed=None, epochs=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1")
    parser.add_argument("--levels", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--draws", type=int, default=5, help="dequantization draws for the test bits/dim")
    parser.add_argument("--contenders", nargs="*", default=None, help="names to run (default: all but ours/eiw/lu)")
    args = _harness.setup(parser.parse_args(argv))
    available = list(contender_builders(args))
    names = args.contenders or [n for n in available if n not in OPTIONAL]
    unknown = sorted(set(names) - set(available))
    if unknown:
        parser.error(f"unknown contenders {unknown}; available: {available}")
    train, test = load_digits(image=True)
    print(
        f"digits {tuple(train.shape)} train / {tuple(test.shape)} test, levels={args.levels} steps={args.steps} "
        f"hidden={args.hidden}, {args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, "
        f"{args.seeds} seed(s), torch threads {torch.get_num_threads()}"
    )
    results: dict[str, list[dict]] = {name: [] for name in names}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name, r in run_seed(seed, names, args, train, test).items():
            results[name].append(r)
            print(f"  seed {seed}  {name:24s} test bpd {r['bpd']:.4f}  train time {r['time']:7.1f} s", flush=True)

    reference = "ours/static/1x1" if "ours/static/1x1" in results else names[0]
    ref_time = statistics.mean(r["time"] for r in results[reference])
    rows = []
    for name, runs in results.items():
        bpds = [r["bpd"] for r in runs]
        spread = f" ± {statistics.stdev(bpds):.4f}" if len(bpds) > 1 else ""
        t = statistics.mean(r["time"] for r in runs)
        rows.append(
            {
                "name": name,
                "params": runs[0]["parameters"],
                "bpd": f"{statistics.mean(bpds):.4f}{spread}",
                "seconds": t,
                "epoch": statistics.median(r["epoch_median"] for r in runs),
                "ratio": t / ref_time,
            }
        )
    columns = [("name", "contender", "s"), ("params", "params", "d"), ("bpd", "test bpd", "s")]
    print_table(
        rows, [*columns, ("seconds", "train s", ".1f"), ("epoch", "s/epoch", ".3f"), ("ratio", "time ratio", ".2f")]
    )
    print(f"(time ratio: mean training time / that of {reference}; bpd: mean ± std over seeds)")
    return results


if __name__ == "__main__":
    main()
