r"""Particle Boltzmann generators on DW4 and LJ13: ML vs flow matching vs equivariant OT flow matching vs MCMC.

Three sections, all measured in one run (``torch.set_num_threads(--threads)``, 1 by default; the
machine may be shared, so wall-clock numbers are only comparable within one run):

* ``table``: per system, an :class:`~flows.particles.EquivariantCNF` (EGNN ``--layers`` x ``--hidden``)
  trained for the same wall-clock ``--budget`` seconds by maximum likelihood (Köhler et al. 2020
  style: exact trace, backpropagation through a dopri5 solve at ``--train-tol``), by flow matching
  with the independent, minibatch-OT and equivariant-OT couplings (Klein, Krämer, Noé 2023), and a
  generic (non-equivariant) CNF of about the same size (``TimeMLP``) trained by flow matching; then
  test NLL (exact trace, float64, dopri5 at ``--rtol``/``--atol``) in both conventions (normalised,
  and bgflow's without ½(n−1)d log 2π), Kish ESS, log Z and the reweighted mean energy from
  ``--samples`` flow samples, next to the project's MALA run on the same target (⟨u⟩ at β = 1,
  split R̂ of the energy). **DW4 trains on ``train`` (100k) and tests on ``test``; LJ13 trains on
  ``val`` (10k) and tests on ``test``** (only those two LJ13 splits exist).
  The reference line is the reference implementation of Klein et al. (2023) (EGNN 3x32, Adam
  5e-4, batch 128) as run on this machine for issue 18, in the bgflow convention; published
  tables should be compared in their own convention (``docs/particles.md``).
* ``paths``: mean straight transport path length ‖x − z‖ of the three couplings on the same data
  and base batches (Klein et al. 2023, Table 2's quantity).
* ``speed``: samples per second of the exact-trace NLL and of sampling with log q, LJ13-sized EGNN
  3 x 32, dopri5 at ``--rtol``/``--atol``, the same weights, solver and step sequence (the NFE is
  printed) for every trace: the EGNN's forward-mode ``divergence`` (ours), its dense JVPs of all
  ``n·d`` tangents, batched reverse mode (``is_grads_batched``, the CNF's fallback), one backward
  pass per coordinate on our dense EGNN, and two stand-ins for the reference code of Klein et al.
  (2023), which cannot be run here: the same field in its edge-list formulation with bgflow's
  brute-force trace (``create_graph=True``), and with one leaf per coordinate (the later scripts
  of the same group); ours also through ``torch.compile`` (``EGNN.compile_divergence``, its
  compilation timed apart). Rounds interleave the traces (``--speed-repeats``); medians are printed.

Usage::

    python benchmarks/particles.py --systems dw4 --budget 120            # DW4, 2 min per method
    python benchmarks/particles.py --systems lj13 --budget 720 --sections table
    python benchmarks/particles.py --sections speed paths
"""

from __future__ import annotations

import math
import os
import statistics
import time

import _harness
import torch
from torch import Tensor, nn

from flows import CNF, Flow
from flows._malloc import keep_freed_memory
from flows.mcmc import MALA, sample
from flows.metrics.mcmc import effective_sample_size, split_rhat
from flows.nn import TimeMLP
from flows.particles import (
    EGNN,
    EquivariantCNF,
    EquivariantOTCoupling,
    MeanFreeNormal,
    boltzmann_evaluation,
    nll_conventions,
    particle_nll,
    path_lengths,
    remove_mean,
)
from flows.targets import DW4, LJ13
from flows.train.flow_matching import FlowMatching

SYSTEMS = {"dw4": (DW4, "train"), "lj13": (LJ13, "val")}
REFERENCE = {  # the reference code of Klein et al. (2023), run on this machine (issue 18), bgflow convention
    "dw4": "Klein et al. reference code, 10 min here: NLL 1.70 ± 0.06 (bgflow) = 7.21 normalised, ESS 0.87",
    "lj13": "Klein et al. reference code, 12 min here (val 10k): NLL -14.96 ± 0.41 (bgflow) = 18.12 normalised",
}


REFERENCE_SPEED = (0.83, 0.56)  # reference code, LJ13 (issue 18): 1.2 s per NLL sample, 1.8 s per draw with log q


