"""Particle Boltzmann generator (DW4 or LJ13): an E(n)-equivariant CNF trained by equivariant OT flow matching.

Reads the reference samples from ``$FLOWS_DATA_DIR`` (or ``--data-dir``). **DW4 trains on its
``train`` split (100k) and LJ13 on ``val`` (10k); both test on ``test``.** The model is
:class:`flows.particles.EquivariantCNF` (EGNN field, mean-free Gaussian base); training is
:class:`flows.train.FlowMatching` with :class:`flows.particles.EquivariantOTCoupling` (Klein,
Krämer, Noé 2023), Adam 5e-4, batch 128, for ``--seconds`` of wall time or ``--steps`` steps.
Then: test NLL by the exact trace in float64 (dopri5 at ``--tol``) in both conventions of the
literature, Kish ESS, log Z and the reweighted mean energy from ``--samples`` flow samples, and
the energy and pair-distance histograms (``histograms.png`` in ``--out``, beside ``model.pt``).
With ``--check-tol``, the log-densities of the same samples are recomputed at a tighter solver
tolerance, to see whether the reweighted energy depends on it. ``--compile-trace`` evaluates with
the exact divergence through ``torch.compile`` (faster on LJ13 once compiled; about half a minute
to compile).

The loop is written out rather than run by :class:`flows.train.Trainer`, which has no moving
average of the weights (``--ema``, :class:`torch.optim.swa_utils.AveragedModel`); the cosine
decay runs over the wall-clock budget.

    python examples/boltzmann_particles.py                          # DW4, 5 minutes
    python examples/boltzmann_particles.py --system lj13 --seconds 1800
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

from flows._malloc import keep_freed_memory
from flows.metrics import kish_ess
from flows.particles import EquivariantCNF, EquivariantOTCoupling, boltzmann_evaluation, nll_conventions, particle_nll
from flows.plot import plot_particle_histograms
from flows.targets import DW4, LJ13
from flows.train import FlowMatching

SYSTEMS = {"dw4": (DW4, "train"), "lj13": (LJ13, "val")}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=sorted(SYSTEMS), default="dw4")
    parser.add_argument("--seconds", type=float, default=300.0, help="training wall time")
    parser.add_argument("--steps", type=int, default=None, help="also stop after this many steps")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument(
        "--coupling",
        choices=["equivariant-ot", "aligned", "ot", "independent"],
        default="equivariant-ot",
        help="flow-matching coupling: equivariant OT (Klein et al. 2023), pairs only aligned, plain OT, none",
    )
    parser.add_argument(
        "--candidates", type=int, default=None, help="equivariant OT: aligned costs only for this many rows per column"
    )
    parser.add_argument(
        "--schedule", choices=["constant", "cosine"], default="cosine", help="learning rate over the budget"
    )
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--tol", type=float, default=1e-4, help="dopri5 rtol = atol for log q")
    parser.add_argument("--test", type=int, default=1000, help="test rows for the NLL")
    parser.add_argument("--samples", type=int, default=2000, help="flow samples for ESS and reweighting")
    parser.add_argument("--eval-batch", type=int, default=500, help="rows per ODE solve in the evaluation")
    parser.add_argument(
        "--eval-dtype", choices=["float32", "float64"], default="float64", help="dtype of the NLL and ESS solves"
    )
    parser.add_argument(
        "--ema", type=float, default=0.0, help="evaluate an exponential moving average of the weights with this decay"
    )
    parser.add_argument(
        "--compile-trace",
        action="store_true",
        help="evaluate with the exact divergence through torch.compile (EGNN.compile_divergence; ~35 s to compile)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=os.environ.get("FLOWS_DATA_DIR"))
    parser.add_argument(
        "--check-tol", type=float, default=None, help="recompute log q of the samples at this tolerance"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/boltzmann_particles"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    keep_freed_memory()  # glibc: no page faults on every large tensor (flows._malloc); results unchanged

    cls, split = SYSTEMS[args.system]
    target = cls()
    n, d = target.n_particles, target.spatial_dim
    data = target.reference_samples(split, args.data_dir)
    test = target.reference_samples("test", args.data_dir)[: args.test]
    flow = EquivariantCNF(n, d, hidden=(args.hidden,) * args.layers, rtol=args.tol, atol=args.tol)
    couplings = {
        "equivariant-ot": EquivariantOTCoupling(n, d, candidates=args.candidates),
        "aligned": EquivariantOTCoupling(n, d, ot=False),
        "ot": "ot",
        "independent": "independent",
    }
    objective = FlowMatching(coupling=couplings[args.coupling])
    optimizer = torch.optim.Adam(flow.parameters(), lr=args.lr)
    if not 0.0 <= args.ema < 1.0:
        parser.error(f"--ema: expected a decay in [0, 1), got {args.ema}")
    average = None
    if args.ema > 0:  # the weights' exponential moving average (the flow keeps training the raw weights)
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        average = AveragedModel(flow, multi_avg_fn=get_ema_multi_avg_fn(args.ema), use_buffers=True)

    start, step = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < args.seconds and (args.steps is None or step < args.steps):
        if args.schedule == "cosine":  # decay over the wall-clock budget (or the step budget, if sooner)
            done = elapsed / args.seconds if args.steps is None else max(elapsed / args.seconds, step / args.steps)
            for group in optimizer.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        loss = objective(flow, data[torch.randint(len(data), (args.batch,))])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if average is not None:
            average.update_parameters(flow)
        step += 1
        if step % 200 == 0:
            print(f"step {step}: flow-matching loss {loss.item():.3f}", flush=True)
    train_s = time.perf_counter() - start
    if average is not None:
        flow.load_state_dict(average.module.state_dict())

    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(flow.state_dict(), args.out / "model.pt")  # before the (long) evaluation
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.eval_dtype]
    flow.transform.field.compile_divergence = args.compile_trace
    clock = time.perf_counter()
    nlls = particle_nll(flow, test, batch_size=args.eval_batch, dtype=dtype, progress=True)
    nll_s, nfe = time.perf_counter() - clock, flow.transform.nfe
    nll = nll_conventions(nlls.mean().item(), n, d)
    nll_se = nlls.std().item() / math.sqrt(len(nlls))
    result = boltzmann_evaluation(flow, target, args.samples, batch_size=args.eval_batch, dtype=dtype, progress=True)
    where = "train" if args.system == "dw4" else "val (10k)"
    title = f"{args.system.upper()}: trained on {where}, {step} steps; tested on test"
    plot_particle_histograms(target, test, result.samples, result.log_w, args.out / "histograms.png", title=title)
    print(f"\n{title} ({train_s:.0f} s, threads={torch.get_num_threads()})")
    print(
        f"test NLL {nll['normalised']:.3f} ± {nll_se:.3f} (normalised) = {nll['bgflow']:.3f} (bgflow convention); "
        f"{len(test)} rows in {nll_s:.0f} s ({args.eval_dtype}, {nfe} evaluations in the last solve)"
    )
    print(f"{args.samples} samples with log q in {result.seconds:.0f} s ({args.eval_dtype})")
    print(
        f"ESS {result.ess:.3f}, log Z {result.log_z[0]:.3f} ± {result.log_z[1]:.3f}, reweighted <u> "
        f"{result.mean_energy[0]:.3f} ± {result.mean_energy[1]:.3f} (data mean {target.energy(test).mean().item():.3f})"
    )
    out = {}
    if args.check_tol is not None:  # is the reweighted energy limited by the solver tolerance of log q?
        x = result.samples.to(torch.float32)
        flow.transform.rtol = flow.transform.atol = args.check_tol
        log_q = -particle_nll(flow, x, batch_size=500)
        log_w = -result.energy - log_q
        log_w = torch.where(torch.isfinite(log_w), log_w, torch.full_like(log_w, -torch.inf))
        u = torch.where(torch.isfinite(result.energy), result.energy, torch.zeros_like(result.energy))
        w = torch.softmax(log_w, 0)
        out = {"mean_energy_tight": float((w * u).sum()), "ess_tight": float(kish_ess(log_w))}
        change = (log_q - (-result.energy - result.log_w))[torch.isfinite(result.log_w)]
        print(
            f"same samples, log q recomputed at tolerance {args.check_tol:g}: ESS {out['ess_tight']:.3f}, "
            f"reweighted <u> {out['mean_energy_tight']:.3f}; max |change of log q| {change.abs().max().item():.2e}"
        )
    return out | {
        "steps": step,
        "nll": nll["normalised"],
        "nll_bgflow": nll["bgflow"],
        "ess": result.ess,
        "mean_energy": result.mean_energy[0],
    }


if __name__ == "__main__":
    main()
