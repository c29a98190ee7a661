"""Test bits/dim on scikit-learn's digits: flows' RealNVP, MAF and NSF against zuko, nflows and normflows.

Protocol (the same for every contender): the 1797 8×8 digits (17 grey levels) split with
``train_test_split(test_size=0.2, random_state=0)``; fresh uniform dequantization noise every
epoch; a logit layer ``logit(α + (1 - 2α) x)`` with ``α = 0.05`` in front of every model, its
log-determinant counted; Adam (lr 1e-3), batch 128, a fixed number of epochs, one thread. Models
train **interleaved** (one epoch of each in turn, the same data stream for all), so that wall
times are comparable on a shared machine; only training time is counted. Test bits/dim is the
dequantization bound averaged over 10 noise draws, evaluated in eval mode.

Contenders (``--models``; the library contenders at ``--transforms``/``--hidden``, zuko's defaults):

* ``flows-realnvp``, ``flows-maf``, ``flows-nsf`` (autoregressive), ``flows-nsf-c`` (coupling);
* ``flows-best``: the configuration we recommend for this data (``--best-*`` options): an
  autoregressive NSF with spline bound 3 (the logit's range is ±2.94); its feature orders (random
  per layer or alternating), dropout and hidden widths are **chosen on a validation split**, never on
  the test split: ``--select`` holds out ``--val-size`` of the training images, trains every
  candidate of ``GRID`` on the rest, prints their validation bits/dim, and uses the best one for
  ``flows-best`` (trained on the whole training split like every contender, tested once). Without
  ``--select`` the ``--best-*`` defaults are used: they are the choice of such a selection run (see
  ``docs/tabular.md`` for the run and its budget);
* ``zuko-nsf``, ``zuko-maf``, ``zuko-realnvp``, ``nflows-maf``, ``normflows-realnvp``;
* ``gaussian``: the full-covariance Gaussian fitted in closed form (a floor any flow should beat).

    python benchmarks/digits_density.py                         # all contenders, 60 epochs, ~10 min
    python benchmarks/digits_density.py --models flows-best zuko-nsf
    python benchmarks/digits_density.py --epochs 2 --models flows-nsf gaussian
    python benchmarks/digits_density.py --select --models gaussian flows-nsf flows-best   # choose on validation
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import _harness
import torch
from _harness import Contender, print_table, test_bits_per_dim, train_epoch
from torch import Tensor, nn

import flows
from flows.data import DIGITS_LEVELS, load_digits, uniform_dequantize
from flows.metrics import bits_per_dim

FEATURES = 64
ALPHA = 0.05


class Logit(nn.Module):
    """``x ↦ (logit(α + (1 - 2α)x), log-det)`` for peers that have no such layer (flows' own Logit)."""

    def __init__(self) -> None:
        super().__init__()
        self.logit = flows.Logit(FEATURES, alpha=ALPHA)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.logit.forward_and_log_det(x)


class Peer(nn.Module):
    """A peer library's flow behind the shared logit layer: ``log_prob`` of data in ``[0, 1)``."""

    def __init__(self, model: nn.Module, log_prob: Callable[[nn.Module, Tensor], Tensor]) -> None:
        super().__init__()
        self.model, self._log_prob, self.logit = model, log_prob, Logit()

    def log_prob(self, x: Tensor) -> Tensor:
        y, ladj = self.logit(x)
        return self._log_prob(self.model, y) + ladj


def ours(flow: flows.Flow) -> flows.Flow:
    """Put flows' Logit layer in front of a builder's transform."""
    return flows.Flow(flows.Chain(flows.Logit(FEATURES, alpha=ALPHA), flow.transform), flow.base)


class Gaussian(nn.Module):
    """Full-covariance Gaussian on the logit scale, fitted by maximum likelihood in closed form."""

    def __init__(self, train: Tensor, generator: torch.Generator) -> None:
        super().__init__()
        self.logit = Logit()
        y, _ = self.logit(uniform_dequantize(train, DIGITS_LEVELS, generator=generator).double())
        cov = torch.cov(y.T) + 1e-6 * torch.eye(FEATURES, dtype=y.dtype)
        self.dist = torch.distributions.MultivariateNormal(y.mean(0).float(), cov.float())

    def log_prob(self, x: Tensor) -> Tensor:
        y, ladj = self.logit(x)
        return self.dist.log_prob(y) + ladj


def best_nsf(hidden: list[int], dropout: float, randperm: bool, args: argparse.Namespace) -> flows.Flow:
    """The recommended autoregressive NSF with the given widths, dropout and feature orders."""
    return ours(
        flows.NSF(
            FEATURES,
            transforms=args.best_transforms,
            hidden=tuple(hidden),
            bins=args.best_bins,
            bound=args.best_bound,
            randperm=randperm,
            dropout=dropout,
            generator=torch.Generator().manual_seed(args.seed),
        )
    )


# Candidates of ``--select`` (feature orders, dropout, hidden widths); ``--best-hidden`` is the wide one.
GRID = [(randperm, dropout, wide) for randperm in (False, True) for dropout in (0.0, 0.1) for wide in (False, True)]


def select_best(args: argparse.Namespace, train: Tensor) -> tuple[bool, float, list[int]]:
    """Choose ``flows-best``'s orders, dropout and widths by validation bits/dim on a split of ``train``.

    The test split is not touched: ``--val-size`` of the training images (a seeded split) score the
    candidates, each trained on the remaining images for ``--select-epochs`` epochs.
    """
    n_val = round(len(train) * args.val_size)
    if not 0 < n_val < len(train):
        raise ValueError(f"expected --val-size in (0, 1) leaving images on both sides, got {args.val_size}")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed + 2))
    fit, val = train[order[n_val:]], train[order[:n_val]]
    epochs = args.select_epochs or args.epochs
    print(f"selection: {len(fit)} fit / {len(val)} validation images (test untouched), {epochs} epochs each")
    print(f"{'orders':<12} {'dropout':>8} {'hidden':>12} {'val bits/dim':>13}")
    scores = {}
    for randperm, dropout, wide in GRID:
        hidden = args.best_hidden if wide else args.hidden
        torch.manual_seed(args.seed)
        model = Contender("candidate", best_nsf(hidden, dropout, randperm, args), lr=args.lr)
        generator = torch.Generator().manual_seed(args.seed)
        for _ in range(epochs):
            train_epoch(model, fit, batch_size=args.batch_size, generator=generator, levels=DIGITS_LEVELS)
        score = test_bits_per_dim(model.model, val, levels=DIGITS_LEVELS, draws=10, seed=args.seed + 1)
        scores[(randperm, dropout, tuple(hidden))] = score
        orders = "random" if randperm else "alternating"
        print(f"{orders:<12} {dropout:8.2f} {','.join(map(str, hidden)):>12} {score:13.3f}")
    randperm, dropout, hidden = min(scores, key=scores.__getitem__)
    print(
        f"chosen for flows-best: {'random' if randperm else 'alternating'} orders, dropout {dropout}, "
        f"hidden {list(hidden)} (validation bits/dim {scores[randperm, dropout, hidden]:.3f})\n"
    )
    return randperm, dropout, list(hidden)


