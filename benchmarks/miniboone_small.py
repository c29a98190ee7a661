"""MiniBooNE-small: train on the MAF paper's MiniBooNE *validation* split, report test log-likelihood.

The 29,556-row training split of Papamakarios et al. (2017) is not available offline; the 3,284-row
validation split (already preprocessed: outliers removed, discrete features dropped, standardised)
is used for training and the 3,648-row test split for evaluation. **The numbers are not comparable
to published MINIBOONE results** (MAF −11.75, RQ-NSF −9.22 nats), which train on 9× more data
with early stopping on the validation split.

Protocol: Adam (lr 1e-3), batch 128, a fixed number of epochs, one thread, the contenders trained
interleaved (one epoch each in turn) so that wall times are comparable; test log-likelihood in nats
(mean ± 2 standard errors), evaluated in eval mode.

    FLOWS_DATA_DIR=../shared/data python benchmarks/miniboone_small.py           # 20 epochs, ~4-8 minutes
    FLOWS_DATA_DIR=../shared/data python benchmarks/miniboone_small.py --epochs 50 --models flows-nsf zuko-nsf
    python benchmarks/miniboone_small.py --epochs 5 --models flows-maf --data-dir ../shared/data
"""

from __future__ import annotations

import math

import _harness
import numpy as np
import torch
from _harness import Contender, print_table, train_epoch
from torch import Tensor, nn

import flows
from flows.data import data_file

FEATURES = 43
ALL = ["flows-maf", "flows-nsf", "flows-nsf-c", "zuko-maf", "zuko-nsf"]


class Zuko(nn.Module):
    """A zuko flow with a ``log_prob(x)`` method like flows'."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def log_prob(self, x: Tensor) -> Tensor:
        return self.model().log_prob(x)


def build(name: str, transforms: int, hidden: tuple[int, ...]) -> nn.Module:
    if name == "flows-maf":
        return flows.MAF(FEATURES, transforms=transforms, hidden=hidden)
    if name == "flows-nsf":
        return flows.NSF(FEATURES, transforms=transforms, hidden=hidden)
    if name == "flows-nsf-c":
        return flows.NSF(FEATURES, transforms=transforms, hidden=hidden, coupling=True, lu=True)
    import zuko

    cls = {"zuko-maf": zuko.flows.MAF, "zuko-nsf": zuko.flows.NSF}[name]
    return Zuko(cls(FEATURES, transforms=transforms, hidden_features=hidden))


def load(data_dir: str | None) -> tuple[Tensor, Tensor]:
    with np.load(data_file("miniboone_maf_valtest.npz", data_dir)) as arrays:
        return torch.from_numpy(arrays["val"]).float(), torch.from_numpy(arrays["test"]).float()


@torch.no_grad()
def evaluate(model: nn.Module, data: Tensor) -> tuple[float, float]:
    with flows.evaluating(model):
        log_p = torch.cat([model.log_prob(batch) for batch in data.split(1024)])
    return float(log_p.mean()), float(2 * log_p.std() / math.sqrt(len(log_p)))


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float, float]]:
    parser = _harness.parser(__doc__, epochs=20)
    parser.add_argument("--models", nargs="+", default=ALL, choices=ALL)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--transforms", type=int, default=5)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    parser.add_argument("--data-dir", default=None, help="holds miniboone_maf_valtest.npz (default: FLOWS_DATA_DIR)")
    args = _harness.setup(parser.parse_args(argv))

    train, test = load(args.data_dir)
    contenders, generators = {}, {}
    for name in args.models:
        torch.manual_seed(args.seed)
        contenders[name] = Contender(name, build(name, args.transforms, tuple(args.hidden)), lr=args.lr)
        generators[name] = torch.Generator().manual_seed(args.seed)
    models = {name: c.model for name, c in contenders.items()}
    print(
        f"MiniBooNE-small (NOT comparable to published MINIBOONE numbers): train on val {tuple(train.shape)}, "
        f"test {tuple(test.shape)}; {args.epochs} epochs, batch {args.batch_size}, {args.transforms} transforms, "
        f"hidden {tuple(args.hidden)}, {torch.get_num_threads()} thread(s), interleaved"
    )
    for epoch in range(args.epochs):
        for name, c in contenders.items():
            train_epoch(c, train, batch_size=args.batch_size, generator=generators[name])
        if (epoch + 1) % 10 == 0 or epoch + 1 == args.epochs:
            shown = "  ".join(f"{n} {evaluate(m, train)[0]:.2f}" for n, m in models.items())
            print(f"epoch {epoch + 1:3d} train log-likelihood: {shown}")
    seconds = {name: sum(c.epoch_times) for name, c in contenders.items()}
    results = {}
    for name, model in models.items():
        mean, err = evaluate(model, test)
        results[name] = (mean, err, seconds[name])
    rows = [
        {"model": name, "loglik": f"{mean:.2f} ± {err:.2f}", "seconds": secs}
        for name, (mean, err, secs) in sorted(results.items(), key=lambda item: -item[1][0])
    ]
    print_table(rows, [("model", "model", "s"), ("loglik", "test log-lik (nats)", "s"), ("seconds", "train s", ".1f")])
    return results


if __name__ == "__main__":
    main()
