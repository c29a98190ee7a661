"""A Boltzmann generator for alanine dipeptide: maximum likelihood on MD frames in internal coordinates.

The flow is a mixed-domain NCSF on the 60 internal coordinates of ALDP (torsions on the circle,
angles in (0, π), bonds positive, the CB improper restricted to the L enantiomer), trained by
maximum likelihood (in :class:`flows.train.Trainer`) on the 1000 K (or 300 K) MD frames of the data
directory, then evaluated against the OpenMM energy by importance sampling. Printed: the test NLL
(nats per configuration, Cartesian positions in nm modulo rigid motions, i.e. the exact
internal-coordinate log-det with the frame factor and without the 8π²V of the rigid motions), Kish
ESS with its N (no clipping), KL of the φ marginal (200 bins on [-π, π], ε = 1e-10, as FAB) raw and
reweighted, and the fraction of samples in state B = {0 < φ < 2.2}. With ``--out`` a Ramachandran
plot is written.

Needs openmm (``pip install "flows[molecules]"``) and the data directory (``--data-dir`` or
``$FLOWS_DATA_DIR``)::

    python examples/boltzmann_alanine.py --seconds 300 --out runs/aldp
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import flows
import flows.metrics
import flows.plot
from flows.metrics.importance import kish_ess
from flows.targets import AlanineDipeptide
from flows.train import PrintMetrics, Trainer

B_LOW, B_HIGH = 0.0, 2.2


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1000.0, choices=(300.0, 1000.0))
    p.add_argument("--seconds", type=float, default=120.0, help="training budget (wall clock)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: budget only)")
    p.add_argument("--transforms", type=int, default=8)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--bins", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--samples", type=int, default=20000, help="flow samples N for the ESS and the phi marginal")
    p.add_argument("--train-frames", type=int, default=None, help="use only the first frames (smoke tests)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for the Ramachandran plot")
    return p.parse_args(argv)


def histogram_kl(reference: torch.Tensor, model: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """KL(reference || model) of φ histograms: 200 bins on [-π, π], ε = 1e-10 (FAB's convention)."""
    log_w = None if weights is None else weights.double().log()
    return flows.metrics.histogram_kl(reference, model, log_w=log_w, bins=200)


def train(flow: flows.Flow, data: torch.Tensor, args: argparse.Namespace) -> tuple[int, float]:
    """Maximum likelihood in :class:`flows.train.Trainer` (Adam, clipping at 10) for ``--seconds`` or ``--steps``."""
    trainer = Trainer(flow, lr=args.lr, clip_grad_norm=10.0, callbacks=[PrintMetrics()], progress=False)
    start = time.perf_counter()
    trainer.fit(data, batch_size=args.batch, max_steps=args.steps, time_budget=args.seconds, seed=args.seed)
    return trainer.step, time.perf_counter() - start


def evaluate(flow, ic, target, test: torch.Tensor, args: argparse.Namespace) -> dict[str, float]:
    with torch.no_grad():
        q_test, ladj_test = ic.forward_and_log_det(test)
        nll = -(flow.log_prob(q_test.float()).double() + ladj_test).mean().item()
        q, log_q = flow.sample_and_log_prob((args.samples,))
        x, ladj_inverse = ic.inverse_and_log_det(q.double())
        log_q_x = log_q.double() - ladj_inverse  # density of the positions (modulo rigid motions)
        log_w = -target.energy(x) - log_q_x
        log_w = torch.where(torch.isnan(log_w), -math.inf, log_w)
        w = torch.softmax(log_w, 0)
        phi, phi_test = target.phi_psi(x)[:, 0], target.phi_psi(test)[:, 0]
        in_b = lambda f: (f > B_LOW) & (f < B_HIGH)  # noqa: E731
    return {
        "test_nll": nll,
        "ess": float(kish_ess(log_w)),
        "n": args.samples,
        "kl_phi_raw": histogram_kl(phi_test, phi),
        "kl_phi_reweighted": histogram_kl(phi_test, phi, w),
        "p_b_raw": float(in_b(phi).double().mean()),
        "p_b_reweighted": float((w * in_b(phi)).sum()),
        "p_b_test": float(in_b(phi_test).double().mean()),
        "_x": x,
        "_w": w,
    }


def ramachandran(target, test: torch.Tensor, x: torch.Tensor, w: torch.Tensor, path: Path) -> None:
    """MD test frames, flow samples and reweighted flow samples side by side (100×100 bins, log colour)."""
    angles = target.phi_psi(x)
    panels = [("MD test frames", target.phi_psi(test), None), ("flow samples", angles, None)]
    flows.plot.plot_ramachandran([*panels, ("reweighted flow samples", angles, w.double().log())], path)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = AlanineDipeptide(temperature=args.temperature)
    train_x = target.reference_samples("train", args.data_dir, dtype=torch.float64)[: args.train_frames]
    test_x = target.reference_samples("test", args.data_dir, dtype=torch.float64)
    ic = target.internal_coordinates(reference=train_x)
    data = ic(train_x).float()
    flow = flows.NCSF(
        data.shape[-1],
        transforms=args.transforms,
        hidden=tuple(args.hidden),
        bins=args.bins,
        circular=ic.circular,
        lower=ic.lower,
        upper=ic.upper,
    )
    print(f"ALDP vacuum {args.temperature:g} K: {len(train_x)} training frames, 60 internal coordinates")
    steps, seconds = train(flow, data, args)
    flow.eval()
    result = evaluate(flow, ic, target, test_x, args)
    result.update(steps=steps, train_seconds=seconds)
    print(f"trained {steps} steps in {seconds:.0f} s (1 thread: {args.threads})")
    print(f"test NLL {result['test_nll']:.2f} nats (Cartesian nm, modulo rigid motions; {len(test_x)} test frames)")
    print(f"Kish ESS {result['ess']:.4f} of N = {args.samples} flow samples (no clipping)")
    kl_raw, kl_rew = result["kl_phi_raw"], result["kl_phi_reweighted"]
    print(f"KL(phi) raw {kl_raw:.4f}, reweighted {kl_rew:.4f} (vs the MD test frames)")
    print(
        f"p(B) raw {result['p_b_raw']:.4f}, reweighted {result['p_b_reweighted']:.4f}, MD test {result['p_b_test']:.4f}"
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        ramachandran(target, test_x, result["_x"], result["_w"], out / "ramachandran.png")
        print(f"wrote {out / 'ramachandran.png'}")
    return {k: v for k, v in result.items() if not k.startswith("_")}


if __name__ == "__main__":
    main()
