"""Alanine dipeptide Boltzmann generator: ML on MD frames, then energy fine-tuning, evaluated as in the field.

Stages (each on the existing :class:`flows.train.Trainer`, one thread):

1. maximum likelihood on the MD training frames in internal coordinates (``--ml-seconds``);
2. energy fine-tuning (``--ft-seconds``): the mixed objective
   ``w_fwd · ForwardKL(MD frames) + w_rev · ReverseKL(TransformedTarget(ALDP, ic))``
   (``--forward-weight 0`` is pure reverse KL), with the linear-logarithmic energy cut in the loss
   only, and optionally an annealed temperature of the reverse term (``--anneal-from``).

After each stage it reports Kish ESS (N flow samples, no clipping), the test NLL (nats per
configuration: Cartesian positions in nm modulo rigid motions, i.e. internal coordinates with the
exact log-det including the frame factor, without the 8π²V of the rigid motions), KL of the φ and ψ
marginals (200 bins) and of the Ramachandran histogram (64 × 64; FAB's binning, ε = 1e-10), raw
and reweighted, against the reference (1000 K: all 20,000 MD frames; 300 K: the umbrella/MBAR
ensemble with its weights), the fractions in B = {0 < φ < 2.2}, ΔF(B − A) with its delta-method
and bootstrap standard errors, and the largest |F(φ) − F_ref(φ)| over the reference's 60 bins
where F_ref < 8 kT. ``--out`` writes the Ramachandran plot (reference, flow samples, reweighted)
and a JSON of every figure.

    nice -n 10 python benchmarks/alanine.py --temperature 1000 --ml-seconds 600 --ft-seconds 600 --out /tmp/aldp1000
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

import flows
from flows.data.files import data_file
from flows.metrics import histogram_kl, kish_ess, state_free_energy
from flows.metrics.importance import free_energy_profile
from flows.plot.molecules import plot_ramachandran
from flows.targets import AlanineDipeptide, TransformedTarget
from flows.train import CosineDecay, MaximumLikelihood, ReverseKL, Trainer, WeightedSum
from flows.train.energy import AnnealTemperature

B_LOW, B_HIGH = 0.0, 2.2
UMBRELLA = "aldp_vacuum_300K_umbrella.npz"
REFERENCE_DF_SE_300K = 0.13  # bootstrap se of the umbrella/MBAR reference (data README)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1000.0, choices=(300.0, 1000.0))
    p.add_argument("--ml-seconds", type=float, default=300.0)
    p.add_argument("--ft-seconds", type=float, default=300.0)
    p.add_argument("--max-steps", type=int, default=None, help="cap on the steps of each stage (smoke tests)")
    p.add_argument("--transforms", type=int, default=8)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--bins", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ft-lr", type=float, default=2e-4)
    p.add_argument("--ft-batch", type=int, default=256, help="flow samples per reverse-KL step")
    p.add_argument(
        "--cosine", action="store_true", help="decay each stage's learning rate to 0 over its seconds (CosineDecay)"
    )
    p.add_argument("--forward-weight", type=float, default=0.5)
    p.add_argument("--reverse-weight", type=float, default=0.5)
    p.add_argument(
        "--energy-cut",
        type=float,
        default=None,
        help="linlog cut in the loss, this far above the median u_z of MD frames",
    )
    p.add_argument("--anneal-from", type=float, default=None, help="start temperature of the reverse term")
    p.add_argument(
        "--linear-torsions", type=float, default=2.0, help="cut open torsions within this of their mean (0: off)"
    )
    p.add_argument("--samples", type=int, default=20000, help="flow samples N for every estimate")
    p.add_argument("--train-frames", type=int, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def reference(target: AlanineDipeptide, args: argparse.Namespace) -> dict[str, object]:
    """Reference angles, weights, ΔF (and se) and F(φ) for the target's temperature."""
    if args.temperature == 300.0:
        with np.load(data_file(UMBRELLA, args.data_dir)) as f:
            angles = torch.from_numpy(np.stack([f["phi"], f["psi"]], -1))
            return {
                "angles": angles,
                "log_w": torch.from_numpy(f["log_weights"]),
                "delta_f": float(f["dF_kT"]),
                "delta_f_se": float(f["dF_se_kT"]),
                "edges": torch.from_numpy(f["phi_bin_edges"]),
                "F": torch.from_numpy(f["F_phi_kT"]),
                "name": "umbrella/MBAR (57,600 frames, weighted)",
            }
    frames = torch.cat(
        [target.reference_samples(s, args.data_dir, dtype=torch.float64) for s in ("train", "val", "test")]
    )
    angles = target.phi_psi(frames)
    in_b = (angles[:, 0] > B_LOW) & (angles[:, 0] < B_HIGH)
    per_block = torch.tensor([state_free_energy(b).delta_f for b in in_b.chunk(20)])
    profile = free_energy_profile(angles[:, 0], bins=60, range=(-math.pi, math.pi))
    return {
        "angles": angles,
        "log_w": None,
        "delta_f": state_free_energy(in_b).delta_f,
        "delta_f_se": float(
            per_block[torch.isfinite(per_block)].std() / math.sqrt(int(torch.isfinite(per_block).sum()))
        ),
        "edges": torch.linspace(-math.pi, math.pi, 61, dtype=torch.float64),
        "F": profile.free_energy - profile.free_energy[torch.isfinite(profile.free_energy)].min(),
        "name": "MD, all 20,000 frames (block se, 20 blocks)",
    }


