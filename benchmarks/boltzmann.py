"""Boltzmann sampling: the SNF double well (flows vs normflows) and the many-well in d = 8, 16, 32.

**Double well** (u = x₁⁴ − 6x₁² − 0.5x₁ + ½x₂²; exact log Z and free energy). Models with the same
eight affine couplings (MLPs 1 → 64 → 64 → 2), as in ``examples/boltzmann_double_well.py``: flows
RealNVP; the paper's ``interleaved`` SNF (a Metropolis block, 20 steps of size 0.25, on u_λ,
λ = i/8, after every coupling); and the ``final`` SNF, i.e. the trained RealNVP followed by one such
block on the target (no extra training: its loss is per sample the flow's own, see the example);
and normflows' equivalents of all three (``AffineCouplingBlock`` + ``Permute`` +
``MetropolisHastings``, on ``LinearInterpolation`` when interleaved). The trained models are
trained with the same data-free recipe (reverse KL to a ``TemperedEnergy`` shared by every loss and
every Metropolis block, its temperature annealed 4 → 1 over the first 60% of the steps; Adam 1e-3
with a cosine schedule, batch 512, gradient norm clipped at 10), **in lockstep** (one step of each
model in turn, so that they share the machine's load), and scored from the same number of fresh
samples: Kish ESS, log-Z error ± standard error, and the mean |ΔF| of the free-energy profile along
x₁ on |x₁| < 2.25 against the exact one, unweighted and reweighted (over the bins where exact
sampling expects ≥ 50 samples). The median training-step times are printed side by side, as
ratios to flows' model of the same layout.

**Many-well** (d/2 double wells, 2^(d/2) modes): the pair-shared RealNVP of
``examples/boltzmann_many_well.py`` trained by annealed reverse KL on a wall-clock budget per d
(``--mw-budget`` seconds for d = 32, proportionally less for d = 8, 16): ESS, log-Z error, and the
distinct modes among the samples next to the number exact samples of the same size cover.

Threads: 1 (``torch.set_num_threads``) for the double well; ``--mw-threads`` (default 2) for the
many-well, whose budget is wall-clock.

    python benchmarks/boltzmann.py                                  # 3000 steps; many-well 1800 s at d = 32
    python benchmarks/boltzmann.py --steps 300 --mw-budget 120      # a quick look
    python benchmarks/boltzmann.py --layouts none final --mw-dims     # the double well without the interleaved SNFs
"""

from __future__ import annotations

import argparse
import statistics
import time

import _harness
import torch

from flows.targets import DoubleWell, ManyWell, TemperedEnergy
from flows.train import annealed_temperature, reverse_kl_loss


def normflows_snf(
    target: TemperedEnergy, layout: str, *, transforms: int, hidden: int, mc_steps: int, step_size: float
):
    """The normflows model of the same size and layout, or ``None`` when normflows is not installed."""
    try:
        import normflows as nf
    except ImportError:
        return None

    class Wrapped(torch.nn.Module):
        def log_prob(self, z: torch.Tensor) -> torch.Tensor:
            return -target.energy(z)

    p, base = Wrapped(), nf.distributions.DiagGaussian(2, trainable=False)
    layers = []
    for i in range(transforms):
        layers.append(nf.flows.AffineCouplingBlock(nf.nets.MLP([1, hidden, hidden, 2], init_zeros=True)))
        layers.append(nf.flows.Permute(2, mode="swap"))
        if layout == "interleaved":
            energy = nf.distributions.LinearInterpolation(p, base, (i + 1) / transforms)
            proposal = nf.distributions.DiagGaussianProposal((2,), step_size)
            layers.append(nf.flows.MetropolisHastings(energy, proposal, mc_steps))
    return nf.NormalizingFlow(base, layers, p)