class NaiveField(nn.Module):
    """The reference code's trace: one reverse-mode pass per coordinate (products are rows of J)."""

    def __init__(self, field: nn.Module) -> None:
        super().__init__()
        self.inner = field

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.inner(t, z)

    def jvp(self, t: Tensor, z: Tensor, tangents: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            f = self.inner(t, z)
            rows = [
                torch.autograd.grad(f, z, v.expand_as(z), retain_graph=k + 1 < len(tangents))[0]
                for k, v in enumerate(tangents)
            ]
        return f.detach(), torch.stack(rows)


class JVPField(nn.Module):
    """The EGNN's dense hand-propagated JVPs of all ``n·d`` basis tangents (no ``divergence`` hook)."""

    def __init__(self, field: EGNN) -> None:
        super().__init__()
        self.inner = field

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.inner(t, z)

    def jvp(self, t: Tensor, z: Tensor, tangents: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.jvp(t, z, tangents)


class BatchedReverseField(nn.Module):
    """No ``jvp`` hook: the CNF takes all rows of J in one batched reverse pass (``is_grads_batched``)."""

    def __init__(self, field: nn.Module) -> None:
        super().__init__()
        self.inner = field

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.inner(t, z)


class EdgeListEGNN(nn.Module):
    """The same function as a given :class:`EGNN` (its parameters), in the reference code's formulation.

    The reference implementation of Klein et al. (2023) builds on Satorras et al.'s public EGNN:
    the nodes of the whole batch as one ``(N·n, hidden)`` table, the batch's ``N·n(n−1)``
    ordered pairs as edge index lists, gathers ``h[rows]``, ``h[cols]``, ``x[rows] − x[cols]``,
    one MLP on each edge's concatenated features, and the messages summed back onto their nodes
    by a scatter-add (their ``unsorted_segment_sum``). This re-states that formulation on the
    weights of ``field``, so the field, the solver's step sequence and the NFE are the same as
    ours (checked in ``tests/test_benchmark_particles_speed.py``); only the formulation and the trace differ.
    """

    def __init__(self, field: EGNN) -> None:
        super().__init__()
        self.inner = field
        self._edges: dict[int, tuple[Tensor, Tensor]] = {}

    def _batch_edges(self, batch: int) -> tuple[Tensor, Tensor]:
        if batch not in self._edges:  # cached per batch size, as the reference code does
            n = self.inner.n_particles
            offset = torch.arange(batch)[:, None] * n
            rows = (self.inner._rows[None] + offset).reshape(-1)
            cols = (self.inner._cols[None] + offset).reshape(-1)
            self._edges = {batch: (rows, cols)}
        return self._edges[batch]

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        egnn, n, d = self.inner, self.inner.n_particles, self.inner.spatial_dim
        batch = z.shape[0]
        rows, cols = self._batch_edges(batch)
        x0 = z.reshape(batch * n, d)
        h = egnn._embed(torch.as_tensor(t, dtype=z.dtype), z.shape[:-1], batch)
        h = h.expand(batch, n, egnn.width).reshape(batch * n, egnn.width)
        d2_0 = (x0[rows] - x0[cols]).square().sum(-1, keepdim=True)
        x = x0
        for index, (edge, coord) in enumerate(zip(egnn.edge, egnn.coord, strict=True)):
            diff = x[rows] - x[cols]
            d2 = diff.square().sum(-1, keepdim=True)
            m = edge(torch.cat((h[rows], h[cols], d2, d2_0), -1))
            shift = diff * coord(m) * (d2 + 1).rsqrt()
            x = x + torch.zeros_like(x).scatter_add_(0, rows[:, None].expand_as(shift), shift) / (n - 1)
            if index < len(egnn.node):
                agg = torch.zeros_like(h).scatter_add_(0, rows[:, None].expand_as(m), m)
                h = h + egnn.node[index](torch.cat((h, agg), -1))
        return remove_mean((x - x0).reshape(batch, n * d), n, d)


class BruteForceField(nn.Module):
    """The reference code's exact trace, bgflow's ``BruteForceEstimator``, as a ``divergence`` hook.

    One reverse-mode pass per coordinate, ``autograd.grad(f[:, i], z, create_graph=True)``, of
    which the ``i``-th column is kept. ``columns=True`` is the variant of the later scripts of the
    same group (each coordinate its own leaf, so a pass stops at its column; no ``create_graph``).
    """

    def __init__(self, field: nn.Module, columns: bool = False) -> None:
        super().__init__()
        self.inner, self.columns = field, columns

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.inner(t, z)

    def divergence(self, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            if self.columns:
                leaves = [z[:, [i]].detach().requires_grad_(True) for i in range(z.shape[1])]
                f = self.inner(t, torch.cat(leaves, 1))
                div = sum(
                    torch.autograd.grad(f[:, [i]], leaf, torch.ones_like(leaf), retain_graph=True)[0]
                    for i, leaf in enumerate(leaves)
                )
            else:
                z = z.detach().requires_grad_(True)
                f = self.inner(t, z)
                div = 0.0
                for i in range(z.shape[1]):
                    row = torch.autograd.grad(
                        f[:, i], z, torch.ones_like(f[:, i]), create_graph=True, retain_graph=True
                    )
                    div = div + row[0][:, i]
        return f.detach(), div.detach().reshape(-1)


class MeanFreeTimeMLP(nn.Module):
    """A generic (non-equivariant) field: TimeMLP with its output projected to be mean free."""

    def __init__(self, n: int, d: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.n, self.d = n, d
        self.mlp = TimeMLP(n * d, hidden=(hidden,) * layers, activation=nn.SiLU)

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        f = self.mlp(t, z).unflatten(-1, (self.n, self.d))
        return (f - f.mean(-2, keepdim=True)).flatten(-2)


def _generic_flow(n: int, d: int, params: int, layers: int, tol: float) -> Flow:
    """A TimeMLP CNF with about ``params`` parameters (the equivariant model's size)."""
    hidden = 8
    while sum(p.numel() for p in MeanFreeTimeMLP(n, d, hidden + 8, layers).parameters()) <= params:
        hidden += 8
    field = MeanFreeTimeMLP(n, d, hidden, layers)
    return Flow(CNF(n * d, field=field, rtol=tol, atol=tol), MeanFreeNormal(n, d))


def _train(flow: Flow, data: Tensor, method: str, budget: float, args, coupling) -> dict:
    opt = torch.optim.Adam(flow.parameters(), lr=args.lr)
    objective = None if method == "ml" else FlowMatching(coupling=coupling)
    gen = torch.Generator().manual_seed(args.seed)
    steps, start, losses = 0, time.perf_counter(), []
    cnf = flow.transform
    if method == "ml" and args.ml_trace == "hutchinson":  # exact log q in evaluation, unbiased trace in training
        cnf.trace, cnf.eval_trace = "hutchinson", "exact"
    flow.train()
    while (elapsed := time.perf_counter() - start) < budget and (args.max_steps is None or steps < args.max_steps):
        if args.schedule == "cosine":  # decay over the wall-clock budget
            for group in opt.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * min(elapsed / budget, 1.0)))
        x = data[torch.randint(len(data), (args.batch,), generator=gen)]
        if method == "ml":
            cnf.rtol = cnf.atol = args.train_tol
            loss = -flow.log_prob(x).mean()
        else:
            loss = objective(flow, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        steps += 1
    cnf.rtol, cnf.atol = args.rtol, args.atol
    flow.eval()
    return {
        "steps": steps,
        "train_s": time.perf_counter() - start,
        "last_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
    }


def _mcmc(target, start: Tensor, args) -> dict:
    kernel = MALA(target, step_size=args.mcmc_step)
    trace = sample(kernel, start, steps=args.mcmc_steps, warmup=args.mcmc_warmup, thin=args.mcmc_thin)
    energy = -trace.log_prob.double()  # (draws, chains)
    ess = float(effective_sample_size(energy[:, :, None]).squeeze())
    return {
        "mean_energy": float(energy.mean()),
        "se": float(energy.std() / math.sqrt(max(ess, 1.0))),
        "rhat": float(split_rhat(energy[:, :, None]).squeeze()),
        "accept": float(trace.accept_prob.mean()),
    }


def mcmc(system: str, args) -> dict:
    """The MCMC baseline alone: MALA at beta = 1 from test configurations, mean energy and split R-hat."""
    cls, _ = SYSTEMS[system]
    target = cls()
    start = target.reference_samples("test", args.data_dir)[: args.mcmc_chains]
    clock = time.perf_counter()
    out = _mcmc(target, start, args)
    out["seconds"] = time.perf_counter() - clock
    print(
        f"\n{system.upper()} MALA, {args.mcmc_chains} chains x {args.mcmc_steps} steps (thin {args.mcmc_thin}, "
        f"{args.mcmc_warmup} warm-up) from test rows, {out['seconds']:.0f} s: <u> = {out['mean_energy']:.3f} "
        f"± {out['se']:.3f}, split R-hat {out['rhat']:.4f}, acceptance {out['accept']:.2f}"
    )
    return out


def table(system: str, args) -> dict:
    cls, train_split = SYSTEMS[system]
    target = cls()
    n, d = target.n_particles, target.spatial_dim
    data = target.reference_samples(train_split, args.data_dir)
    test = target.reference_samples("test", args.data_dir)[: args.test]
    split_note = (
        "trained on train (100k), tested on test" if system == "dw4" else "trained on val (10k), tested on test"
    )
    rows = {}
    egnn_params = sum(p.numel() for p in EGNN(n, d, width=args.hidden, layers=args.layers).parameters())
    methods = {
        f"ML ({args.ml_trace} trace)": ("ml", "independent"),
        "FM independent": ("fm", "independent"),
        "FM OT": ("fm", "ot"),
        "FM equivariant OT": ("fm", EquivariantOTCoupling(n, d, candidates=args.candidates)),
        "generic CNF, FM OT": ("fm", "ot"),
    }
    for name in args.methods or methods:
        method, coupling = methods[name]
        torch.manual_seed(args.seed)
        if name.startswith("generic"):
            flow = _generic_flow(n, d, egnn_params, args.layers, args.rtol)
        else:
            flow = EquivariantCNF(n, d, hidden=(args.hidden,) * args.layers, rtol=args.rtol, atol=args.atol)
        row = _train(flow, data, method, args.budget, args, coupling)
        row["params"] = sum(p.numel() for p in flow.parameters())
        start = time.perf_counter()
        dtype = {"float32": torch.float32, "float64": torch.float64}[args.eval_dtype]
        nll = particle_nll(flow, test, batch_size=args.eval_batch, dtype=dtype)
        row["nll_s"] = time.perf_counter() - start
        finite = torch.isfinite(nll)
        row["nll"] = nll_conventions(float(nll[finite].mean()), n, d)
        row["nll_se"] = float(nll[finite].std() / math.sqrt(finite.sum()))
        ev = boltzmann_evaluation(flow, target, args.samples, batch_size=args.eval_batch, dtype=dtype)
        row.update(ess=ev.ess, log_z=ev.log_z, mean_energy=ev.mean_energy, sample_s=ev.seconds)
        rows[name] = row
        print(
            f"  [{system}] {name}: {row['steps']} steps, NLL {row['nll']['normalised']:.3f}, ESS {ev.ess:.3f}",
            flush=True,
        )
    start = target.reference_samples("test", args.data_dir)[: args.mcmc_chains]
    mcmc = _mcmc(target, start, args)
    print(f"\n{system.upper()} ({split_note}); EGNN {args.layers}x{args.hidden}, {args.budget:g} s of training each,")
    print(
        f"test NLL on {len(test)} test rows (exact trace, {args.eval_dtype}, "
        f"dopri5 rtol={args.rtol:g} atol={args.atol:g}),"
    )
    print(f"ESS/log Z/<u> from {args.samples} flow samples; threads={torch.get_num_threads()}; machine possibly shared")
    head = f"{'method':<22}{'steps':>7}{'NLL':>9}{'NLL bgflow':>12}{'± se':>7}{'ESS':>7}{'log Z':>16}"
    head += f"{'<u> reweighted':>20}"
    print(head)
    for name, r in rows.items():
        lz = f"{r['log_z'][0]:.2f}±{r['log_z'][1]:.2f}"
        u = f"{r['mean_energy'][0]:.3f}±{r['mean_energy'][1]:.3f}"
        print(
            f"{name:<22}{r['steps']:>7}{r['nll']['normalised']:>9.3f}{r['nll']['bgflow']:>12.3f}{r['nll_se']:>7.3f}"
            f"{r['ess']:>7.3f}{lz:>16}{u:>20}"
        )
    print(
        f"{'MALA (' + str(args.mcmc_chains) + ' chains)':<22}{args.mcmc_steps:>7}{'':>9}{'':>12}{'':>7}{'':>7}{'':>16}"
        f"{mcmc['mean_energy']:>12.3f}±{mcmc['se']:.3f}   R-hat {mcmc['rhat']:.3f}, acceptance {mcmc['accept']:.2f}"
    )
    print(f"reference: {REFERENCE[system]}")
    return {"rows": rows, "mcmc": mcmc}


def paths(system: str, args) -> dict:
    cls, train_split = SYSTEMS[system]
    target = cls()
    n, d = target.n_particles, target.spatial_dim
    x = target.reference_samples(train_split, args.data_dir)[: args.path_samples]
    torch.manual_seed(args.seed)
    z = MeanFreeNormal(n, d).sample((len(x),))
    lengths = path_lengths(x, z, n, d, batch_size=args.batch)
    print(f"\n{system.upper()} mean transport path length ‖x - z‖ ({len(x)} pairs, batches of {args.batch})")
    for name, value in lengths.items():
        print(f"  {name:<16}{value:8.3f}")
    return lengths


@torch.no_grad()
def _time(flow: Flow, x: Tensor, draw: bool) -> tuple[float, int]:
    start = time.perf_counter()
    if draw:
        flow.sample_and_log_prob((len(x),))
    else:
        flow.log_prob(x)
    return time.perf_counter() - start, flow.transform.nfe


def speed(args) -> dict:
    target = LJ13()
    n, d = 13, 3
    x = target.reference_samples("test", args.data_dir)[: args.speed_batch]
    torch.manual_seed(args.seed)
    egnn = EGNN(n, d, width=32, layers=3)
    if args.speed_checkpoint:  # an EGNN state dict, or the example's model.pt (a whole EquivariantCNF)
        state = torch.load(args.speed_checkpoint)
        prefix = "transform.field."
        if any(key.startswith(prefix) for key in state):
            state = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        egnn.load_state_dict(state)
    compiled = EGNN(n, d, width=32, layers=3)
    compiled.load_state_dict(egnn.state_dict())
    compiled.compile_divergence = True
    fields = {
        "divergence (ours)": egnn,
        "ours, torch.compile": compiled,
        "dense hand JVPs": JVPField(egnn),
        "batched reverse": BatchedReverseField(egnn),
        "naive per-coordinate": NaiveField(egnn),
        "reference formulation": BruteForceField(EdgeListEGNN(egnn)),
        "reference, column leaves": BruteForceField(EdgeListEGNN(egnn), columns=True),
    }
    selected = args.speed_fields or list(fields)
    unknown = sorted(set(selected) - set(fields))
    if unknown or "divergence (ours)" not in selected:
        raise SystemExit(
            f"--speed-fields: expected names among {sorted(fields)} including 'divergence (ours)', got {selected}"
        )
    print(
        f"\nLJ13 exact log q, EGNN 3x32, dopri5 rtol={args.rtol:g} atol={args.atol:g}, batch {len(x)}, float32; "
        f"medians of {args.speed_repeats} interleaved rounds"
    )
    flows_ = {
        name: Flow(CNF(n * d, field=fields[name], rtol=args.rtol, atol=args.atol), MeanFreeNormal(n, d)).eval()
        for name in selected
    }
    times: dict[str, dict[str, list[float]]] = {name: {"nll": [], "draw": []} for name in selected}
    if "ours, torch.compile" in flows_:  # compile outside the timed rounds: one shape serves both directions
        start = time.perf_counter()
        _time(flows_["ours, torch.compile"], x, False)
        print(f"torch.compile of the divergence: {time.perf_counter() - start:.1f} s (first solve, not timed below)")
    nfe: dict[str, tuple[int, int]] = {}
    for _ in range(args.speed_repeats):  # interleaved: machine load hits every trace alike
        for name, flow in flows_.items():
            torch.manual_seed(args.seed)
            t_nll, nfe_nll = _time(flow, x, False)
            torch.manual_seed(args.seed)
            t_draw, nfe_draw = _time(flow, x, True)
            times[name]["nll"].append(t_nll)
            times[name]["draw"].append(t_draw)
            nfe[name] = (nfe_nll, nfe_draw)
    print(f"{'trace':<26}{'NLL samples/s':>15}{'NFE':>6}{'draw+log q samples/s':>22}{'NFE':>6}")
    out = {}
    for name in selected:
        nll_per_s = len(x) / statistics.median(times[name]["nll"])
        draw_per_s = len(x) / statistics.median(times[name]["draw"])
        out[name] = {"nll_per_s": nll_per_s, "draw_per_s": draw_per_s, "nfe": nfe[name]}
        print(f"{name:<26}{nll_per_s:>15.2f}{nfe[name][0]:>6}{draw_per_s:>22.2f}{nfe[name][1]:>6}")
    mine = [name for name in ("divergence (ours)", "ours, torch.compile") if name in out]
    for who in mine:
        ours = out[who]
        for name in [name for name in selected if name not in mine]:
            base = out[name]
            print(
                f"{who} vs {name}: {ours['nll_per_s'] / base['nll_per_s']:.1f}x (NLL), "
                f"{ours['draw_per_s'] / base['draw_per_s']:.1f}x (sampling)"
            )
        print(
            f"{who} vs the reference code's figures on this machine (issue 18: ~{REFERENCE_SPEED[0]} samples/s "
            f"NLL, ~{REFERENCE_SPEED[1]} samples/s sampling, its own model): "
            f"{ours['nll_per_s'] / REFERENCE_SPEED[0]:.1f}x, {ours['draw_per_s'] / REFERENCE_SPEED[1]:.1f}x"
        )
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = _harness.parser(__doc__)
    parser.add_argument("--systems", nargs="+", default=["dw4", "lj13"], choices=sorted(SYSTEMS))
    parser.add_argument(
        "--sections", nargs="+", default=["table", "paths", "speed"], choices=["table", "paths", "speed", "mcmc"]
    )
    parser.add_argument("--methods", nargs="+", default=None, help="subset of the table's methods")
    parser.add_argument("--budget", type=float, default=120.0, help="training seconds per method")
    parser.add_argument("--max-steps", type=int, default=None, help="also stop after this many steps")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--schedule", choices=["constant", "cosine"], default="cosine")
    parser.add_argument(
        "--candidates", type=int, default=None, help="equivariant OT: aligned costs for this many rows per column"
    )
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--train-tol", type=float, default=1e-3, help="solver tolerance of ML training")
    parser.add_argument(
        "--ml-trace",
        choices=["exact", "hutchinson"],
        default="exact",
        help="trace of ML training (exact through the solver keeps n·d tangents per step: use hutchinson on LJ13)",
    )
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--test", type=int, default=1000, help="test rows for the NLL")
    parser.add_argument("--samples", type=int, default=2000, help="flow samples for ESS, log Z, <u>")
    parser.add_argument("--eval-batch", type=int, default=500)
    parser.add_argument("--eval-dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--mcmc-chains", type=int, default=256)
    parser.add_argument("--mcmc-steps", type=int, default=20000)
    parser.add_argument("--mcmc-warmup", type=int, default=2000, help="adapting warm-up steps of MALA")
    parser.add_argument("--mcmc-thin", type=int, default=10)
    parser.add_argument("--mcmc-step", type=float, default=0.01)
    parser.add_argument("--path-samples", type=int, default=1024)
    parser.add_argument("--speed-batch", type=int, default=20)
    parser.add_argument("--speed-repeats", type=int, default=1, help="interleaved rounds of the speed section")
    parser.add_argument("--speed-fields", nargs="+", default=None, help="subset of the speed section's traces")
    parser.add_argument("--speed-checkpoint", default=None, help="EGNN state dict for the speed section")
    parser.add_argument("--data-dir", default=os.environ.get("FLOWS_DATA_DIR"))
    args = _harness.setup(parser.parse_args(argv))
    keep_freed_memory()  # glibc: no page faults on every large tensor (flows._malloc); results unchanged
    results: dict = {}
    for system in args.systems:
        if "table" in args.sections:
            results[system] = table(system, args)
        if "paths" in args.sections:
            results[f"{system}_paths"] = paths(system, args)
        if "mcmc" in args.sections:
            results[f"{system}_mcmc"] = mcmc(system, args)
    if "speed" in args.sections:
        results["speed"] = speed(args)
    return results


if __name__ == "__main__":
    main()
