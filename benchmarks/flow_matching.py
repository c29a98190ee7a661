"""Flow matching against maximum-likelihood FFJORD at equal wall time: NLL, and the time to reach it.

Problems (from ``benchmarks/cnf.py``, whose FFJORD set-up this reuses): ``moons`` (2-D two moons,
standardised, 4000 train / 2000 test) and ``miniboone`` (43-D MiniBooNE-small: trained on the MAF
*validation* split of ``$FLOWS_DATA_DIR/miniboone_maf_valtest.npz``, tested once on its *test*
split; **not comparable to published numbers**, which train on 9x more data). For both, a
validation split (``--val-rows``, default 10%) is carved out of the training rows: the learning
curves (and any choice of configuration) use it; the test split is evaluated once, at the end.

Contenders, each the same field (``flows.FFJORD``'s default TimeMLP, 64-64 tanh, one CNF block,
dopri5 at rtol = atol = 1e-5, exact trace at evaluation) and Adam:

* ``ml``: maximum likelihood, exact trace (``benchmarks/cnf.py``'s ``flows`` contender), lr 3e-3,
  batch 256;
* ``fm``: flow matching (:class:`flows.train.FlowMatching`), independent coupling;
* ``fm-ot``: flow matching with exact minibatch optimal-transport couplings;
* ``fm-stable``: flow matching onto the stable target (Xu et al. 2023): each pair's velocity
  averaged over the data rows that could have produced its state, the reference set being the
  batch and ``--fm-reference-size`` training rows drawn afresh each step;
* ``fm:256-256`` (``fm-ot:...``, ``fm-stable:...``): the same with a field of other hidden widths.

Flow matching takes ``--fm-lr``, ``--fm-batch``, ``--sigma``, ``--fm-time-power`` (times
``s = u^p``) and ``--fm-ema`` (evaluate an exponential moving average of the weights, this decay).
Maximum likelihood trains for ``--budget`` seconds of its own steps, flow matching for
``--fm-budget`` (default: the same), one thread; with ``--cosine`` each learning rate decays to 0
over its own contender's budget. Steps are interleaved (of the contenders still within their
budgets, the one with the least training time so far steps next), so machine load hits all alike
while they run side by side. Every ``--eval-every`` seconds of its training time a contender's
validation NLL is measured by the ODE (exact trace; evaluation time is not counted). Reported per
contender and seed: the final validation and test NLL, the training time at which the validation
NLL first reaches the final validation NLL of ``ml`` (and its ratio to ``ml``'s training time),
steps, median step time and the test NFE, and each contender's test NLL less the first
contender's with the standard error of that paired difference over the test rows (``Δtest ±
se``); then medians over seeds.

    python benchmarks/flow_matching.py --problem moons --budget 300 --fm-budget 60 --eval-every 5 \
        --seeds 0 1 2 --contenders ml fm-stable:64-64-64 --fm-lr 1e-2 --fm-batch 128 --sigma 0.04 \
        --fm-ema 0.99 --fm-time-power 2 --fm-reference-size 512 --cosine      # ~20 min
    python benchmarks/flow_matching.py --problem moons --budget 300 --fm-budget 60 --eval-every 5 \
        --seeds 0 1 --contenders ml fm fm:128-128 --fm-lr 1e-2 --fm-batch 1024 --sigma 0 \
        --fm-ema 0.999 --fm-time-power 2 --cosine                              # ~20 min
    python benchmarks/flow_matching.py --problem miniboone --budget 120 --eval-every 6 --seeds 0 \
        --contenders ml fm fm:256-256 --fm-lr 3e-3 --sigma 0.05 --cosine        # ~15 min

Measured figures and their reading: docs/continuous.md ("Flow matching").
"""

from __future__ import annotations

import argparse
import math
import statistics

import _harness
import torch
from cnf import HIDDEN, LR, Contender, load_problem  # benchmarks/cnf.py: the FFJORD set-up (a sibling script)
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import flows
from flows.train import FlowMatching


