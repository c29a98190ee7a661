"""``flows data md`` and ``flows data umbrella``: make molecular reference data with OpenMM (and MBAR).

Both write a NumPy ``.npz`` into the data directory (``--data-dir`` or ``$FLOWS_DATA_DIR``) in
the layout of the shared ``aldp_vacuum_*`` files, and a ``NAME.sha256`` beside it; they print
the checksum. ``md`` writes ``train``/``val``/``test`` frames (contiguous time blocks, float32 nm)
with ``energy_kT_{split}`` (float64); ``umbrella`` writes every window's frames with their MBAR
log weights in the unbiased ensemble, ``phi``, ``psi``, ``F_phi_kT`` (60 bins, shifted to a
minimum of 0) and ``dF_kT`` = F(B) − F(A), B = {0 < φ < 2.2}, with errors from a block bootstrap.
``meta`` is a JSON string with the settings and the measured numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_data_parser", "data"]

B_LOW, B_HIGH = 0.0, 2.2


def add_data_parser(sub: Any) -> None:
    """Register ``flows data {md,umbrella}`` on the sub-parser action of the ``flows`` parser."""
    parser = sub.add_parser("data", help="make molecular reference data (OpenMM MD, umbrella sampling + MBAR)")
    kinds = parser.add_subparsers(dest="data_command", metavar="KIND")
    kinds.required = True
    md = kinds.add_parser("md", help="Langevin dynamics of alanine dipeptide at a temperature")
    umbrella = kinds.add_parser("umbrella", help="umbrella sampling on phi with MBAR weights, F(phi) and Delta F")
    for p in (md, umbrella):
        p.add_argument("--out", required=True, help="file name (.npz) inside the data directory")
        p.add_argument("--data-dir", help="data directory (default: $FLOWS_DATA_DIR)")
        p.add_argument("--temperature", type=float, default=300.0, help="kelvin (default: 300)")
        p.add_argument("--solvent", choices=("vacuum", "implicit"), default="vacuum")
        p.add_argument("--spacing-ps", type=float, default=0.5, help="time between frames (default: 0.5 ps)")
        p.add_argument("--step-fs", type=float, default=1.0, help="time step (default: 1 fs; 2 with --hmr)")
        p.add_argument("--hmr", action="store_true", help="hydrogen-mass repartitioning (H 3 amu)")
        p.add_argument("--friction", type=float, default=1.0, help="Langevin friction in 1/ps (default: 1)")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--overwrite", action="store_true", help="replace an existing file")
    md.add_argument("--frames", type=int, required=True, help="number of frames")
    md.add_argument("--equilibration-ps", type=float, default=100.0, help="before the first frame (default: 100)")
    md.add_argument("--split", type=float, nargs=3, default=(0.8, 0.1, 0.1), metavar=("TRAIN", "VAL", "TEST"))
    umbrella.add_argument("--windows", type=int, default=48, help="window centres -pi + 2 pi i / W (default: 48)")
    umbrella.add_argument("--force-constant", type=float, default=250.0, help="kJ/mol/rad^2 (default: 250)")
    umbrella.add_argument("--frames-per-window", type=int, default=300)
    umbrella.add_argument("--equilibration-ps", type=float, default=20.0, help="per window (default: 20)")
    umbrella.add_argument("--bins", type=int, default=60, help="bins of F(phi) on [-pi, pi] (default: 60)")
    umbrella.add_argument("--boot", type=int, default=50, help="block-bootstrap replicates (default: 50)")
    umbrella.add_argument("--block", type=int, default=50, help="frames per bootstrap block (default: 50)")


def _steps(args: argparse.Namespace, ps: float, what: str) -> int:
    if not (args.step_fs > 0 and math.isfinite(args.step_fs)):
        raise ValueError(f"flows data: expected --step-fs > 0, got {args.step_fs}")
    steps = round(ps * 1000.0 / args.step_fs)
    if ps < 0 or (what == "spacing" and steps < 1):
        raise ValueError(f"flows data: expected --{what}-ps of at least one step ({args.step_fs} fs), got {ps}")
    return steps


def _output(args: argparse.Namespace) -> Path:
    from flows.data.files import data_dir

    name = Path(args.out)
    if name.suffix != ".npz" or name.name != args.out:
        raise ValueError(f"flows data: expected --out as a file name ending in .npz, got {args.out!r}")
    path = data_dir(args.data_dir) / name
    if path.exists() and not args.overwrite:
        raise ValueError(f"flows data: {path} exists; pass --overwrite to replace it")
    return path


def _save(path: Path, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
    import numpy as np

    from flows.data.files import sha256sum

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part.npz")
    np.savez(tmp, **arrays, meta=np.array(json.dumps(meta)))
    tmp.replace(path)
    digest = sha256sum(path)
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)\nsha256 {digest}")


def _target(args: argparse.Namespace) -> Any:
    from flows.targets import AlanineDipeptide

    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        raise ValueError(f"flows data: expected --temperature > 0, got {args.temperature}")
    return AlanineDipeptide(solvent=args.solvent, temperature=args.temperature, platform="CPU", threads=1)


def _meta(args: argparse.Namespace, target: Any) -> dict[str, Any]:
    import openmm

    settings = {k: v for k, v in vars(args).items() if k not in ("command", "data_command", "data_dir")}
    return {
        "command": "flows data " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["data"] else None,
        "settings": settings,
        "system": f"AlanineDipeptide(solvent={args.solvent!r}) amber96, NoCutoff, no constraints",
        "atoms": 22,
        "units": "nm; energy_kT = E / (R T)",
        "openmm": openmm.__version__,
    }


def _md(args: argparse.Namespace) -> int:
    import numpy as np

    from flows.mcmc.molecular_dynamics import langevin_frames

    path = _output(args)
    split = [float(s) for s in args.split]
    if args.frames < 3 or any(s < 0 for s in split) or abs(sum(split) - 1) > 1e-9:
        raise ValueError(f"flows data md: expected --frames >= 3 and --split fractions summing to 1, got {args.split}")
    target = _target(args)
    spacing, equilibration = (
        _steps(args, args.spacing_ps, "spacing"),
        _steps(args, args.equilibration_ps, "equilibration"),
    )
    x, u = langevin_frames(
        target, target.positions0, args.frames, spacing=spacing, step_fs=args.step_fs, friction=args.friction,
        equilibration=equilibration, hydrogen_mass=3.0 if args.hmr else None, seed=args.seed,
    )  # fmt: skip
    n_train = round(split[0] * len(x))
    n_val = round(split[1] * len(x))
    cuts = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(x))}
    arrays: dict[str, Any] = {}
    for name, (lo, hi) in cuts.items():
        arrays[name] = x[lo:hi].numpy().astype(np.float32)
        arrays[f"energy_kT_{name}"] = u[lo:hi].numpy()
    phi = target.phi_psi(x)[:, 0]
    meta = _meta(args, target)
    meta["measured"] = {
        "mean_energy_kT": float(u.mean()),
        "std_energy_kT": float(u.std()),
        "fraction_in_B": float(((phi > B_LOW) & (phi < B_HIGH)).double().mean()),
    }
    _save(path, arrays, meta)
    print(json.dumps(meta["measured"]))
    return 0


def _umbrella(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from flows.mcmc.molecular_dynamics import mbar_log_weights, torsion_bias_energy, umbrella_sampling
    from flows.targets.alanine import PHI_ATOMS

    path = _output(args)
    if args.windows < 2 or args.frames_per_window < 2 or args.bins < 2 or args.boot < 0 or args.block < 1:
        raise ValueError(
            "flows data umbrella: expected --windows, --frames-per-window, --bins >= 2, --boot >= 0 and --block >= 1"
        )
    target = _target(args)
    centres = -math.pi + 2 * math.pi * torch.arange(args.windows, dtype=torch.float64) / args.windows
    start = int(torch.argmin((centres - target.phi_psi(target.positions0)[0]).abs()))
    order = torch.cat([torch.arange(start, args.windows), torch.arange(0, start)])  # sweep upwards from the start
    spacing, equilibration = (
        _steps(args, args.spacing_ps, "spacing"),
        _steps(args, args.equilibration_ps, "equilibration"),
    )
    run = umbrella_sampling(
        target, PHI_ATOMS, centres[order], args.force_constant, target.positions0, args.frames_per_window,
        spacing=spacing, equilibration=equilibration,
        step_fs=args.step_fs, friction=args.friction, hydrogen_mass=3.0 if args.hmr else None, seed=args.seed,
    )  # fmt: skip
    window = order[run["window"]]
    bias = torsion_bias_energy(run["torsion"], centres, float(run["force_constant_kT"]))
    _, _, log_w = mbar_log_weights(bias, window)
    angles = target.phi_psi(run["positions"])
    estimates = _profile(angles[:, 0], log_w, args.bins)
    boot = _bootstrap(angles[:, 0], bias, window, args)
    arrays = {
        "positions": run["positions"].numpy().astype(np.float32),
        "log_weights": log_w.numpy(),
        "energy_kT": run["energy_kT"].numpy(),
        "phi": angles[:, 0].numpy(),
        "psi": angles[:, 1].numpy(),
        "window": window.numpy().astype(np.int16),
        "window_centers": centres.numpy(),
        "phi_bin_edges": np.linspace(-math.pi, math.pi, args.bins + 1),
        "F_phi_kT": estimates["F"].numpy(),
        "F_phi_se_kT": boot["F"].numpy(),
        "p_phi_bins": estimates["p"].numpy(),
        "dF_kT": np.float64(estimates["dF"]),
        "dF_se_kT": np.float64(boot["dF"]),
    }
    meta = _meta(args, target)
    meta["measured"] = {"dF_kT": float(estimates["dF"]), "dF_se_kT": float(boot["dF"]), "kish_ess": _ess(log_w)}
    _save(path, arrays, meta)
    print(json.dumps(meta["measured"]))
    return 0


def _ess(log_w: Any) -> float:
    from flows.metrics import kish_ess

    return float(kish_ess(log_w))


def _profile(phi: Any, log_w: Any, bins: int) -> dict[str, Any]:
    """F(φ) on ``bins`` bins of [-π, π] (shifted to min 0), bin probabilities, and ΔF(B − A)."""
    import torch

    from flows.metrics import free_energy_profile, state_free_energy

    profile = free_energy_profile(phi, log_w, bins=bins, range=(-math.pi, math.pi))
    free = profile.free_energy - profile.free_energy[torch.isfinite(profile.free_energy)].min()
    delta = state_free_energy((phi > B_LOW) & (phi < B_HIGH), log_w).delta_f
    return {"F": free, "p": profile.density * (2 * math.pi / bins), "dF": delta}


def _bootstrap(phi: Any, bias: Any, window: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Block bootstrap (blocks of ``--block`` frames resampled within each window, MBAR re-solved)."""
    import torch

    from flows.mcmc.molecular_dynamics import mbar_log_weights

    if args.boot == 0:
        return {"F": torch.full((args.bins,), math.nan, dtype=torch.float64), "dF": math.nan}
    gen = torch.Generator().manual_seed(args.seed)
    fs, dfs = [], []
    for _ in range(args.boot):
        index = []
        for w in range(args.windows):
            rows = torch.nonzero(window == w).flatten()
            blocks = rows.split(args.block)
            pick = torch.randint(len(blocks), (len(blocks),), generator=gen)
            index.append(torch.cat([blocks[int(i)] for i in pick]))
        index = torch.cat(index)
        _, _, lw = mbar_log_weights(bias[:, index], window[index])
        est = _profile(phi[index], lw, args.bins)
        fs.append(est["F"])
        dfs.append(est["dF"])
    f = torch.stack(fs)
    finite = torch.isfinite(f).all(0)
    se = torch.where(finite, f.std(0), torch.full_like(f[0], math.inf))
    d = torch.tensor(dfs)
    return {"F": se, "dF": float(d[torch.isfinite(d)].std()) if bool(torch.isfinite(d).sum() > 1) else math.inf}


def data(args: argparse.Namespace) -> int:
    """``flows data md|umbrella``: run the simulation and write the file; returns the exit status."""
    return _md(args) if args.data_command == "md" else _umbrella(args)