def build(name: str, args: argparse.Namespace) -> nn.Module:
    t, h = args.transforms, tuple(args.hidden)
    if name == "flows-realnvp":
        return ours(flows.RealNVP(FEATURES, transforms=t, hidden=h))
    if name == "flows-maf":
        return ours(flows.MAF(FEATURES, transforms=t, hidden=h))
    if name == "flows-nsf":
        return ours(flows.NSF(FEATURES, transforms=t, hidden=h))
    if name == "flows-nsf-c":
        return ours(flows.NSF(FEATURES, transforms=t, hidden=h, coupling=True))
    if name == "flows-best":
        return best_nsf(args.best_hidden, args.best_dropout, not args.best_alternate, args)
    if name.startswith("zuko-"):
        import zuko

        cls = {"zuko-nsf": zuko.flows.NSF, "zuko-maf": zuko.flows.MAF, "zuko-realnvp": zuko.flows.RealNVP}[name]
        return Peer(cls(FEATURES, transforms=t, hidden_features=h), lambda m, y: m().log_prob(y))
    if name == "nflows-maf":
        from nflows.flows import MaskedAutoregressiveFlow

        model = MaskedAutoregressiveFlow(FEATURES, hidden_features=h[0], num_layers=t, num_blocks_per_layer=len(h))
        return Peer(model, lambda m, y: m.log_prob(y))
    if name == "normflows-realnvp":
        import normflows as nf

        layers: list[nn.Module] = []
        for _ in range(2 * t):  # one coupling per half, as RealNVP's alternating masks
            net = nf.nets.MLP([FEATURES // 2, *h, FEATURES], init_zeros=True)
            layers += [nf.flows.AffineCouplingBlock(net), nf.flows.Permute(FEATURES, mode="swap")]
        model = nf.NormalizingFlow(nf.distributions.DiagGaussian(FEATURES), layers)
        return Peer(model, lambda m, y: m.log_prob(y))
    raise ValueError(f"unknown model {name!r}")


ALL = [
    "gaussian",
    "flows-realnvp",
    "flows-maf",
    "flows-nsf",
    "flows-nsf-c",
    "flows-best",
    "zuko-realnvp",
    "zuko-maf",
    "zuko-nsf",
    "nflows-maf",
    "normflows-realnvp",
]


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    parser = _harness.parser(__doc__, epochs=60)
    parser.add_argument("--models", nargs="+", default=ALL, choices=ALL)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--transforms", type=int, default=3, help="layers of the library contenders (zuko's default)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="hidden widths (zuko's default)")
    parser.add_argument("--best-transforms", type=int, default=3)
    parser.add_argument("--best-hidden", type=int, nargs="+", default=[160, 160])
    parser.add_argument("--best-bins", type=int, default=8)
    parser.add_argument("--best-bound", type=float, default=3.0, help="logit(0.05) = -2.94: the data's range")
    parser.add_argument("--best-dropout", type=float, default=0.0)
    parser.add_argument("--best-alternate", action="store_true", help="alternating orders instead of random ones")
    parser.add_argument("--select", action="store_true", help="choose flows-best's options on a validation split")
    parser.add_argument("--val-size", type=float, default=0.2, help="fraction of the training images for --select")
    parser.add_argument("--select-epochs", type=int, default=0, help="epochs per --select candidate (0: --epochs)")
    parser.add_argument("--split-seed", type=int, default=0, help="random_state of the split (0: the benchmark's)")
    args = _harness.setup(parser.parse_args(argv))

    train, test = load_digits(test_size=0.2, seed=args.split_seed)
    if args.select and "flows-best" in args.models:
        randperm, args.best_dropout, args.best_hidden = select_best(args, train)
        args.best_alternate = not randperm
    contenders: dict[str, Contender] = {}
    generators = {}
    for name in args.models:
        torch.manual_seed(args.seed)
        generators[name] = torch.Generator().manual_seed(args.seed)
        model = Gaussian(train, generators[name]) if name == "gaussian" else build(name, args)
        contenders[name] = Contender(name, model, lr=args.lr)  # the closed-form Gaussian has nothing to train
    print(
        f"digits: {len(train)} train / {len(test)} test, {args.epochs} epochs, batch {args.batch_size}, "
        f"Adam {args.lr:g}, logit alpha {ALPHA}, {torch.get_num_threads()} thread(s), interleaved"
    )
    trained = [c for c in contenders.values() if c.optimizer is not None]
    for epoch in range(args.epochs):
        losses = {
            c.name: train_epoch(
                c, train, batch_size=args.batch_size, generator=generators[c.name], levels=DIGITS_LEVELS
            )
            for c in trained
        }
        if (epoch + 1) % 10 == 0 or epoch + 1 == args.epochs:
            shown = "  ".join(
                f"{n} {float(bits_per_dim(torch.tensor(-v), FEATURES, DIGITS_LEVELS)):.2f}" for n, v in losses.items()
            )
            print(f"epoch {epoch + 1:3d} train bits/dim: {shown}")
    models = {name: c.model for name, c in contenders.items()}
    seconds = {name: sum(c.epoch_times) for name, c in contenders.items()}
    results = {
        name: (test_bits_per_dim(m, test, levels=DIGITS_LEVELS, draws=10, seed=args.seed + 1), seconds[name])
        for name, m in models.items()
    }
    reference = results.get("zuko-nsf", (math.nan, math.nan))[1]
    rows = [
        {
            "model": name,
            "params": sum(p.numel() for p in models[name].parameters()),
            "bpd": bpd,
            "seconds": secs,
            "ratio": secs / reference if reference else math.nan,
        }
        for name, (bpd, secs) in sorted(results.items(), key=lambda item: item[1][0])
    ]
    columns = [("model", "model", "s"), ("params", "params", "d"), ("bpd", "test bits/dim", ".3f")]
    print_table(rows, [*columns, ("seconds", "train s", ".1f"), ("ratio", "x zuko-nsf time", ".2f")])
    return results


if __name__ == "__main__":
    main()