class FMContender(Contender):
    """A flows FFJORD trained by flow matching (same field and solver as the ML contender)."""

    def __init__(
        self,
        name: str,
        features: int,
        hidden: tuple[int, ...],
        objective: FlowMatching,
        lr: float,
        ema: float = 0.0,
        **options,
    ) -> None:
        super().__init__(name, flows.FFJORD(features, hidden=hidden, trace="exact", **options), "flows")
        self.objective = objective
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        # an exponential moving average of the weights (decay ``ema``), evaluated in their place
        self.ema = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(ema)) if ema else None

    def loss(self, x: Tensor) -> tuple[Tensor, Tensor]:
        loss = self.objective(self.model, (x,))
        return loss, loss

    def after_step(self) -> None:
        if self.ema is not None:
            self.ema.update_parameters(self.model)

    def test_nll(self, test: Tensor, chunk: int = 1000) -> tuple[Tensor, float]:
        """Per-row NLL and mean NFE, of the averaged weights when there are any."""
        if self.ema is None:
            return super().test_nll(test, chunk)
        model, self.model = self.model, self.ema.module
        try:
            return super().test_nll(test, chunk)
        finally:
            self.model = model


def make(name: str, train: Tensor, args: argparse.Namespace, seed: int) -> tuple[Contender, int]:
    """A contender and its batch size."""
    features = train.shape[-1]
    torch.manual_seed(seed)
    hidden = tuple(args.hidden)
    if name == "ml":
        return Contender(
            "FFJORD, maximum likelihood (exact)", flows.FFJORD(features, hidden=hidden, trace="exact"), "flows"
        ), args.ml_batch
    kind, _, widths = name.partition(":")
    if kind in ("fm", "fm-ot", "fm-stable"):
        coupling = "ot" if kind == "fm-ot" else "independent"
        stable = kind == "fm-stable"
        objective = FlowMatching(
            sigma=args.sigma,
            coupling=coupling,
            time_power=args.fm_time_power,
            velocity="stable" if stable else "conditional",
            reference=train if stable else None,
            reference_size=args.fm_reference_size if stable else None,
        )
        fm_hidden = tuple(int(w) for w in widths.split("-")) if widths else hidden
        pairs = "stable target" if stable else "OT" if coupling == "ot" else "independent"
        label = f"FFJORD, flow matching ({pairs}, σ={args.sigma:g})"
        if fm_hidden != hidden:
            label = label[:-1] + f", {'-'.join(map(str, fm_hidden))})"
        return FMContender(label, features, fm_hidden, objective, args.fm_lr, args.fm_ema), args.fm_batch
    raise ValueError(f"expected contenders among ml, fm, fm-ot, fm-stable, optionally :<widths>, got {name!r}")


@torch.no_grad()
def nll(contender: Contender, rows: Tensor, chunk: int = 1000) -> tuple[float, float]:
    """Mean NLL by the ODE (eval mode, exact trace) and the mean forward NFE per chunk."""
    values, nfes = contender.test_nll(rows, chunk)
    return float(values.mean()), float(nfes)


def run_seed(args: argparse.Namespace, seed: int, train: Tensor, val: Tensor, test: Tensor) -> dict[str, dict]:
    entries = [make(name, train, args, seed) for name in args.contenders]
    contenders = [c for c, _ in entries]
    batch = {c.name: b for c, b in entries}
    clock = {c.name: 0.0 for c in contenders}
    budget = {c.name: args.budget if not isinstance(c, FMContender) else args.fm_budget for c in contenders}
    curves: dict[str, list[tuple[float, float, int]]] = {c.name: [] for c in contenders}
    marks = {c.name: args.eval_every for c in contenders}
    generator = torch.Generator().manual_seed(seed)
    orders = {c.name: iter(()) for c in contenders}
    while True:
        active = [c for c in contenders if clock[c.name] < budget[c.name]]
        if not active:
            break
        c = min(active, key=lambda c: clock[c.name])
        rows = next(orders[c.name], None)
        if rows is None:  # a new epoch of this contender: its own shuffle
            perm = torch.randperm(len(train), generator=generator)
            orders[c.name] = iter(perm[i : i + batch[c.name]] for i in range(0, len(perm), batch[c.name]))
            rows = next(orders[c.name])
        if args.cosine:
            for group in c.optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
                group["lr"] = (
                    group["initial_lr"] * 0.5 * (1 + math.cos(math.pi * min(1.0, clock[c.name] / budget[c.name])))
                )
        c.step(train[rows])
        clock[c.name] += c.step_times[-1]
        if clock[c.name] >= marks[c.name] or clock[c.name] >= budget[c.name]:
            curves[c.name].append((clock[c.name], nll(c, val)[0], len(c.step_times)))
            marks[c.name] += args.eval_every
    target = curves[contenders[0].name][-1][1]  # the first contender's (ml's) final validation NLL
    out: dict[str, dict] = {}
    reference_rows = None
    for c in contenders:
        reach, steps = next(((t, k) for t, v, k in curves[c.name] if v <= target), (math.inf, 0))
        median = statistics.median(c.step_times)
        rows, nfes = c.test_nll(test, 1000)
        test_nll, test_nfe = float(rows.mean()), float(nfes)
        if reference_rows is None:
            reference_rows = rows
        paired = (rows - reference_rows).double()  # per test row, against the first contender: a paired difference
        out[c.name] = {
            "val_nll": curves[c.name][-1][1],
            "test_nll": test_nll,
            "test_delta": float(paired.mean()),
            "test_delta_se": float(paired.std() / math.sqrt(len(paired))) if len(paired) > 1 else math.nan,
            "reach_s": reach,
            "reach_ratio": reach / clock[contenders[0].name],
            # load-robust: steps to reach x median step time, over the reference's steps x its median
            "reach_median_ratio": (steps * median if steps else math.inf)
            / (len(contenders[0].step_times) * statistics.median(contenders[0].step_times)),
            "train_s": clock[c.name],
            "steps": len(c.step_times),
            "median_step_ms": 1e3 * median,
            "test_nfe": test_nfe,
            "curve": curves[c.name],
        }
    return out


