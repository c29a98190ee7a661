"""Continuous normalizing flows: flows ``FFJORD``/``CNF`` against zuko's ``CNF``, trained side by side.

Problems: ``moons`` (2-D, scikit-learn's two moons, noise 0.05, 4000 train / 2000 test points),
``circles`` (2-D, scikit-learn's two circles, noise 0.04, factor 0.5, the same sizes) and
``miniboone`` (43-D MiniBooNE-small: train on the MAF *validation* split, test on the *test* split
of ``$FLOWS_DATA_DIR/miniboone_maf_valtest.npz``; **not comparable to published numbers**, which
train on 9x more data for far longer).

Every contender has the same field width (an MLP 64-64 on the state and time features by default,
``--hidden``, integrated over t in [0, 1] with dopri5), the same optimiser (Adam, lr 3e-3, constant,
or decayed to 0 over the run with ``--cosine``) and sees the same batches; one
training step of each runs in turn (interleaved, one thread), so machine load hits all alike.
Contenders: zuko's ``CNF`` with its defaults (ELU, time features ``cos/sin(πkt)``, k = 1..3, exact
trace; ``zuko-hutchinson``: ``exact=False``); flows' ``FFJORD`` with its default field (tanh, k = 1)
and exact (``flows``) or Hutchinson (``flows-hutchinson``, exact at evaluation) traces, with RNODE
(``flows+rnode<w>``: both terms at weight w; ``flows+kinetic<w>`` and ``flows+jacobian<w>``: one
term), and with zuko's field design (``flows-zuko-field``: ELU, k = 1..3), which
isolates the implementation from the choice of field. Reported per contender: test NLL (nats, eval
mode, each model's own solver, exact trace for every contender) at equal epochs; its error against
a reference solve of the same field (rtol = atol = 1e-8, float64, exact trace; zuko's fields are
wrapped into a flows ``CNF`` for it) on the first test rows; total and median training-step time
and their ratios to the first contender; and the number of function evaluations (NFE) of the
forward solve in training (last epoch mean) and at test time.

What zuko's ``CNF`` does (zuko 1.6, ``zuko/transforms.py`` and ``zuko/utils.py``): dopri5 with a
max-norm error over the whole batch (atol 1e-6, rtol 1e-5, the log-det scaled by 1e-2 to relax
its tolerance), exact trace by ``D`` batched vector-Jacobian products with ``create_graph``
(default) or one Gaussian-noise product (``exact=False``), gradients by an adaptive checkpoint
adjoint that re-runs every accepted step backwards (its NFE counts below are the forward solve).
flows' ``CNF`` uses torchdiffeq's dopri5 with an RMS error norm (rtol = atol = 1e-5), a field
whose Jacobian-vector products are propagated in forward mode inside the same pass (no double
backward), and direct backpropagation through the solver.

    python benchmarks/cnf.py --problem moons --epochs 25                 # ~10 min on a loaded core
    python benchmarks/cnf.py --problem moons --epochs 60 --contenders flows flows+rnode0.01 flows+rnode0.1 \
        --rnode 0.01 0.1                                                  # RNODE: NFE against NLL
    python benchmarks/cnf.py --problem circles --epochs 400 --contenders flows flows+rnode0.05 \
        --rnode 0.05 --reference-rows 0                                   # RNODE near convergence (~1 h)
    python benchmarks/cnf.py --problem miniboone --epochs 6              # ~5 min (zuko's exact trace)
    python benchmarks/cnf.py --problem miniboone --epochs 20 --contenders zuko-hutchinson flows-hutchinson
    python benchmarks/cnf.py --problem trace                            # cost of one evaluation per trace route
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import _harness
import torch
from torch import Tensor, nn

import flows
from flows.data import load_miniboone

HIDDEN = (64, 64)
LR = 3e-3


def load_problem(name: str, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``(train, test)`` float32 tensors."""
    if name == "moons":
        from sklearn.datasets import make_moons

        x, _ = make_moons(6000, noise=0.05, random_state=seed)
        x = torch.tensor(x, dtype=torch.float32)
        x = (x - x.mean(0)) / x.std(0)
        return x[:4000], x[4000:]
    if name == "circles":
        from sklearn.datasets import make_circles

        x, _ = make_circles(6000, noise=0.04, factor=0.5, random_state=seed)
        x = torch.tensor(x, dtype=torch.float32)
        x = (x - x.mean(0)) / x.std(0)
        return x[:4000], x[4000:]
    if name == "miniboone":
        splits = load_miniboone()
        return splits["val"], splits["test"]
    raise ValueError(f"expected problem 'moons', 'circles' or 'miniboone', got {name!r}")


