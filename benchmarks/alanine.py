r"""Alanine dipeptide Boltzmann generator: ML on MD frames, then energy fine-tuning, evaluated as in the field.

``--model ncsf`` (default): :class:`flows.NCSF` on internal coordinates, in stages (each on the
existing :class:`flows.train.Trainer`, one thread):

1. maximum likelihood on the MD training frames in internal coordinates (``--ml-seconds``);
2. energy fine-tuning (``--ft-seconds``): the mixed objective
   ``w_fwd · ForwardKL(MD frames) + w_rev · ReverseKL(TransformedTarget(ALDP, ic))``
   (``--forward-weight 0`` is pure reverse KL), with the linear-logarithmic energy cut in the loss
   only, and optionally an annealed temperature of the reverse term (``--anneal-from``), plus
   (``--importance-weight``) ``w_imp · ImportanceForwardKL`` with the backbone reflection
   ``(φ, ψ) → (−φ, −ψ)`` as a mode-jumping move: the 300 K frames never visit basin B, and this
   term proposes it from basin A and learns it from the energy (φ and ψ must be on the circle:
   ``--linear-torsions`` below φ's spread, 1.62 rad at 300 K).

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

``--model ecnf``: the same comparison for an :class:`~flows.particles.EquivariantCNF` (EGNN
``--ecnf-layers`` x ``--ecnf-hidden``) on the Cartesian positions of the 22 atoms, trained by flow
matching for the same ``--ml-seconds`` (no energy fine-tuning: ``--ft-seconds`` must be 0) and
evaluated by the same metric code (:func:`evaluate`):

* **data**: MD frames centred (mean free) and divided by one length ``s``, the standard deviation
  of the centred training coordinates, so the field sees O(1) numbers. The flow's density lives
  on the 63-dimensional zero-centre-of-mass subspace; in nm it is
  :math:`\log q(x) = \log q_s(x/s) - 63 \log s` (exact).
* **atoms are labelled**: the EGNN's nodes are identical (permutation equivariant), which would
  spread q over all 22! relabellings of the molecule. :class:`AtomBias` adds a learned vector per
  atom to the output of the first node update, so from the second layer on every atom has its
  own features (``--ecnf-layers`` >= 2); the first layer stays symmetric in its pairs, which the
  EGNN's fast exact divergence assumes (checked against autograd in ``tests/test_molecules_example.py``).
* **coupling** (``--ecnf-coupling``): ``aligned`` (default) is minibatch OT under the distance
  after the best orthogonal map, without permutations (:func:`aligned_ot_coupling`; Klein, Krämer,
  Noé 2023 without the permutation part), ``ot`` plain minibatch OT, ``independent``.
* **evaluation**: float64, dopri5 at ``--ecnf-tol``, exact trace (:meth:`EGNN.divergence`), in
  chunks of ``--ecnf-chunk``; the seconds of drawing the ``--samples`` (and of the test NLL) are printed.
* **chirality**: the EGNN is O(3) equivariant and the base reflection invariant, so
  :math:`q(-x) = q(x)`: the flow draws the D enantiomer as often as the L one, and the force field
  gives both the same energy. Samples with a positive CB improper (:data:`CHIRAL_ROW`, negative on
  L) are reflected, :math:`x \to -x`; the folded density on L is exactly :math:`2q(x)`, so
  :math:`\log 2` is added to every :math:`\log q`. ``d_fraction`` is the raw fraction of D samples.
* **importance weights**: :math:`\log w = -u(x) - \log q(x)` as for ``ncsf``; q is a density on the
  mean-free subspace and u is translation invariant, so the weights are those of the Boltzmann
  density up to a constant (Kish ESS and ΔF ignore it); q and u are both rotation invariant.
* **test NLL** (on the first ``--ecnf-test-frames`` test frames, all L): ``test_nll_mean_free`` is
  :math:`-\log 2q(x)` on the 63-dimensional subspace (nm; the particle benchmarks' normalised
  convention); ``test_nll`` is the same density in the ``ncsf`` convention, per unit volume of
  rigid motions: the density with a uniform centroid is :math:`2q/n^{3/2}` per unit Cartesian
  volume (:math:`d^{3n}x = n^{3/2} d^{3n-3}y\, d^3c`), times the :math:`8\pi^2` of the rotations,
  so ``test_nll = test_nll_mean_free + 1.5 log 22 - log 8π²`` (:func:`rigid_motion_nll`, checked by
  quadrature on a 3-atom Gaussian in the tests). Both models' test NLLs are then densities of the
  same L configurations in the same units, and comparable.

The comparison at equal training seconds and equal N (issue 29; the ECNF's exact log q costs about
0.8 s per sample on one thread, EGNN 3 x 32, so N = 2000 takes about half an hour)::

    python benchmarks/alanine.py --temperature 1000 --ml-seconds 1800 --ft-seconds 0 --samples 2000 --out /tmp/aldp_cmp
    python benchmarks/alanine.py --model ecnf --temperature 1000 --ml-seconds 1800 --samples 2000 --out /tmp/aldp_cmp
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

import flows
from flows.bijections.internal_coordinates import dihedral
from flows.data.files import data_file
from flows.distributions.mixture import Mixture
from flows.metrics import histogram_kl, kish_ess, state_free_energy
from flows.metrics.importance import free_energy_profile
from flows.particles import EquivariantCNF, kabsch, remove_mean
from flows.plot.molecules import plot_ramachandran
from flows.targets import AlanineDipeptide, EnergyTarget, TransformedTarget
from flows.targets.alanine import CHIRAL_ROW
from flows.train import (
    CosineDecay,
    EarlyStopping,
    ImportanceForwardKL,
    MaximumLikelihood,
    ReverseKL,
    Trainer,
    WeightedSum,
)
from flows.train.energy import AnnealTemperature
from flows.train.flow_matching import FlowMatching

B_LOW, B_HIGH = 0.0, 2.2
UMBRELLA = "aldp_vacuum_300K_umbrella.npz"
REFERENCE_DF_SE_300K = 0.13  # bootstrap se of the umbrella/MBAR reference (data README)
N_ATOMS = 22
SUBSPACE_DIM = 3 * (N_ATOMS - 1)  # the mean-free subspace of the ECNF's density


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("ncsf", "ecnf"), default="ncsf", help="NCSF on internal coordinates or ECNF")
    p.add_argument("--temperature", type=float, default=1000.0, choices=(300.0, 1000.0))
    p.add_argument("--ml-seconds", type=float, default=300.0, help="maximum likelihood (ncsf) or flow matching (ecnf)")
    p.add_argument("--ft-seconds", type=float, default=None, help="energy fine-tuning (ncsf only; default 300)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on the steps of each stage (smoke tests)")
    p.add_argument("--transforms", type=int, default=8)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--bins", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ft-lr", type=float, default=2e-4)
    p.add_argument("--ft-batch", type=int, default=256, help="flow samples per reverse-KL step")
    p.add_argument(
        "--patience",
        type=int,
        default=None,
        help="stop maximum likelihood after this many epochs without a better validation NLL, keeping the best",
    )
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
    p.add_argument(
        "--importance-weight",
        type=float,
        default=0.0,
        help="weight of ImportanceForwardKL with the backbone reflection (phi, psi) -> (-phi, -psi) as a move",
    )
    p.add_argument("--importance-batch", type=int, default=1024, help="proposal samples per ImportanceForwardKL step")
    p.add_argument("--move-fraction", type=float, default=0.5, help="fraction of the proposal samples reflected")
    p.add_argument("--anneal-from", type=float, default=None, help="start temperature of the reverse term")
    p.add_argument(
        "--basin-b-seconds",
        type=float,
        default=0.0,
        help="stratify: train a second flow for basin B this long (ML on the reflected frames, then reverse KL)",
    )
    p.add_argument("--basin-b-weight", type=float, default=0.1, help="the B flow's share of the mixture proposal")
    p.add_argument(
        "--basin-b-restraint",
        type=float,
        default=0.0,
        help="kT/rad^2 of a flat-bottomed restraint keeping phi in basin B while the B flow trains (0: none)",
    )
    p.add_argument(
        "--load-a",
        default=None,
        help="skip training the A flow: load its state dict (flow_<T>K_finetuned.pt of a run with the same options)",
    )
    p.add_argument(
        "--linear-torsions", type=float, default=2.0, help="cut open torsions within this of their mean (0: off)"
    )
    p.add_argument("--ecnf-hidden", type=int, default=32, help="EGNN width (ecnf)")
    p.add_argument("--ecnf-layers", type=int, default=3, help="EGNN layers, at least 2 (ecnf)")
    p.add_argument("--ecnf-lr", type=float, default=5e-4, help="Adam learning rate of flow matching (ecnf)")
    p.add_argument("--ecnf-coupling", choices=("aligned", "ot", "independent"), default="aligned")
    p.add_argument("--ecnf-tol", type=float, default=1e-4, help="dopri5 rtol = atol of the evaluation (ecnf)")
    p.add_argument("--ecnf-chunk", type=int, default=500, help="samples per ODE solve in the evaluation (ecnf)")
    p.add_argument("--ecnf-test-frames", type=int, default=500, help="test frames of the ecnf test NLL")
    p.add_argument("--samples", type=int, default=20000, help="flow samples N for every estimate")
    p.add_argument("--train-frames", type=int, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.model == "ecnf" and (args.ft_seconds or 0) > 0:
        p.error(f"--model ecnf has no energy fine-tuning stage: expected --ft-seconds 0, got {args.ft_seconds:g}")
    if args.model == "ecnf" and args.patience is not None:
        p.error("--patience stops maximum likelihood on its validation NLL: not available with --model ecnf")
    if args.model == "ecnf" and args.ecnf_layers < 2:
        p.error(f"--ecnf-layers: expected at least 2 (atom identities enter after layer 1), got {args.ecnf_layers}")
    if args.basin_b_seconds < 0 or not 0 < args.basin_b_weight < 1:
        p.error(
            f"expected --basin-b-seconds >= 0 and 0 < --basin-b-weight < 1, got {args.basin_b_seconds:g} and "
            f"{args.basin_b_weight:g}"
        )
    if args.basin_b_restraint < 0 or not math.isfinite(args.basin_b_restraint):
        p.error(f"--basin-b-restraint: expected a finite number >= 0, got {args.basin_b_restraint:g}")
    if args.load_a is not None and (args.model == "ecnf" or args.basin_b_seconds <= 0):
        p.error("--load-a reuses an A flow for the stratified run: it needs --model ncsf and --basin-b-seconds > 0")
    if args.model == "ecnf" and args.basin_b_seconds > 0:
        p.error("--basin-b-seconds trains a second NCSF: not available with --model ecnf")
    if args.ft_seconds is None:
        args.ft_seconds = 300.0 if args.model == "ncsf" else 0.0
    return args


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


@dataclass
class Draws:
    r"""Flow samples in Cartesian coordinates with their log importance weights, and the model's own figures.

    Attributes:
        x: samples ``(N, 66)`` in nm, float64.
        log_w: :math:`-u(x) - \log q(x)` ``(N,)``, ``-inf`` where not finite.
        figures: the test NLL and other model-specific numbers, reported after ``log_w_std``.
    """

    x: Tensor
    log_w: Tensor
    figures: dict[str, float] = field(default_factory=dict)


@torch.no_grad()
def draw_ncsf(
    flow: nn.Module, ic: nn.Module, target: AlanineDipeptide, test_x: Tensor, args: argparse.Namespace
) -> Draws:
    """NCSF samples mapped to Cartesian positions; test NLL modulo rigid motions (internal coordinates' log-det)."""
    flow.eval()
    q_test, ladj_test = ic.forward_and_log_det(test_x)
    nll = -(flow.log_prob(q_test.float()).double() + ladj_test).mean().item()
    xs, lws = [], []
    for start in range(0, args.samples, 5000):
        q, log_q = flow.sample_and_log_prob((min(5000, args.samples - start),))
        x, ladj_inverse = ic.inverse_and_log_det(q.double())
        xs.append(x)
        lws.append(-target.energy(x) - (log_q.double() - ladj_inverse))
    return Draws(torch.cat(xs), torch.cat(lws), {"test_nll": nll})


def evaluate(
    draws: Draws, target: AlanineDipeptide, ref: dict, args: argparse.Namespace, label: str
) -> dict[str, float]:
    """Every figure of the comparison from samples ``x`` and their ``log_w``, the same for both models.

    Kish ESS, KL of the φ, ψ and Ramachandran histograms (raw and reweighted) against the
    reference, p_B, ΔF(B − A) with its delta-method and bootstrap errors, and the largest error of
    F(φ) where F_ref < 8 kT; the model's own ``draws.figures`` (test NLL, ...) after ``log_w_std``.
    """
    log_w = torch.where(torch.isnan(draws.log_w), -math.inf, draws.log_w)
    angles = target.phi_psi(draws.x)
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
    diff = (f_model - ref["F"])[ref["F"] < 8.0]
    se = math.sqrt(rew.stderr**2 + ref["delta_f_se"] ** 2)
    ess = float(kish_ess(log_w))
    n_b = int(in_b.sum())  # the samples that carry B's estimate, and their Kish effective number
    n_eff_b = float(kish_ess(log_w[in_b])) * n_b if n_b and bool(torch.isfinite(log_w[in_b]).any()) else 0.0
    result = {
        "stage": label,
        "n": args.samples,
        "ess": ess,
        "log_w_std": float(log_w[torch.isfinite(log_w)].std()),
        **draws.figures,
        **kl,
        "p_b_raw": raw.p_b,
        "p_b_reweighted": rew.p_b,
        "ess_abs_times_p_b": ess * args.samples * rew.p_b,
        "samples_in_b": n_b,
        "effective_samples_in_b": n_eff_b,
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
    return result


def save(
    out: Path,
    stem: str,
    draws: Draws,
    target: AlanineDipeptide,
    ref: dict,
    result: dict,
    args: argparse.Namespace,
    flow: nn.Module,
) -> None:
    """The Ramachandran plot (reference, flow samples, reweighted), the samples' angles and weights, the flow."""
    angles, log_w = target.phi_psi(draws.x), torch.where(torch.isnan(draws.log_w), -math.inf, draws.log_w)
    panels = [(f"reference: {ref['name']}", ref["angles"], ref["log_w"]), ("flow samples", angles, None)]
    panels.append((f"reweighted (ESS {result['ess']:.3f})", angles, log_w))
    title = f"ALDP vacuum {args.temperature:g} K, {result['stage']}"
    plot_ramachandran(panels, out / f"ramachandran_{stem}.png", title=title)
    torch.save({"angles": angles.float(), "log_w": log_w}, out / f"samples_{stem}.pt")  # to re-plot
    torch.save(flow.state_dict(), out / f"flow_{stem}.pt")


def stage(
    draws: Draws,
    target: AlanineDipeptide,
    ref: dict,
    args: argparse.Namespace,
    label: str,
    out: Path | None,
    flow: nn.Module,
) -> dict[str, float]:
    """Evaluate one stage's draws and save its plot, samples and flow under ``out`` (model name in the stem)."""
    result = evaluate(draws, target, ref, args, label)
    if out is not None:
        stem = f"{int(args.temperature)}K_{label}" if args.model == "ncsf" else f"{int(args.temperature)}K_ecnf_{label}"
        save(out, stem, draws, target, ref, result, args, flow)
    return result


class AtomBias(nn.Linear):
    """A linear layer plus a learned vector per atom: the last layer of the EGNN's first node update.

    Added there (and not to the input features), it gives every atom its own features from the
    second message-passing layer on, while the first layer stays symmetric in ``i ↔ j``, as
    :meth:`flows.particles.EGNN.divergence` assumes. The vectors carry no tangent, so the EGNN's
    hand-propagated JVPs and divergence are unchanged (tested against autograd).
    """

    def __init__(self, layer: nn.Linear, n_atoms: int) -> None:
        super().__init__(layer.in_features, layer.out_features, dtype=layer.weight.dtype)
        self.load_state_dict(layer.state_dict())
        self.atoms = nn.Parameter(torch.randn(n_atoms, layer.out_features, dtype=layer.weight.dtype))

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + self.atoms


def labelled_ecnf(n_atoms: int, width: int, layers: int, tol: float) -> EquivariantCNF:
    """An :class:`EquivariantCNF` over ``n_atoms`` in 3-D whose atoms are told apart by :class:`AtomBias`."""
    flow = EquivariantCNF(n_atoms, 3, hidden=(width,) * layers, rtol=tol, atol=tol)
    node = flow.transform.field.node[0]
    node[2] = AtomBias(node[2], n_atoms)
    return flow


def aligned_ot_coupling(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    r"""Minibatch OT under the distance after the best orthogonal map, atoms labelled; each data row aligned.

    Cost :math:`C_{ij} = \|x_i\|^2 + \|z_j\|^2 - 2 \|x_i^\top z_j\|_*` (the minimum over O(3) of
    :math:`\|R x_i - z_j\|^2`, nuclear norm; both centred), no permutation of the atoms (they are
    not identical). Data rows keep their order and are rotated (Kabsch) onto their noise partners,
    which are reordered by the optimal assignment.

    Args:
        x: centred data ``(N, 3n)``.
        z: base samples, the same shape.

    Returns:
        ``(x', z')``: the aligned data and the reordered base samples.
    """
    xs, zs = (v.detach().double().unflatten(-1, (-1, 3)) for v in (x, z))
    nuclear = torch.linalg.svdvals(torch.einsum("aid,bie->abde", xs, zs)).sum(-1)
    cost = xs.square().sum((1, 2))[:, None] + zs.square().sum((1, 2))[None] - 2 * nuclear
    _, cols = linear_sum_assignment(cost.numpy())
    z = z[torch.as_tensor(cols)]
    zs = zs[torch.as_tensor(cols)]
    return (xs @ kabsch(xs, zs).mT).flatten(-2).to(x.dtype), z


def centre(x: Tensor) -> Tensor:
    """Configurations ``(N, 66)`` moved to zero centre of geometry (all atoms weigh the same)."""
    return remove_mean(x, N_ATOMS, 3)


def rigid_motion_nll(nll_mean_free: float | Tensor, n_atoms: int = N_ATOMS) -> float | Tensor:
    r"""A normalised NLL on the mean-free subspace in the ``ncsf`` convention (per unit volume of rigid motions).

    :math:`d^{3n}x = n^{3/2} d^{3n-3}y \, d^3 c` (``y`` orthonormal coordinates of the subspace,
    ``c`` the centroid) and the rotations have volume :math:`8\pi^2`, so
    :math:`\text{NLL} = \text{NLL}_{\text{mean free}} + \tfrac32 \log n - \log 8\pi^2`.
    """
    return nll_mean_free + 1.5 * math.log(n_atoms) - math.log(8 * math.pi**2)


def fold_chirality(x: Tensor, log_q: Tensor) -> tuple[Tensor, Tensor, float]:
    """Reflect D samples to L (``x → -x``) and add log 2 to every ``log q`` (the folded density is 2q on L).

    Returns:
        ``(x, log_q, d_fraction)``: folded samples, the folded density's log, the raw fraction of D samples.
    """
    pos = x.unflatten(-1, (N_ATOMS, 3))
    is_d = dihedral(*(pos[:, a] for a in CHIRAL_ROW)) > 0  # the CB improper is negative on L
    return torch.where(is_d[:, None], -x, x), log_q + math.log(2), float(is_d.double().mean())


@torch.no_grad()
def draw_ecnf(
    flow: EquivariantCNF, scale: float, target: AlanineDipeptide, test_x: Tensor, args: argparse.Namespace
) -> Draws:
    """ECNF samples in nm, folded to L, in float64 with the exact trace; test NLL in both conventions."""
    flow.double().eval()
    log_scale = SUBSPACE_DIM * math.log(scale)  # log q(x) = log q_s(x / s) - 63 log s
    start, xs, log_qs = time.perf_counter(), [], []
    for k in range(0, args.samples, args.ecnf_chunk):
        y, log_q = flow.sample_and_log_prob((min(args.ecnf_chunk, args.samples - k),))
        xs.append(y * scale)
        log_qs.append(log_q - log_scale)
    seconds, nfe = time.perf_counter() - start, flow.transform.nfe
    x, log_q, d_fraction = fold_chirality(torch.cat(xs), torch.cat(log_qs))
    start = time.perf_counter()
    test = centre(test_x[: args.ecnf_test_frames]) / scale
    log_q_test = torch.cat([flow.log_prob(rows) for rows in test.split(args.ecnf_chunk)]) - log_scale + math.log(2)
    nll_mean_free = -float(log_q_test.mean())
    figures = {
        "test_nll": rigid_motion_nll(nll_mean_free),
        "test_nll_mean_free": nll_mean_free,
        "test_frames": len(test),
        "d_fraction": d_fraction,
        "sample_seconds": seconds,
        "seconds_per_sample": seconds / args.samples,
        "nfe_last_solve": nfe,
        "test_nll_seconds": time.perf_counter() - start,
    }
    print(f"ecnf evaluation: {args.samples} samples with exact log q in {seconds:.1f} s "
          f"({seconds / args.samples:.3f} s per sample), test NLL of {len(test)} frames in "
          f"{figures['test_nll_seconds']:.1f} s; D fraction {d_fraction:.3f}")  # fmt: skip
    return Draws(x, -target.energy(x) - log_q, figures)


def run_ecnf(
    target: AlanineDipeptide, train_x: Tensor, test_x: Tensor, ref: dict, args: argparse.Namespace, out: Path | None
) -> list[dict]:
    """Flow matching of the labelled ECNF for ``--ml-seconds``, then its evaluation."""
    data = centre(train_x)
    scale = float(data.std())
    flow = labelled_ecnf(N_ATOMS, args.ecnf_hidden, args.ecnf_layers, args.ecnf_tol)
    coupling = aligned_ot_coupling if args.ecnf_coupling == "aligned" else args.ecnf_coupling
    print(f"ecnf: EGNN {args.ecnf_layers} x {args.ecnf_hidden} ({sum(p.numel() for p in flow.parameters())} "
          f"parameters), positions / {scale:.4f} nm, {args.ecnf_coupling} coupling")  # fmt: skip
    trainer = Trainer(flow, FlowMatching(coupling=coupling), lr=args.ecnf_lr, clip_grad_norm=10.0, progress=False)
    if args.cosine:
        trainer.callbacks.append(CosineDecay(trainer.optimizer, seconds=args.ml_seconds))
    t0 = time.perf_counter()
    trainer.fit(
        (data / scale).float(), batch_size=args.batch, time_budget=args.ml_seconds, max_steps=args.max_steps,
        epochs=10_000,
    )  # fmt: skip
    steps, seconds = trainer.step, time.perf_counter() - t0
    print(f"flow-matching loss per epoch: {[round(v, 3) for v in trainer.history['loss']]}")
    result = stage(draw_ecnf(flow, scale, target, test_x, args), target, ref, args, "fm", out, flow)
    result.update(model="ecnf", steps=steps, train_seconds=seconds, scale_nm=scale)
    report(result)
    return [result]


def report(result: dict[str, float]) -> None:
    print(f"== {result['stage']}")
    for key, value in result.items():
        if key != "stage":
            print(f"   {key:28s} {value:.5g}" if isinstance(value, float) else f"   {key:28s} {value}")


def finetune(
    flow: nn.Module, ic: nn.Module, target: AlanineDipeptide, data: Tensor, args: argparse.Namespace
) -> Trainer:
    """Energy fine-tuning of the NCSF: ``w_fwd · ForwardKL(MD) + w_rev · ReverseKL + w_imp · ImportanceForwardKL``.

    The importance term (``--importance-weight``) draws from the flow mixed with its image under
    :meth:`AlanineDipeptide.backbone_reflection`, so basin B, absent from the 300 K frames, is
    proposed from basin A and learnt from the energy.
    """
    flow.train()
    pulled = TransformedTarget(target, ic)
    cut = None
    if args.energy_cut is not None:
        cut = float(pulled.energy(data[:2000].double()).median()) + args.energy_cut
        print(f"energy cut of the reverse-KL loss at u_z = {cut:.1f}")
    reverse = ReverseKL(pulled, batch_size=args.ft_batch, energy_cut=cut)
    terms = [(args.reverse_weight, reverse, "rev")]
    if args.importance_weight > 0:  # learns basin B from the energy: the reflection carries A's minima onto B's
        moves = [target.backbone_reflection(ic)]
        jump = ImportanceForwardKL(
            pulled, moves=moves, move_fraction=args.move_fraction, batch_size=args.importance_batch
        )
        terms.append((args.importance_weight, jump, "jump"))
    if args.forward_weight > 0:
        terms.insert(0, (args.forward_weight, MaximumLikelihood(), "fwd"))
    callbacks = []
    if args.anneal_from is not None:
        reverse.temperature = args.anneal_from
        callbacks.append(AnnealTemperature(reverse, seconds=args.ft_seconds, start=args.anneal_from, end=1.0))
    tuner = Trainer(flow, WeightedSum(terms), lr=args.ft_lr, clip_grad_norm=10.0, callbacks=callbacks, progress=False)
    if args.cosine:
        tuner.callbacks.append(CosineDecay(tuner.optimizer, seconds=args.ft_seconds))
    tuner.fit(data, batch_size=args.batch, time_budget=args.ft_seconds, max_steps=args.max_steps, epochs=10_000)
    return tuner


def run_ncsf(
    target: AlanineDipeptide, train_x: Tensor, test_x: Tensor, ref: dict, args: argparse.Namespace, out: Path | None
) -> list[dict]:
    """Maximum likelihood of the NCSF on internal coordinates, then (``--ft-seconds``) energy fine-tuning."""
    val_x = target.reference_samples("val", args.data_dir, dtype=torch.float64)[:1000]
    extra = {"linear_torsions": args.linear_torsions} if args.linear_torsions > 0 else {}
    ic = target.internal_coordinates(reference=train_x, **extra)
    data, val = ic(train_x).float(), ic(val_x).float()
    flow = flows.NCSF(
        data.shape[-1], transforms=args.transforms, hidden=tuple(args.hidden), bins=args.bins,
        circular=ic.circular, lower=ic.lower, upper=ic.upper,
    )  # fmt: skip
    n_circ = int(ic.circular.sum())
    print(f"ALDP vacuum {args.temperature:g} K: {len(train_x)} frames; {n_circ} of 60 coordinates on the circle")
    if args.load_a is not None:  # the A flow of an earlier run with the same options: only B trains here
        flow.load_state_dict(torch.load(args.load_a, weights_only=True))
        results = [stage(draw_ncsf(flow, ic, target, test_x, args), target, ref, args, "finetuned", out, flow)]
        report(results[-1])
        return results + stratify(flow, ic, target, data, val, test_x, ref, args, out)
    t0 = time.perf_counter()
    trainer = Trainer(flow, MaximumLikelihood(), lr=args.lr, clip_grad_norm=10.0, progress=False)
    if args.cosine:
        trainer.callbacks.append(CosineDecay(trainer.optimizer, seconds=args.ml_seconds))
    if args.patience is not None:  # MD frames are correlated: the flow overfits them long before the budget ends
        trainer.callbacks.append(EarlyStopping(patience=args.patience))
    trainer.fit(data, val, batch_size=args.batch, time_budget=args.ml_seconds, max_steps=args.max_steps, epochs=10_000)
    ml_steps, ml_time = trainer.step, time.perf_counter() - t0
    val_curve = [round(v, 2) for v in trainer.history["val_loss"]]
    print(f"validation NLL per epoch (standardised internal coordinates): {val_curve}")
    results = [stage(draw_ncsf(flow, ic, target, test_x, args), target, ref, args, "ml", out, flow)]
    results[-1].update(steps=ml_steps, train_seconds=ml_time)
    report(results[-1])
    if args.ft_seconds > 0:
        t0 = time.perf_counter()
        tuner = finetune(flow, ic, target, data, args)
        results.append(stage(draw_ncsf(flow, ic, target, test_x, args), target, ref, args, "finetuned", out, flow))
        results[-1].update(steps=tuner.step, train_seconds=time.perf_counter() - t0)
        report(results[-1])
    if args.basin_b_seconds > 0:
        results += stratify(flow, ic, target, data, val, test_x, ref, args, out)
    return results


class RestrainedToB(EnergyTarget):
    r"""ALDP's energy plus a flat-bottomed restraint on :math:`\phi` outside basin B: :math:`u + k\,d(\phi)^2`.

    :math:`d` is the angular distance from :math:`\phi` to the arc ``[B_LOW, B_HIGH]`` (0 inside), so
    the energy inside B is unchanged. Only the B flow's reverse KL sees it (the reverse KL on the
    bare energy pulls the B flow into A, where the energy is lower); the mixture's importance
    weights use the bare energy and the mixture's exact density, so they stay exact whatever the B
    flow learnt.
    """

    def __init__(self, target: AlanineDipeptide, strength: float) -> None:
        super().__init__(target.event_shape)
        self.target, self.strength = target, strength

    def energy(self, x: Tensor) -> Tensor:
        phi = self.target.phi_psi(x)[..., 0]
        width = B_HIGH - B_LOW
        past = torch.remainder(phi - B_LOW, 2 * math.pi)  # in [0, 2 pi): inside B when <= width
        distance = torch.where(past <= width, 0.0, torch.minimum(past - width, 2 * math.pi - past))
        return self.target.energy(x) + self.strength * distance**2


def basin_b_flow(
    ic: nn.Module, target: AlanineDipeptide, data: Tensor, val: Tensor, args: argparse.Namespace
) -> tuple[nn.Module, dict]:
    """A flow for basin B alone: maximum likelihood on the reflected frames, then annealed reverse KL.

    The 300 K frames never leave basin A; :meth:`AlanineDipeptide.backbone_reflection` carries them
    onto B's backbone minima with the rest of the molecule unchanged (about 38 kT too high), and
    the reverse KL on the energy relaxes the rest. The 13-15 kT barrier does not always keep it in B
    (its samples drift into A, where the energy is lower): ``--basin-b-restraint k`` adds
    :class:`RestrainedToB` to the energy it trains on. ML takes up to a fifth of
    ``--basin-b-seconds`` (early stopping as for the A flow).
    """
    move = target.backbone_reflection(ic)
    with torch.no_grad():
        data_b, val_b = move(data.double()).float(), move(val.double()).float()
    flow = flows.NCSF(
        data.shape[-1], transforms=args.transforms, hidden=tuple(args.hidden), bins=args.bins,
        circular=ic.circular, lower=ic.lower, upper=ic.upper,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(flow, MaximumLikelihood(), lr=args.lr, clip_grad_norm=10.0, progress=False)
    trainer.callbacks.append(EarlyStopping(patience=args.patience or 5))
    ml_budget = args.basin_b_seconds / 5
    trainer.fit(data_b, val_b, batch_size=args.batch, time_budget=ml_budget, max_steps=args.max_steps, epochs=10_000)
    ml_steps, ml_seconds = trainer.step, time.perf_counter() - t0
    energy = RestrainedToB(target, args.basin_b_restraint) if args.basin_b_restraint > 0 else target
    reverse = ReverseKL(TransformedTarget(energy, ic), batch_size=args.ft_batch)
    seconds = args.basin_b_seconds - ml_seconds
    callbacks = [] if args.anneal_from is None else [
        AnnealTemperature(reverse, seconds=seconds, start=args.anneal_from, end=1.0)
    ]  # fmt: skip
    if args.anneal_from is not None:
        reverse.temperature = args.anneal_from
    tuner = Trainer(flow, reverse, lr=args.ft_lr, clip_grad_norm=10.0, callbacks=callbacks, progress=False)
    if args.cosine:
        tuner.callbacks.append(CosineDecay(tuner.optimizer, seconds=seconds))
    tuner.fit(data_b, batch_size=args.batch, time_budget=seconds, max_steps=args.max_steps, epochs=10_000)
    figures = {"b_ml_steps": ml_steps, "b_ml_seconds": ml_seconds, "b_ft_steps": tuner.step}
    figures["b_train_seconds"] = time.perf_counter() - t0
    return flow, figures


def stratify(
    flow_a: nn.Module,
    ic: nn.Module,
    target: AlanineDipeptide,
    data: Tensor,
    val: Tensor,
    test_x: Tensor,
    ref: dict,
    args: argparse.Namespace,
    out: Path | None,
) -> list[dict]:
    """Train the basin-B flow and evaluate the mixture ``(1 - π) q_A + π q_B`` (exact density) as the proposal."""
    flow_b, figures = basin_b_flow(ic, target, data, val, args)
    draws_b = draw_ncsf(flow_b, ic, target, test_x, args)
    phi = target.phi_psi(draws_b.x)[:, 0]
    in_b = (phi > B_LOW) & (phi < B_HIGH)
    figures["b_flow_in_b"] = float(in_b.double().mean())
    figures["b_flow_ess_in_b"] = float(kish_ess(draws_b.log_w[in_b])) if bool(in_b.any()) else 0.0
    print(f"basin-B flow: {figures}")
    mixture = Mixture([flow_a, flow_b], weights=[1 - args.basin_b_weight, args.basin_b_weight])
    result = stage(draw_ncsf(mixture, ic, target, test_x, args), target, ref, args, "stratified", out, mixture)
    result.update(figures, basin_b_weight=args.basin_b_weight)
    report(result)
    return [result]


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    target = AlanineDipeptide(temperature=args.temperature)
    train_x = target.reference_samples("train", args.data_dir, dtype=torch.float64)[: args.train_frames]
    test_x = target.reference_samples("test", args.data_dir, dtype=torch.float64)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    ref = reference(target, args)
    run = run_ncsf if args.model == "ncsf" else run_ecnf
    results = run(target, train_x, test_x, ref, args, out)
    if out is not None:
        suffix = "" if args.model == "ncsf" else "_ecnf"
        (out / f"alanine_{int(args.temperature)}K{suffix}.json").write_text(
            json.dumps({"args": vars(args), "results": results}, indent=1)
        )
    return results


if __name__ == "__main__":
    main()