@torch.no_grad()
def evaluate(flow, ic, target, test_x, ref, args, label: str, out: Path | None) -> dict[str, float]:
    flow.eval()
    q_test, ladj_test = ic.forward_and_log_det(test_x)
    nll = -(flow.log_prob(q_test.float()).double() + ladj_test).mean().item()
    xs, lws = [], []
    for start in range(0, args.samples, 5000):
        q, log_q = flow.sample_and_log_prob((min(5000, args.samples - start),))
        x, ladj_inverse = ic.inverse_and_log_det(q.double())
        log_w = -target.energy(x) - (log_q.double() - ladj_inverse)
        xs.append(x)
        lws.append(torch.where(torch.isnan(log_w), -math.inf, log_w))
    x, log_w = torch.cat(xs), torch.cat(lws)
    angles = target.phi_psi(x)
    in_b = (angles[:, 0] > B_LOW) & (angles[:, 0] < B_HIGH)
    raw, rew = state_free_energy(in_b), state_free_energy(in_b, log_w, bootstrap=200)
    kl = {}
    for name, cols, bins in (("phi", 0, 200), ("psi", 1, 200), ("rama", slice(None), 64)):
        for kind, w in (("raw", None), ("reweighted", log_w)):
            kl[f"kl_{name}_{kind}"] = histogram_kl(
                ref["angles"][:, cols], angles[:, cols], log_w=w, reference_log_w=ref["log_w"], bins=bins
            )
    profile = free_energy_profile(angles[:, 0], log_w, bins=60, range=(-math.pi, math.pi))
    f_model = profile.free_energy - profile.free_energy[torch.isfinite(profile.free_energy)].min()
    where = ref["F"] < 8.0
    diff = (f_model - ref["F"])[where]
    se = math.sqrt(rew.stderr**2 + ref["delta_f_se"] ** 2)
    result = {
        "stage": label,
        "n": args.samples,
        "ess": float(kish_ess(log_w)),
        "log_w_std": float(log_w[torch.isfinite(log_w)].std()),
        "test_nll": nll,
        **kl,
        "p_b_raw": raw.p_b,
        "p_b_reweighted": rew.p_b,
        "ess_abs_times_p_b": float(kish_ess(log_w)) * args.samples * rew.p_b,
        "delta_f": rew.delta_f,
        "delta_f_se": rew.stderr,
        "delta_f_bootstrap_se": rew.bootstrap_stderr,
        "delta_f_reference": ref["delta_f"],
        "delta_f_reference_se": ref["delta_f_se"],
        "delta_f_tolerance": max(0.3, 3 * se),
        "max_abs_F_error_below_8kT": float(diff.abs().max()) if bool(torch.isfinite(diff).all()) else math.inf,
    }
    result["delta_f_agrees"] = bool(
        abs(rew.delta_f - ref["delta_f"]) <= result["delta_f_tolerance"] and result["ess_abs_times_p_b"] >= 100
    )
    if out is not None:
        panels = [(f"reference: {ref['name']}", ref["angles"], ref["log_w"]), ("flow samples", angles, None)]
        panels.append((f"reweighted (ESS {result['ess']:.3f})", angles, log_w))
        title = f"ALDP vacuum {args.temperature:g} K, {label}"
        stem = f"{int(args.temperature)}K_{label}"
        plot_ramachandran(panels, out / f"ramachandran_{stem}.png", title=title)
        torch.save({"angles": angles.float(), "log_w": log_w}, out / f"samples_{stem}.pt")  # to re-plot
        torch.save(flow.state_dict(), out / f"flow_{stem}.pt")
    return result


