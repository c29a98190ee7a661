"""Few-step flow maps: distil a CNF into a coupling flow by regression (FORT), then sample a Boltzmann target with it.

For each target (a 2-D mixture of four Gaussians with unequal weights, and the SNF double well):

1. **teacher**: an FFJORD CNF trained by maximum likelihood on exact samples of the target
   (``ForwardKL``: fresh exact samples every step; Hutchinson traces in training, the exact trace
   in evaluation, dopri5 at rtol = atol = 1e-5);
2. **pairs**: ``teacher_pairs``: z ~ N(0, I) and x = CNF⁻¹(z) (the ODE integrated without trace);
3. **distilled**: a RealNVP (8 affine couplings, 64-64 conditioners) trained by ``PairRegression``
   (8000 Adam steps of batch 512) on 50 000 pairs: ℓ2 regression of the sampling map plus the
   forward-backward consistency term, no log-determinant in the loss;
4. **OT** (optional, ``--ot``): the same RealNVP regressed onto mini-batch optimal-transport pairs
   of base draws and exact samples (``ot_pairs``), no teacher;
5. **reverse KL**: the same RealNVP trained on the energy alone by reverse KL with the temperature
   annealed from 4 to 1 (the recipe of ``docs/boltzmann.md``).

Every model is then a Boltzmann generator with self-normalised importance weights
log w = −u(x) − log q(x) and exact log q. Reported from fresh samples: Kish ESS, the log-Z error
(± standard error; the targets' log Z are exact), and the sampling cost: the median time to draw
``--timing-samples`` samples *with* their log q, measured interleaved over ``--repeats`` rounds,
with the speed-up over the CNF. The CNF is timed at its evaluation tolerance and also at a loose one
(rtol = atol = 1e-3, ``--loose-rtol``), so that the speed-up is not bought with a needlessly tight solve.

    python examples/flow_maps.py --targets mixture               # one target: about 8 minutes on one core
    python examples/flow_maps.py --targets double_well           # the numbers of docs/flow_maps.md
    python examples/flow_maps.py --targets mixture --steps 3000 --ot      # with the OT student (about 8 minutes)
    python examples/flow_maps.py --student nsf --steps 3000 --targets mixture   # spline student
    python examples/flow_maps.py --cnf-steps 20 --steps 50 --rkl-steps 50 --samples 2000   # quick look
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import flows
from flows.bijections import total_nfe
from flows.metrics import kish_ess, log_z_estimate, sample_log_weights
from flows.targets import DoubleWell, EnergyTarget, GaussianMixture
from flows.train import AnnealTemperature, ForwardKL, PairRegression, ReverseKL, Trainer
from flows.train.pairs import ot_pairs, teacher_pairs

TARGETS = ("mixture", "double_well")


def make_target(name: str) -> EnergyTarget:
    """The 2-D toy (four Gaussians of scale 0.6 at (±1.5, ±1.5), weights 0.4/0.3/0.2/0.1) or the double well."""
    if name == "mixture":
        locs = [[1.5, 1.5], [-1.5, 1.5], [-1.5, -1.5], [1.5, -1.5]]
        return GaussianMixture(locs, 0.6, [0.4, 0.3, 0.2, 0.1])
    if name == "double_well":
        return DoubleWell()
    raise ValueError(f"expected a target in {TARGETS}, got {name!r}")


STUDENTS = ("realnvp", "nsf")


def coupling_flow(student: str, transforms: int, hidden: int) -> flows.Flow:
    """The student and the reverse-KL baseline: the same coupling flow (affine or rational-quadratic spline)."""
    if student == "realnvp":
        return flows.RealNVP(2, transforms=transforms, hidden=(hidden, hidden))
    if student == "nsf":
        return flows.NSF(2, transforms=transforms, hidden=(hidden, hidden), coupling=True, bins=8)
    raise ValueError(f"expected a student in {STUDENTS}, got {student!r}")


def cosine(steps: int):
    return lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))


def train_cnf(target: EnergyTarget, *, steps: int, budget: float | None, hidden: int, seed: int = 0):
    """FFJORD by maximum likelihood on fresh exact samples; returns (flow, seconds, steps taken)."""
    torch.manual_seed(seed)
    cnf = flows.FFJORD(2, hidden=(hidden, hidden))
    trainer = Trainer(
        cnf, ForwardKL(target, batch_size=512), lr=3e-3, scheduler=cosine(steps), scheduler_interval="step"
    )
    start = time.perf_counter()
    history = trainer.fit(None, steps_per_epoch=max(1, steps // 5), max_steps=steps, time_budget=budget)
    return cnf, time.perf_counter() - start, int(history.last()["step"])


def train_regression(pairs, val_pairs, *, steps: int, consistency: float, seed: int = 0, **size):
    """A coupling flow regressed onto ``pairs`` (x, z) by ``PairRegression``; returns (flow, seconds, val metrics)."""
    torch.manual_seed(seed)
    student = coupling_flow(**size)
    trainer = Trainer(
        student,
        PairRegression(consistency),
        lr=1e-3,
        scheduler=cosine(steps),
        scheduler_interval="step",
        clip_grad_norm=10.0,
    )
    start = time.perf_counter()
    history = trainer.fit(pairs, val=val_pairs, batch_size=512, max_steps=steps)
    seconds = time.perf_counter() - start
    last = history.last()
    return student, seconds, {k[4:]: v for k, v in last.items() if k.startswith("val_")}


def train_reverse_kl(target: EnergyTarget, *, steps: int, seed: int = 0, **size):
    """A coupling flow by reverse KL annealed from T = 4 to 1 over the first 60% of the steps; returns (flow, s)."""
    torch.manual_seed(seed)
    flow = coupling_flow(**size)
    objective = ReverseKL(target, batch_size=512)
    trainer = Trainer(
        flow,
        objective,
        lr=1e-3,
        scheduler=cosine(steps),
        scheduler_interval="step",
        clip_grad_norm=10.0,
        callbacks=[AnnealTemperature(objective, steps=steps)],
    )
    start = time.perf_counter()
    trainer.fit(None, steps_per_epoch=max(1, steps // 5), max_steps=steps)
    return flow, time.perf_counter() - start


def with_tolerance(cnf: flows.Flow, tol: float) -> flows.Flow:
    """A copy of a CNF flow whose solves run at rtol = atol = ``tol``."""
    loose = copy.deepcopy(cnf)
    for module in loose.modules():
        if isinstance(module, flows.CNF):
            module.rtol = module.atol = tol
    return loose


def evaluate(flow: flows.Flow, target: EnergyTarget, *, n: int, seed: int = 1) -> dict[str, float]:
    """ESS and log-Z error (with its standard error) from ``n`` fresh samples and their importance weights."""
    torch.manual_seed(seed)
    _, log_w = sample_log_weights(flow, target, n)
    log_w = log_w.double()
    log_z, stderr = log_z_estimate(log_w)
    return {"ess": kish_ess(log_w).item(), "log_z_error": log_z.item() - target.log_Z, "log_z_stderr": stderr.item()}


def sampling_times(models: dict[str, flows.Flow], *, n: int, repeats: int) -> dict[str, float]:
    """Median seconds to draw ``n`` samples with log q, per model, measured interleaved (eval mode, no grad)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for flow in models.values():  # warm-up
            with flows.evaluating(flow):
                flow.sample_and_log_prob((min(n, 16),))
        for _ in range(repeats):
            for name, flow in models.items():
                with flows.evaluating(flow):
                    start = time.perf_counter()
                    flow.sample_and_log_prob((n,))
                    times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run_target(name: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    target = make_target(name)
    size = {"student": args.student, "transforms": args.transforms, "hidden": args.hidden}
    cnf, cnf_s, cnf_steps = train_cnf(target, steps=args.cnf_steps, budget=args.cnf_budget, hidden=args.cnf_hidden)
    start = time.perf_counter()
    torch.manual_seed(2)
    x, z = teacher_pairs(cnf, args.pairs + args.val_pairs)
    pairs_s = time.perf_counter() - start
    split = args.pairs
    distilled, distil_s, distil_val = train_regression(
        (x[:split], z[:split]), (x[split:], z[split:]), steps=args.steps, consistency=args.consistency, **size
    )
    models = {"CNF (teacher)": cnf, f"CNF, rtol {args.loose_rtol:g}": with_tolerance(cnf, args.loose_rtol)}
    train_s = {"CNF (teacher)": cnf_s, f"CNF, rtol {args.loose_rtol:g}": cnf_s}
    models["distilled"], train_s["distilled"] = distilled, cnf_s + pairs_s + distil_s
    if args.ot:
        start = time.perf_counter()
        torch.manual_seed(3)
        n = args.pairs + args.val_pairs
        xo, zo = ot_pairs(target.sample((n,)), torch.randn(n, 2), batch_size=args.ot_batch)
        ot_s = time.perf_counter() - start
        ot_flow, ot_train_s, _ = train_regression(
            (xo[:split], zo[:split]), (xo[split:], zo[split:]), steps=args.steps, consistency=args.consistency, **size
        )
        models["OT-regressed"], train_s["OT-regressed"] = ot_flow, ot_s + ot_train_s
    rkl, rkl_s = train_reverse_kl(target, steps=args.rkl_steps, **size)
    models["reverse KL"], train_s["reverse KL"] = rkl, rkl_s

    results = {
        label: {**evaluate(flow, target, n=args.samples), "train_s": train_s[label]} for label, flow in models.items()
    }
    with torch.no_grad(), flows.evaluating(cnf):
        cnf.sample_and_log_prob((1000,))
    nfe = total_nfe(cnf)
    times = sampling_times(models, n=args.timing_samples, repeats=args.repeats)
    for label, seconds in times.items():
        results[label]["sample_s"] = seconds
        results[label]["speedup"] = times["CNF (teacher)"] / seconds
        results[label]["params"] = sum(p.numel() for p in models[label].parameters())

    print(
        f"\n{name}: CNF {args.cnf_hidden}-{args.cnf_hidden} trained {cnf_steps} steps in {cnf_s:.0f} s"
        f" (NFE per solve with trace: {nfe})"
    )
    size_text = f"{args.student}, {args.transforms} couplings, {args.hidden}-{args.hidden} conditioners"
    print(f"student and baseline: {size_text}")
    print(
        f"{args.pairs} pairs in {pairs_s:.1f} s; distillation {args.steps} steps, consistency {args.consistency:g}: "
        f"validation sampling error {distil_val.get('sampling_error', float('nan')):.2e}, "
        f"consistency error {distil_val.get('consistency_error', float('nan')):.2e}"
    )
    print(f"{args.samples} evaluation samples; sampling time for {args.timing_samples} samples with log q (median)")
    header = f"{'model':24s} {'params':>7s} {'train s':>8s} {'ESS':>7s} {'log Z error':>19s}"
    print(header + f" {'sample ms':>10s} {'speed-up':>9s}")
    for label, r in results.items():
        log_z = f"{r['log_z_error']:+.4f} ± {r['log_z_stderr']:.4f}"
        print(
            f"{label:24s} {r['params']:7d} {r['train_s']:8.1f} {r['ess']:7.4f} {log_z:>19s}"
            f" {1000 * r['sample_s']:10.2f} {r['speedup']:8.1f}x"
        )
    gap = results["CNF (teacher)"]["ess"] - results["distilled"]["ess"]
    speedup = results["distilled"]["speedup"]
    print(f"ESS gap CNF − distilled: {gap:+.4f}; speed-up of the distilled flow: {speedup:.1f}x")
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--cnf-steps", type=int, default=3000, help="maximum-likelihood steps of the CNF")
    parser.add_argument("--cnf-budget", type=float, default=120.0, help="CNF training budget (seconds)")
    parser.add_argument("--cnf-hidden", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=50_000, help="training pairs")
    parser.add_argument("--val-pairs", type=int, default=5_000, help="validation pairs")
    parser.add_argument("--steps", type=int, default=8000, help="regression steps (batch 512)")
    parser.add_argument("--consistency", type=float, default=1.0, help="forward-backward consistency weight")
    parser.add_argument("--ot", action="store_true", help="also regress onto mini-batch OT pairs")
    parser.add_argument("--ot-batch", type=int, default=1024, help="size of the exact OT assignments")
    parser.add_argument("--rkl-steps", type=int, default=3000, help="reverse-KL steps (batch 512)")
    parser.add_argument("--student", choices=STUDENTS, default="realnvp", help="coupling flow of student and baseline")
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--samples", type=int, default=100_000, help="evaluation samples")
    parser.add_argument("--timing-samples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loose-rtol", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    return {name: run_target(name, args) for name in args.targets}


if __name__ == "__main__":
    main()
