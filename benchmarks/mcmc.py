"""Flow-based MCMC against local MCMC at an equal budget of target evaluations; MALA kernel overhead.

Sections (``--sections``, all by default):

* ``mixture``: the 4-mode Gaussian mixture of Grenioux et al. (2023) in d ∈ {16, 32, 64}. The
  chains start **unevenly** across the modes (55 % in the first, 15 % in each other), so a sampler
  that cannot cross the barriers keeps the wrong weights (error 0.30), while one that mixes
  reaches 1/4 each. Mode-weight error = max_k |ŵ_k − 1/4| over the recorded samples.
* ``funnel``: Neal's funnel (d = 10, neck scale 3); the error is the Kolmogorov–Smirnov distance of
  the neck coordinate v to N(0, 3²) (the funnel defeats fixed-step local samplers in the neck), and
  SW2 is measured on the funnel's standard-normal latent coordinates.
* ``phi4``: the 1-D φ⁴ field (64 sites, a = 0.1, b = 0, β = 20, Dirichlet), bimodal by symmetry;
  chains start 75 % in the + mode; the error is |fraction of positive magnetisation − 1/2|.
* ``overhead``: one MALA step against one ``energy_and_grad`` on the same batch of chain states
  (interleaved, medians), beside the random-number floor (the d normals + 1 uniform per chain a
  MALA step must draw) and a textbook MALA that re-evaluates the gradient at the current state.

Protocol (every target): each sampler gets the same budget of target evaluations per chain
(energies and gradients alike, counted by :class:`flows.mcmc.CountingTarget`; the table prints
the measured counts), a quarter of it as warm-up. Global-local (flowMC: 1 IMH + 5 MALA moves per
step) trains its flow (an LU-linear layer, then 6 RealNVP couplings; standard normal base) online
on the chains during warm-up, from the identity, with ``--train-steps`` Adam steps per warm-up step
(training costs time, not target evaluations); IMH, i-SIR (4 proposals) and NeuTra-MALA then
reuse **that** flow, frozen (its training is charged to the global-local row only). ESS is the
mean over coordinates of the multi-chain ESS of the recorded samples; ESS/s divides by the whole
run (warm-up included). One thread.

    python benchmarks/mcmc.py                                   # everything (about 30 minutes)
    python benchmarks/mcmc.py --sections mixture --dims 32      # the headline target
    python benchmarks/mcmc.py --sections overhead
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import _harness
import torch
from scipy import stats

from flows import Chain, Flow, LULinear, RealNVP, StandardNormal
from flows.mcmc import HMC, IMH, ISIR, MALA, CountingTarget, GlobalLocal, Kernel, NeuTra, sample
from flows.metrics import effective_sample_size, mode_weight_error, sliced_wasserstein, split_rhat
from flows.targets import LJ13, EnergyTarget, Funnel, GaussianMixture, PhiFour

N_LOCAL = 5


def _uneven_start(locs: torch.Tensor, chains: int, fractions: list[float], noise: float) -> torch.Tensor:
    counts = [int(chains * f) for f in fractions[:-1]]
    counts.append(chains - sum(counts))
    return torch.cat([locs[k] + noise * torch.randn(c, *locs.shape[1:]) for k, c in enumerate(counts)])


def _run(name: str, kernel: Kernel, counter: CountingTarget, start: torch.Tensor, steps: int, callback=None) -> dict:
    counter.reset()
    warmup = steps // 4
    trace = sample(kernel, start, steps - warmup, warmup=warmup, callback=callback)
    seconds = trace.seconds + trace.warmup_seconds
    ess = float(effective_sample_size(trace.samples).mean())
    return {
        "sampler": name,
        "trace": trace,
        "evals": counter.evaluations / start.shape[0],
        "seconds": seconds,
        "accept": trace.acceptance_rate(),
        "ess": ess,
        "ess_per_s": ess / seconds,
        "rhat": float(split_rhat(trace.samples).max()),
    }


def compare(
    target: EnergyTarget,
    start: torch.Tensor,
    *,
    budget: int,
    transforms: int,
    hidden: int,
    lr: float,
    train_steps: int,
    step_size: float,
    early: float = 0.0,
) -> list[dict]:
    """Global-local (trains the flow), then MALA, HMC, IMH, i-SIR, NeuTra-MALA with that flow, equal budgets.

    With ``early > 0``, IMH and NeuTra-MALA also run with a snapshot of the flow taken after that
    fraction of the global-local warm-up (a poorer flow).
    """
    counter = CountingTarget(target)
    d = target.dim
    couplings = RealNVP(d, transforms=transforms, hidden=(hidden, hidden)).transform
    flow = Flow(Chain(LULinear(d), *couplings), StandardNormal(d))  # a linear layer, then the couplings
    gl = GlobalLocal(
        IMH(counter, flow),
        MALA(counter, step_size),
        local_steps=N_LOCAL,
        train=True,
        lr=lr,
        train_steps=train_steps,
        batch_size=512,
        memory=30,
    )
    steps = budget // (N_LOCAL + 1)
    snapshot_at, snapshots = int(early * (steps // 4)), {}

    def snapshot(i: int, state, info) -> None:
        if early > 0 and i == snapshot_at:
            snapshots["early"] = copy.deepcopy(flow).requires_grad_(False)

    rows = [_run("global-local (flowMC)", gl, counter, start, steps, snapshot)]
    flow.requires_grad_(False)
    samplers: dict[str, tuple[Callable[[], Kernel], int]] = {
        "MALA": (lambda: MALA(counter, step_size), budget),
        "HMC (5 leapfrog)": (lambda: HMC(counter, step_size, 5), budget // 5),
        "IMH (flow)": (lambda: IMH(counter, flow), budget),
        "i-SIR (flow, 4 prop.)": (lambda: ISIR(counter, flow, n_proposals=4), budget // 4),
        "NeuTra-MALA (flow)": (lambda: NeuTra(counter, flow, step_size=0.5), budget),
    }
    if "early" in snapshots:
        poor = snapshots["early"]
        samplers[f"IMH (flow at {early:.0%} of warm-up)"] = (lambda: IMH(counter, poor), budget)
        samplers[f"NeuTra-MALA (flow at {early:.0%})"] = (lambda: NeuTra(counter, poor, step_size=0.5), budget)
    for name, (make, n_steps) in samplers.items():
        rows.append(_run(name, make(), counter, start, n_steps))
    return rows


def _sw(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """Sliced W2 between the last draws (all chains) and exact samples, fixed projections."""
    last = samples.reshape(-1, samples.shape[-1])[-len(reference) :]
    return sliced_wasserstein(last, reference, generator=torch.Generator().manual_seed(0))


def _jumps(labels: torch.Tensor) -> float:
    """Mean number of mode changes per chain between consecutive recorded samples (``(draws, chains)`` labels)."""
    return float((labels[1:] != labels[:-1]).double().sum(0).mean())


def _print(title: str, rows: list[dict], error_name: str) -> None:
    print(f"\n{title}")
    header = f"{'sampler':30s} {'evals/chain':>11s} {'seconds':>8s} {'accept':>7s} {error_name:>12s}"
    header += f" {'jumps':>6s} {'SW2':>6s} {'ESS':>8s} {'ESS/s':>8s} {'max R^':>7s}"
    print(header)
    for r in rows:
        jumps = f"{r['jumps']:6.1f}" if "jumps" in r else f"{'-':>6s}"
        sw = f"{r['sw']:6.3f}" if "sw" in r else f"{'-':>6s}"
        print(
            f"{r['sampler']:30s} {r['evals']:11.0f} {r['seconds']:8.1f} {r['accept']:7.3f} {r['error']:12.3f} "
            f"{jumps} {sw} {r['ess']:8.1f} {r['ess_per_s']:8.1f} {r['rhat']:7.2f}"
        )
    print("(jumps: mode changes per chain over the recorded samples)" if "jumps" in rows[0] else "")


def mixture(
    dims: list[int], budget: int, chains: int, *, hidden: int, train_steps: int, early: float
) -> dict[int, list[dict]]:
    results = {}
    for d in dims:
        target = GaussianMixture.four_modes(d)
        start = _uneven_start(target.locs, chains, [0.55, 0.15, 0.15, 0.15], 1.0)
        rows = compare(
            target,
            start,
            budget=budget,
            transforms=6,
            hidden=hidden,
            lr=1e-3,
            train_steps=train_steps,
            step_size=0.5,
            early=early,
        )
        reference = target.sample(min(4000, 16 * chains))
        for r in rows:
            x = r.pop("trace").samples
            r["error"] = mode_weight_error(x, target.locs)
            r["jumps"] = _jumps(target.assign(x))
            r["sw"] = sliced_wasserstein(
                x.reshape(-1, d)[-4000:], reference, generator=torch.Generator().manual_seed(0)
            )
        _print(f"4-mode mixture, d = {d}, {chains} chains, budget {budget} evaluations/chain", rows, "mode-w. err")
        results[d] = rows
    return results


def funnel(budget: int, chains: int, *, hidden: int, train_steps: int) -> list[dict]:
    target = Funnel(10)
    rows = compare(
        target,
        torch.randn(chains, 10),
        budget=budget,
        transforms=6,
        hidden=hidden,
        lr=1e-3,
        train_steps=train_steps,
        step_size=0.1,
    )
    reference = torch.randn(min(4000, 16 * chains), 10)  # the latent of Funnel.latent; raw SW2 is tail noise
    for r in rows:
        x = r.pop("trace").samples
        r["error"] = float(stats.kstest(x[..., 0].reshape(-1).numpy() / target.scale, "norm").statistic)
        r["sw"] = _sw(target.latent(x), reference)
    _print(f"Neal's funnel, d = 10, {chains} chains, budget {budget} evaluations/chain", rows, "KS(v)")
    return rows


def phi4(budget: int, chains: int, *, hidden: int, train_steps: int, early: float) -> list[dict]:
    n = 64
    target = PhiFour(n)
    sites = torch.arange(1, n + 1, dtype=torch.float32)
    profile = torch.tanh(sites / 4) * torch.tanh((n + 1 - sites) / 4)  # ±1 inside, 0 at the walls
    start = _uneven_start(torch.stack([profile, -profile]), chains, [0.75, 0.25], 0.05)
    rows = compare(
        target,
        start,
        budget=budget,
        transforms=6,
        hidden=hidden,
        lr=1e-3,
        train_steps=train_steps,
        step_size=1e-3,
        early=early,
    )
    for r in rows:
        x = r.pop("trace").samples
        r["error"] = abs(float((target.magnetization(x) > 0).double().mean()) - 0.5)
        r["jumps"] = _jumps(target.magnetization(x) > 0)
    _print(f"phi^4, 64 sites (beta = 20), {chains} chains, budget {budget} evaluations/chain", rows, "mode-w. err")
    return rows


def overhead(repeats: int, override: int | None = None) -> dict[str, float]:
    """MALA step time / energy_and_grad time at the same chain states (cached energy and gradient)."""
    cases = {
        "4-mode mixture d=32": (GaussianMixture.four_modes(32), 1024, 0.5),
        "4-mode mixture d=64": (GaussianMixture.four_modes(64), 4096, 0.5),
        "phi^4 64 sites": (PhiFour(64), 1024, 1e-3),
        "funnel d=10": (Funnel(10), 4096, 0.05),
        "LJ13 (39 coordinates)": (LJ13(), 1024, 1e-4),
    }
    ratios = {}
    print("\nMALA step vs one target gradient on the same chain states (median of interleaved rounds)")
    print(f"{'case':36s} {'grad us':>9s} {'step us':>9s} {'step/grad':>10s} {'RNG floor':>10s} {'textbook':>9s}")
    for case, (target, size, step) in cases.items():
        chains = size if override is None else override
        name = f"{case}, {chains} chains"
        kernel = MALA(target, step, adapt_step_size=False)
        if target.has_exact_sampler:
            start = target.sample(chains)
        elif isinstance(target, LJ13):
            try:
                start = target.reference_samples("val")[:chains]
            except FileNotFoundError as error:
                print(f"{name:36s} skipped: {error}")
                continue
        else:
            start = torch.zeros(chains, target.dim)
        state = kernel.init(start)
        for _ in range(20):
            state, _ = kernel.step(state)
        x = state.x

        def grad(x=x, target=target) -> None:
            target.energy_and_grad(x)

        def step(kernel=kernel) -> None:
            nonlocal state
            state, _ = kernel.step(state)

        def rng_floor(x=x, target=target) -> None:
            target.energy_and_grad(x)
            torch.randn_like(x)
            torch.rand(x.shape[0])

        def textbook(kernel=kernel) -> None:  # no cache: the gradient at the current state is recomputed
            nonlocal state
            state, _ = kernel.step(type(state)(state.x, state.log_prob))

        steps = {"grad": grad, "step": step, "floor": rng_floor, "textbook": textbook}
        med = _harness.interleaved_medians(steps, rounds=repeats, inner=10, warmup=0)
        ratios[name] = med["step"] / med["grad"]
        print(
            f"{name:36s} {med['grad'] * 1e6:9.0f} {med['step'] * 1e6:9.0f} {ratios[name]:10.2f} "
            f"{med['floor'] / med['grad']:10.2f} {med['textbook'] / med['grad']:9.2f}"
        )
    return ratios


def main(argv: list[str] | None = None) -> dict:
    parser = _harness.parser(__doc__)
    parser.add_argument("--sections", nargs="+", default=["mixture", "funnel", "phi4", "overhead"])
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--budget", type=int, default=2000, help="target evaluations per chain (mixture, funnel)")
    parser.add_argument("--phi4-budget", type=int, default=4000, help="target evaluations per chain (phi^4)")
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=5, help="flow optimiser steps per warm-up step")
    parser.add_argument(
        "--early", type=float, default=0.25, help="also run IMH and NeuTra with the flow at this fraction of warm-up"
    )
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds of the overhead section")
    parser.add_argument("--overhead-chains", type=int, default=None, help="override the chains of every overhead case")
    args = _harness.setup(parser.parse_args(argv))
    torch.manual_seed(args.seed)
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}")
    out: dict = {}
    common = {"hidden": args.hidden, "train_steps": args.train_steps}
    if "mixture" in args.sections:
        out["mixture"] = mixture(args.dims, args.budget, args.chains, early=args.early, **common)
    if "funnel" in args.sections:
        out["funnel"] = funnel(args.budget, args.chains, **common)
    if "phi4" in args.sections:
        out["phi4"] = phi4(args.phi4_budget, args.chains, early=args.early, **common)
    if "overhead" in args.sections:
        out["overhead"] = overhead(args.repeats, args.overhead_chains)
    return out


if __name__ == "__main__":
    main()