def normflows_add_final_block(model, *, mc_steps: int, step_size: float):
    """The trained normflows model (shared layers) followed by a MetropolisHastings layer on its target."""
    import normflows as nf

    proposal = nf.distributions.DiagGaussianProposal((2,), step_size)
    layers = [*model.flows, nf.flows.MetropolisHastings(model.p, proposal, mc_steps)]
    return nf.NormalizingFlow(model.q0, layers, model.p)


def _ours_step(flow, tempered: TemperedEnergy, batch: int) -> torch.Tensor:
    loss, _ = reverse_kl_loss(flow, tempered, batch)
    return loss


def _nf_step(model, tempered: TemperedEnergy, batch: int) -> torch.Tensor:
    return model.reverse_kld(batch)  # model.p is the shared tempered target


def double_well(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    ex = _harness.load_example("boltzmann_double_well.py")  # the example's models and scores, against normflows
    target = DoubleWell()
    tempered = TemperedEnergy(target)  # shared by every loss and every block: annealed in lockstep
    models, steppers = {}, {}
    sizes = {"transforms": args.transforms, "hidden": args.hidden, "mc_steps": args.mc_steps}
    # trained in lockstep: RealNVP (needed by "final" too) and the interleaved SNF, in both libraries
    to_train = [layout for layout in ("none", "interleaved") if layout in args.layouts]
    if "final" in args.layouts and "none" not in to_train:
        to_train.insert(0, "none")
    names = {"none": "RealNVP", "interleaved": "SNF, interleaved", "final": "SNF, final"}
    for layout in to_train:
        torch.manual_seed(0)
        name = f"flows {names[layout]}"
        models[name], steppers[name] = ex.build(layout, tempered, **sizes), _ours_step
    for layout in to_train:
        torch.manual_seed(0)
        peer = normflows_snf(tempered, layout, step_size=0.25, **sizes)
        if peer is None:
            print("normflows is not installed (pip install '.[bench]'): skipping it")
            break
        models[f"normflows {names[layout]}"], steppers[f"normflows {names[layout]}"] = peer, _nf_step
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in models.items()}
    schedules = {k: torch.optim.lr_scheduler.CosineAnnealingLR(o, args.steps) for k, o in optimizers.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    failed: dict[str, str] = {}
    for step in range(args.steps):
        tempered.temperature = annealed_temperature(step / args.steps)
        for name, model in models.items():
            if name in failed:
                continue
            start = time.perf_counter()
            loss = steppers[name](model, tempered, args.batch)
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizers[name].step()
            schedules[name].step()
            times[name].append(time.perf_counter() - start)
            if not torch.isfinite(loss):
                failed[name] = f"non-finite loss at step {step}"
    tempered.temperature = 1.0
    if "final" in args.layouts:  # the trained RealNVPs followed by a block on the target (no extra training)
        models["flows SNF, final"] = ex.add_final_block(models["flows RealNVP"], target, mc_steps=args.mc_steps)
        if "normflows RealNVP" in models:
            nf_final = normflows_add_final_block(models["normflows RealNVP"], mc_steps=args.mc_steps, step_size=0.25)
            models["normflows SNF, final"] = nf_final
        if "none" not in args.layouts:
            for lib in ("flows", "normflows"):
                models.pop(f"{lib} RealNVP", None)
        times.update({name: [] for name in models if name.endswith("final")})

    def ours(name: str) -> str:  # the flows model of the same layout: the step-time reference
        return name.replace("normflows", "flows")

    results = {}
    for name, model in models.items():
        torch.manual_seed(1)
        model.eval()
        with torch.no_grad():
            if name.startswith("normflows"):
                chunk = min(10_000, args.samples)
                xs, lqs = zip(*(model.sample(chunk) for _ in range(max(1, args.samples // chunk))), strict=True)
                x, log_q = torch.cat(xs), torch.cat(lqs)
            else:
                x, log_q = model.sample_and_log_prob((args.samples,))
        log_w = -target.energy(x) - log_q
        finite = torch.isfinite(log_w)
        scores = ex.scores(x[finite], log_w[finite], target) if finite.any() else {}
        results[name] = {**scores, "step_ms": 1e3 * statistics.median(times[name]) if times[name] else float("nan")}
        if name in failed:
            results[name]["failed"] = failed[name]
    setting = f"{args.samples} samples; {torch.get_num_threads()} thread(s)"
    print(f"\ndouble well: {args.steps} annealed reverse-KL steps each, in lockstep; {setting}")
    columns = f"{'model':26s} {'ESS':>7s} {'log Z error':>17s} {'|ΔF| unweighted':>16s} {'|ΔF| reweighted':>16s}"
    print(columns + f" {'step ms':>8s} {'vs flows':>9s}")
    for name, r in results.items():
        if "ess" not in r:
            print(f"{name:26s} failed: {r.get('failed', 'no finite weights')}")
            continue
        log_z = f"{r['log_z_error']:+.4f} ± {r['log_z_stderr']:.4f}"
        print(
            f"{name:26s} {r['ess']:7.4f} {log_z:>17s} {r['profile_unweighted']:16.4f} {r['profile_reweighted']:16.4f} "
            + (
                f"{'—':>8s} {'—':>9s}  (no training: the RealNVP above + a final block)"
                if name.endswith("final")
                else f"{r['step_ms']:8.2f} {r['step_ms'] / results[ours(name)]['step_ms']:8.2f}x"
            )
            + (f"  ({r['failed']})" if "failed" in r else "")
        )
    return results


def many_well(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(args.mw_threads)
    ex = _harness.load_example("boltzmann_many_well.py")
    results = {}
    for dim in args.mw_dims:
        budget = args.mw_budget * dim / 32
        torch.manual_seed(0)
        target = ManyWell(dim)
        flow = ex.build(dim)
        steps, seconds = ex.train(flow, target, method="anneal", budget=budget, batch=args.mw_batch)
        results[dim] = {**ex.evaluate(flow, target, n=args.samples), "steps": steps, "train_s": seconds}
    print(f"\nmany-well: pair-shared RealNVP, annealed reverse KL, {args.mw_threads} threads, {args.samples} samples")
    columns = (
        ("d", 3),
        ("modes", 7),
        ("budget s", 9),
        ("steps", 6),
        ("ESS", 7),
        ("log Z error", 17),
        ("modes seen", 11),
        ("exact: seen", 12),
    )
    print(" ".join(f"{name:>{width}s}" for name, width in columns))
    for dim, r in results.items():
        log_z = f"{r['log_z_error']:+.4f} ± {r['log_z_stderr']:.4f}"
        print(
            f"{dim:3d} {2 ** (dim // 2):7d} {r['train_s']:9.0f} {r['steps']:6d} {r['ess']:7.4f} {log_z:>17s} "
            f"{r['modes_distinct']:11d} {r['modes_expected']:12.0f}"
        )
    torch.set_num_threads(threads)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = _harness.parser(__doc__, seed=None)
    parser.add_argument("--steps", type=int, default=3000, help="double-well training steps per model")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--transforms", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--mc-steps", type=int, default=20)
    parser.add_argument(
        "--layouts",
        nargs="*",
        choices=("none", "final", "interleaved"),
        default=["none", "final", "interleaved"],
        help="double-well models to train (normflows too for the SNF layouts); none at all skips the double well",
    )
    parser.add_argument("--samples", type=int, default=100_000, help="evaluation samples")
    parser.add_argument("--mw-dims", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--mw-budget", type=float, default=1800.0, help="many-well training seconds at d = 32")
    parser.add_argument("--mw-batch", type=int, default=128)
    parser.add_argument("--mw-threads", type=int, default=2)
    args = _harness.setup(parser.parse_args(argv))
    return {
        "double_well": double_well(args) if args.layouts else {},
        "many_well": many_well(args) if args.mw_dims else {},
    }


if __name__ == "__main__":
    main()