def plot_curves(per_seed: list[dict[str, dict]], seeds: list[int], budget: float, fm_budget: float, path: str) -> None:
    """Validation NLL against training seconds, one panel per seed, with the first contender's final NLL dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, len(per_seed), figsize=(4.2 * len(per_seed), 3.6), squeeze=False, sharey=True)
    low = min(v for result in per_seed for r in result.values() for _, v, _ in r["curve"])
    high = max(result[next(iter(result))]["val_nll"] for result in per_seed) + 0.25
    for ax, result, seed in zip(axes[0], per_seed, seeds, strict=True):
        names = list(result)
        target = result[names[0]]["val_nll"]
        for name in names:
            t, v, _ = zip(*result[name]["curve"], strict=True)
            ax.plot(t, v, marker=".", label=name.replace("FFJORD, ", ""))
        ax.axhline(target, color="k", linestyle="--", linewidth=0.8, label=f"{names[0].split(', ')[1]}: final")
        ax.axvline(fm_budget, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(low - 0.02, high)
        ax.set_xlabel("training seconds (one thread)")
        ax.set_title(f"seed {seed}: budgets {fm_budget:g} s / {budget:g} s")
    axes[0][0].set_ylabel("validation NLL (nats)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = _harness.parser(__doc__, seed=None, budget=120.0)
    parser.add_argument("--problem", choices=("moons", "miniboone"), default="moons")
    parser.add_argument("--eval-every", type=float, default=None, help="seconds between validations (budget/30)")
    parser.add_argument(
        "--contenders",
        nargs="+",
        default=["ml", "fm", "fm:256-256"],
        help="ml, fm, fm-ot, fm-stable, or any fm kind with a field of other widths (fm:256-256); "
        "the first is the reference",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    parser.add_argument("--ml-batch", type=int, default=256)
    parser.add_argument("--fm-batch", type=int, default=256)
    parser.add_argument("--fm-lr", type=float, default=LR)
    parser.add_argument(
        "--fm-budget", type=float, default=None, help="training seconds of each flow-matching contender (--budget)"
    )
    parser.add_argument("--fm-ema", type=float, default=0.0, help="evaluate an EMA of the weights, this decay")
    parser.add_argument("--fm-time-power", type=float, default=1.0, help="flow-matching times s = u^p, u ~ U(0, 1)")
    parser.add_argument(
        "--fm-reference-size", type=int, default=512, help="fm-stable: training rows drawn each step as its reference"
    )
    parser.add_argument(
        "--cosine", action="store_true", help="decay every learning rate to 0 over its contender's time budget"
    )
    parser.add_argument("--sigma", type=float, default=0.0)
    parser.add_argument("--val-rows", type=float, default=0.1, help="fraction of the training rows for validation")
    parser.add_argument("--limit", type=int, default=None, help="use only this many train/test rows (smoke tests)")
    parser.add_argument("--plot", default=None, help="write the validation curves to this image file")
    args = _harness.setup(parser.parse_args(argv))
    if args.fm_budget is None:
        args.fm_budget = args.budget
    if args.eval_every is None:
        args.eval_every = min(args.budget, args.fm_budget) / 30

    train, test = load_problem(args.problem)
    if args.limit:
        train, test = train[: args.limit], test[: args.limit]
    perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(1234))
    n_val = max(1, round(args.val_rows * len(train)))
    val, train = train[perm[:n_val]], train[perm[n_val:]]
    print(
        f"problem {args.problem}: {len(train)} train / {len(val)} validation / {len(test)} test rows, "
        f"D={train.shape[-1]}, budget {args.budget:g} s (flow matching {args.fm_budget:g} s), hidden "
        f"{tuple(args.hidden)}, FM lr {args.fm_lr:g} batch {args.fm_batch} σ {args.sigma:g} time power "
        f"{args.fm_time_power:g} EMA {args.fm_ema:g}, ML lr {LR:g} batch {args.ml_batch}, "
        f"{'cosine' if args.cosine else 'constant'} lr, threads {torch.get_num_threads()}",
        flush=True,
    )
    per_seed = []
    for seed in args.seeds:
        result = run_seed(args, seed, train, val, test)
        per_seed.append(result)
        print(f"\nseed {seed}")
        header = (
            f"{'contender':52s} {'val NLL':>8s} {'test NLL':>9s} {'Δtest ± se':>15s} {'reach s':>8s} {'ratio':>6s} "
            f"{'ratio~':>6s} {'steps':>6s} {'med ms':>7s} {'NFE te':>7s}"
        )
        print(header + "\n" + "-" * len(header))
        for name, r in result.items():
            delta = f"{r['test_delta']:+.4f} ± {r['test_delta_se']:.4f}"
            print(
                f"{name:52s} {r['val_nll']:8.3f} {r['test_nll']:9.3f} {delta:>15s} {r['reach_s']:8.1f} "
                f"{r['reach_ratio']:6.2f} {r['reach_median_ratio']:6.2f} {r['steps']:6d} {r['median_step_ms']:7.2f} "
                f"{r['test_nfe']:7.1f}"
            )
            points = sorted({round(i * (len(r["curve"]) - 1) / 9) for i in range(10)})  # ten, with the last
            curve = "  ".join(f"{r['curve'][i][0]:.0f}s:{r['curve'][i][1]:.3f}" for i in points)
            print(f"    validation NLL curve  {curve}", flush=True)
    if args.plot:
        plot_curves(per_seed, args.seeds, args.budget, args.fm_budget, args.plot)
    summary: dict[str, dict[str, float]] = {}
    names = list(per_seed[0])
    for name in names:
        summary[name] = {
            key: statistics.median(r[name][key] for r in per_seed)
            for key in (
                "val_nll",
                "test_nll",
                "test_delta",
                "reach_s",
                "reach_ratio",
                "reach_median_ratio",
                "steps",
                "median_step_ms",
                "test_nfe",
            )
        }
    print(f"\nmedians over seeds {args.seeds}: NLL in nats; 'reach' = training seconds until the validation NLL")
    print(
        f"first reaches the final validation NLL of '{names[0]}' (ratio: to its {args.budget:g} s of training;"
        " inf: never; ratio~: the same in steps x median step time, robust to stalls from other jobs)"
    )
    header = (
        f"{'contender':52s} {'test NLL':>9s} {'val NLL':>8s} {'reach s':>8s} {'ratio':>6s} {'ratio~':>6s} "
        f"{'med ms':>7s} {'NFE te':>7s}"
    )
    print(header + "\n" + "-" * len(header))
    for name, r in summary.items():
        print(
            f"{name:52s} {r['test_nll']:9.3f} {r['val_nll']:8.3f} {r['reach_s']:8.1f} {r['reach_ratio']:6.2f} "
            f"{r['reach_median_ratio']:6.2f} {r['median_step_ms']:7.2f} {r['test_nfe']:7.1f}"
        )
    if args.problem == "miniboone":
        print("MiniBooNE-small (train on val, test on test): not comparable to published MINIBOONE numbers.")
    return summary


if __name__ == "__main__":
    main()