class Contender(_harness.Contender):
    """A CNF contender: log-density, NFE of the last forward solve, reference field, an optional schedule."""

    def __init__(self, name: str, model: nn.Module, kind: str) -> None:
        super().__init__(name, model, log_prob=self._log_prob, lr=LR)
        self.kind = kind
        self.key = ""
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.train_nfe: list[int] = []
        self._calls = 0
        self._forward_nfe = 0
        if kind == "zuko":
            transform = model.transform
            field = transform.f

            def counted(*args, **kwargs):
                self._calls += 1
                return field(*args, **kwargs)

            transform.f = counted

    def _log_prob(self, x: Tensor) -> Tensor:
        self._calls = 0
        log_p = self.model().log_prob(x) if self.kind == "zuko" else self.model.log_prob(x)
        self._forward_nfe = self.nfe  # before any backward pass (zuko's adjoint evaluates the field again)
        return log_p

    @property
    def nfe(self) -> int:
        return self._calls if self.kind == "zuko" else self.model.nfe

    def after_step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()
        self.train_nfe.append(self._forward_nfe)

    @torch.no_grad()
    def test_nll(self, test: Tensor, chunk: int = 1000) -> tuple[Tensor, float]:
        """Per-row test NLL with the model's own solver (eval mode) and the mean forward NFE per chunk."""
        self.model.eval()
        if self.kind == "zuko":  # exact log-likelihoods for every contender (zuko has no eval-only switch)
            exact, self.model.transform.exact = self.model.transform.exact, True
        values, nfes = [], []
        for part in test.split(chunk):
            values.append(-self.log_prob(part))
            nfes.append(self.nfe)
        self.model.train()
        if self.kind == "zuko":
            self.model.transform.exact = exact
        return torch.cat(values), statistics.mean(nfes)

    def reference_nll(self, test: Tensor, chunk: int = 500) -> Tensor:
        """Per-row test NLL from a tight float64 exact-trace solve (rtol = atol = 1e-8) of this contender's field."""
        features = test.shape[-1]
        if self.kind == "zuko":
            transform = self.model.transform

            class Field(nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.inner = transform

                def forward(self, t: Tensor, z: Tensor) -> Tensor:
                    return self.inner.f(t, z)

            field = Field()
        else:
            field = self.model.transform[0].field
        reference = flows.CNF(features, field=field, rtol=1e-8, atol=1e-8)
        flow = flows.Flow(reference, flows.StandardNormal(features)).double()  # converts the model in place
        try:
            with torch.no_grad():
                return torch.cat([-flow.log_prob(part) for part in test.double().split(chunk)]).float()
        finally:
            self.model.float()


def make_contenders(
    names: list[str], features: int, rnode: list[float], seed: int, hidden: tuple[int, ...] = HIDDEN
) -> list[Contender]:
    def zuko_cnf(**options) -> nn.Module:  # zuko is imported only when a zuko contender is asked for
        import zuko

        return zuko.flows.CNF(features, hidden_features=hidden, **options)

    makers: dict[str, Callable[[], Contender]] = {
        "zuko": lambda: Contender("zuko CNF (exact, ELU)", zuko_cnf(), "zuko"),
        "zuko-matched": lambda: Contender(
            "zuko CNF (exact, Tanh, freqs=1)", zuko_cnf(activation=nn.Tanh, freqs=1), "zuko"
        ),
        "zuko-hutchinson": lambda: Contender("zuko CNF (Hutchinson)", zuko_cnf(exact=False), "zuko"),
        "flows": lambda: Contender(
            "flows FFJORD (exact)", flows.FFJORD(features, hidden=hidden, trace="exact"), "flows"
        ),
        "flows-zuko-field": lambda: Contender(
            "flows FFJORD (exact, zuko's field)",
            flows.FFJORD(features, hidden=hidden, trace="exact", activation=nn.ELU, freqs=3),
            "flows",
        ),
        "flows-hutchinson": lambda: Contender(
            "flows FFJORD (Hutchinson, exact eval)", flows.FFJORD(features, hidden=hidden), "flows"
        ),
    }
    for weight in rnode:  # one contender per RNODE weight
        makers[f"flows+kinetic{weight:g}"] = lambda w=weight: Contender(
            f"flows FFJORD (exact) + kinetic {w:g}",
            flows.FFJORD(features, hidden=hidden, trace="exact", kinetic=w, jacobian=0.0),
            "flows",
        )
        makers[f"flows+jacobian{weight:g}"] = lambda w=weight: Contender(
            f"flows FFJORD (exact) + Jacobian {w:g}",
            flows.FFJORD(features, hidden=hidden, trace="exact", kinetic=0.0, jacobian=w),
            "flows",
        )
        makers[f"flows+rnode{weight:g}"] = lambda w=weight: Contender(
            f"flows FFJORD (exact) + RNODE {w:g}",
            flows.FFJORD(features, hidden=hidden, trace="exact", kinetic=w, jacobian=w),
            "flows",
        )
        makers[f"flows-hutchinson+rnode{weight:g}"] = lambda w=weight: Contender(
            f"flows FFJORD (Hutchinson) + RNODE {w:g}",
            flows.FFJORD(features, hidden=hidden, kinetic=w, jacobian=w),
            "flows",
        )
    out = []
    for name in names:
        if name not in makers:
            raise ValueError(f"expected contenders among {sorted(makers)}, got {name!r}")
        torch.manual_seed(seed)
        out.append(makers[name]())
        out[-1].key = name
    return out


class _NoJVP(nn.Module):
    """Hides a field's ``jvp`` method, so that the CNF takes its traces by reverse-mode autograd."""

    def __init__(self, field: nn.Module) -> None:
        super().__init__()
        self.field = field

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.field(t, z)


def trace_cost(features: int, batch: int, repeats: int) -> dict[str, float]:
    """Median ms of one field evaluation with its trace, forward and backward, by each route.

    One Euler step of size ``t1 - t0`` is exactly one evaluation of the augmented dynamics, so the
    public ``forward_and_log_det`` measures the cost per function evaluation in training.
    """
    torch.manual_seed(0)
    field = flows.TimeMLP(features, hidden=HIDDEN)
    solver = {"method": "euler", "options": {"step_size": 1.0}}
    routes = {
        "fused exact (TimeMLP.jvp, D tangents)": flows.CNF(features, field=field, **solver),
        "autograd exact (D batched VJPs, as zuko)": flows.CNF(features, field=_NoJVP(field), **solver),
        "fused Hutchinson (one tangent)": flows.CNF(features, field=field, trace="hutchinson", **solver),
        "autograd Hutchinson (one VJP)": flows.CNF(features, field=_NoJVP(field), trace="hutchinson", **solver),
    }
    x = torch.randn(batch, features)

    def evaluation(cnf: flows.CNF) -> Callable[[], None]:
        def run() -> None:
            z, ladj = cnf.forward_and_log_det(x)
            (z.sum() + ladj.sum()).backward()

        return run

    seconds = _harness.interleaved_medians({name: evaluation(c) for name, c in routes.items()}, rounds=repeats)
    medians = {name: 1e3 * t for name, t in seconds.items()}
    threads = torch.get_num_threads()
    print(f"one evaluation + backward, D={features}, batch {batch}, hidden {HIDDEN}, {repeats} rounds, {threads} thr.")
    for name, ms in medians.items():
        print(f"  {name:42s} {ms:8.2f} ms")
    return medians


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = _harness.parser(__doc__, epochs=25)
    parser.add_argument("--problem", choices=("moons", "circles", "miniboone", "trace"), default="moons")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--rnode", type=float, nargs="+", default=[0.01], help="RNODE weights (kinetic = Jacobian), one contender each"
    )
    parser.add_argument("--contenders", nargs="+", default=None)
    parser.add_argument("--limit", type=int, default=None, help="use only this many train/test rows (smoke tests)")
    parser.add_argument(
        "--reference-rows", type=int, default=1000, help="test rows for the tight reference solve (0: skip it)"
    )
    parser.add_argument("--repeats", type=int, default=30, help="rounds of the trace-cost measurement")
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=list(HIDDEN), help="hidden widths of every contender's field"
    )
    parser.add_argument("--cosine", action="store_true", help="decay the learning rate to 0 over the run (cosine)")
    args = _harness.setup(parser.parse_args(argv))
    if args.problem == "trace":  # the cost of one evaluation by each trace route, D = 2 and 43
        return {str(d): trace_cost(d, args.batch_size, args.repeats) for d in (2, 43)}
    train, test = load_problem(args.problem)
    if args.limit:
        train, test = train[: args.limit], test[: args.limit]
    default = ["zuko", "flows", "flows-zuko-field", *(f"flows+rnode{w:g}" for w in args.rnode)]
    if args.problem == "miniboone":
        hutchinson = [f"flows-hutchinson+rnode{w:g}" for w in args.rnode]
        default = ["zuko", "flows", "flows-zuko-field", "flows-hutchinson", *hutchinson]
    hidden = tuple(args.hidden)
    contenders = make_contenders(args.contenders or default, train.shape[-1], args.rnode, args.seed, hidden)
    print(
        f"problem {args.problem}: {len(train)} train / {len(test)} test, D={train.shape[-1]}, "
        f"{args.epochs} epochs of batch {args.batch_size}{' (cosine lr)' if args.cosine else ''}, "
        f"hidden {hidden}, threads {torch.get_num_threads()}"
    )

    generator = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    if args.cosine:
        for c in contenders:
            c.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(c.optimizer, args.epochs * steps_per_epoch)
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=generator)
        losses = {c.name: [] for c in contenders}
        for i in range(steps_per_epoch):
            x = train[order[i * args.batch_size : (i + 1) * args.batch_size]]
            turn = contenders[i % len(contenders) :] + contenders[: i % len(contenders)]
            for c in turn:
                losses[c.name].append(c.step(x))
        if epoch == 0 or (epoch + 1) % max(1, args.epochs // 8) == 0 or epoch + 1 == args.epochs:
            text = "  ".join(f"{c.key} {statistics.mean(losses[c.name]):.3f}" for c in contenders)
            nfes = " ".join(str(c.train_nfe[-1]) for c in contenders)
            print(f"epoch {epoch + 1:3d}  train NLL  {text}   NFE {nfes}", flush=True)

    baseline = contenders[0]
    results: dict[str, dict[str, float]] = {}
    header = (
        f"{'contender':42s} {'test NLL':>9s} {'|Δref|':>8s} {'train s':>8s} {'ratio':>6s} "
        f"{'med ms':>7s} {'ratio':>6s} {'NFE tr':>7s} {'NFE te':>7s}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    last = steps_per_epoch
    rows = test[: args.reference_rows]
    for c in contenders:
        nll, nfe = c.test_nll(test)
        error = float("nan")
        if args.reference_rows:
            error = float((nll[: len(rows)] - c.reference_nll(rows)).abs().mean())
        total, median = sum(c.step_times), statistics.median(c.step_times)
        results[c.name] = {
            "test_nll": float(nll.mean()),
            "test_nll_stderr": float(nll.std() / math.sqrt(len(nll))),
            "reference_error": error,
            "train_seconds": total,
            "time_ratio": total / sum(baseline.step_times),
            "median_step_ms": 1e3 * median,
            "median_ratio": median / statistics.median(baseline.step_times),
            "train_nfe": statistics.mean(c.train_nfe[-last:]),
            "test_nfe": nfe,
        }
        r = results[c.name]
        print(
            f"{c.name:42s} {r['test_nll']:9.3f} {error:8.1e} {total:8.1f} {r['time_ratio']:6.2f} "
            f"{r['median_step_ms']:7.1f} {r['median_ratio']:6.2f} {r['train_nfe']:7.1f} {nfe:7.1f}",
            flush=True,
        )
    stderr = max(r["test_nll_stderr"] for r in results.values())
    print(
        f"\ntest NLL standard errors <= {stderr:.3f}; |Δref| = mean |own solve - reference solve| per row on the "
        f"first {len(rows)} test rows; ratios are to the first contender; NFE tr = forward-solve evaluations per "
        "training step (last epoch mean), NFE te = per test chunk of 1000."
    )
    if args.problem == "miniboone":
        print("MiniBooNE-small (train on val, test on test): not comparable to published MINIBOONE numbers.")
    return results


if __name__ == "__main__":
    main()