def report(result: dict[str, float]) -> None:
    print(f"== {result['stage']}")
    for key, value in result.items():
        if key != "stage":
            print(f"   {key:28s} {value:.5g}" if isinstance(value, float) else f"   {key:28s} {value}")


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    target = AlanineDipeptide(temperature=args.temperature)
    train_x = target.reference_samples("train", args.data_dir, dtype=torch.float64)[: args.train_frames]
    val_x = target.reference_samples("val", args.data_dir, dtype=torch.float64)[:1000]
    test_x = target.reference_samples("test", args.data_dir, dtype=torch.float64)
    extra = {"linear_torsions": args.linear_torsions} if args.linear_torsions > 0 else {}
    ic = target.internal_coordinates(reference=train_x, **extra)
    data, val = ic(train_x).float(), ic(val_x).float()
    flow = flows.NCSF(
        data.shape[-1], transforms=args.transforms, hidden=tuple(args.hidden), bins=args.bins,
        circular=ic.circular, lower=ic.lower, upper=ic.upper,
    )  # fmt: skip
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    ref = reference(target, args)
    n_circ = int(ic.circular.sum())
    print(f"ALDP vacuum {args.temperature:g} K: {len(train_x)} frames; {n_circ} of 60 coordinates on the circle")
    results = []
    t0 = time.perf_counter()
    trainer = Trainer(flow, MaximumLikelihood(), lr=args.lr, clip_grad_norm=10.0, progress=False)
    if args.cosine:
        trainer.callbacks.append(CosineDecay(trainer.optimizer, seconds=args.ml_seconds))
    trainer.fit(data, val, batch_size=args.batch, time_budget=args.ml_seconds, max_steps=args.max_steps, epochs=10_000)
    ml_steps, ml_time = trainer.step, time.perf_counter() - t0
    results.append(evaluate(flow, ic, target, test_x, ref, args, "ml", out))
    results[-1].update(steps=ml_steps, train_seconds=ml_time)
    report(results[-1])
    if args.ft_seconds > 0:
        flow.train()
        pulled = TransformedTarget(target, ic)
        cut = None
        if args.energy_cut is not None:
            cut = float(pulled.energy(data[:2000].double()).median()) + args.energy_cut
            print(f"energy cut of the reverse-KL loss at u_z = {cut:.1f}")
        reverse = ReverseKL(pulled, batch_size=args.ft_batch, energy_cut=cut)
        terms = [(args.reverse_weight, reverse, "rev")]
        if args.forward_weight > 0:
            terms.insert(0, (args.forward_weight, MaximumLikelihood(), "fwd"))
        callbacks = []
        if args.anneal_from is not None:
            reverse.temperature = args.anneal_from
            callbacks.append(AnnealTemperature(reverse, seconds=args.ft_seconds, start=args.anneal_from, end=1.0))
        t0 = time.perf_counter()
        tuner = Trainer(
            flow, WeightedSum(terms), lr=args.ft_lr, clip_grad_norm=10.0, callbacks=callbacks, progress=False
        )
        if args.cosine:
            tuner.callbacks.append(CosineDecay(tuner.optimizer, seconds=args.ft_seconds))
        tuner.fit(data, batch_size=args.batch, time_budget=args.ft_seconds, max_steps=args.max_steps, epochs=10_000)
        results.append(evaluate(flow, ic, target, test_x, ref, args, "finetuned", out))
        results[-1].update(steps=tuner.step, train_seconds=time.perf_counter() - t0)
        report(results[-1])
    if out is not None:
        (out / f"alanine_{int(args.temperature)}K.json").write_text(
            json.dumps({"args": vars(args), "results": results}, indent=1)
        )
    return results


if __name__ == "__main__":
    main()
