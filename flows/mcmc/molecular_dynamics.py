r"""Reference data for molecular targets: OpenMM Langevin dynamics, umbrella sampling on a torsion, MBAR.

These make the reference sets a molecular Boltzmann generator is judged against (the
``aldp_vacuum_*.npz`` files of the data directory were made this way):

* :func:`langevin_frames`: Langevin dynamics (``LangevinMiddleIntegrator``) of an
  :class:`~flows.targets.OpenMMTarget` at its temperature, frames every ``spacing`` steps, with the
  reduced energies :math:`u = E/(RT)` of the target (optionally with hydrogen-mass
  repartitioning, which leaves the configurational distribution unchanged and allows 2 fs steps);
* :func:`umbrella_sampling`: the same in windows with a harmonic bias
  :math:`\tfrac12 k\, d(\phi, c_i)^2` on a torsion (:math:`d` the wrapped difference), windows
  run one after the other from the last frame of the previous one;
* :func:`mbar_log_weights`: MBAR (Shirts & Chodera 2008, through ``pymbar``) of the windows,
  giving each frame's log weight in the unbiased ensemble, to be used with
  :func:`~flows.metrics.free_energy_profile` and :func:`~flows.metrics.state_free_energy`.

Frames of a trajectory are correlated: errors that assume independent samples (the delta-method
ones) are too small for them; resample blocks instead.

References:
    Torrie & Valleau (1977), "Nonphysical sampling distributions in Monte Carlo free-energy
    estimation: Umbrella sampling", J. Comput. Phys. 23.
    Shirts & Chodera (2008), "Statistically optimal analysis of samples from multiple equilibrium
    states", J. Chem. Phys. 129, 124105.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from flows._validation import check_count
from flows.targets.openmm import OpenMMTarget, import_openmm

__all__ = ["langevin_frames", "mbar_log_weights", "torsion_bias_energy", "umbrella_sampling"]


def _check_positive(who: str, name: str, value: object, *, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0 or not math.isfinite(value):
        kind = "a positive int" if integer else "a positive finite number"
        raise ValueError(f"{who}: expected {kind} {name}, got {value!r}")


def _simulation(target: OpenMMTarget, step_fs: float, friction: float, seed: int, hydrogen_mass: float | None):
    """A Context for dynamics on a copy of the target's system (with HMR and a torsion-bias force slot)."""
    openmm = import_openmm()
    system = openmm.XmlSerializer.deserialize(openmm.XmlSerializer.serialize(target.system))
    if hydrogen_mass is not None:
        _repartition(system, hydrogen_mass, openmm)
    bias = openmm.CustomTorsionForce(
        "0.5*k*dtheta^2; dtheta = min(d, 2*pi-d); d = abs(theta-theta0); pi = 3.141592653589793"
    )
    bias.addGlobalParameter("k", 0.0)
    bias.addGlobalParameter("theta0", 0.0)
    bias.setForceGroup(31)
    system.addForce(bias)
    integrator = openmm.LangevinMiddleIntegrator(
        target.temperature * openmm.unit.kelvin, friction / openmm.unit.picosecond, step_fs * openmm.unit.femtosecond
    )
    integrator.setRandomNumberSeed(seed)
    platform = openmm.Platform.getPlatformByName(target.platform)
    properties = {"Threads": str(target.threads)} if target.platform == "CPU" else {}
    return openmm.Context(system, integrator, platform, properties), bias, integrator


def _repartition(system: Any, hydrogen_mass: float, openmm: Any) -> None:
    """Move mass from each heavy atom onto its bonded hydrogens until they weigh ``hydrogen_mass`` amu."""
    dalton = openmm.unit.dalton
    for force in system.getForces():
        if isinstance(force, openmm.HarmonicBondForce):
            for b in range(force.getNumBonds()):
                i, j, *_ = force.getBondParameters(b)
                mi, mj = (
                    system.getParticleMass(i).value_in_unit(dalton),
                    system.getParticleMass(j).value_in_unit(dalton),
                )
                if mj < 1.5 < mi:  # j is a hydrogen
                    i, j, mi, mj = j, i, mj, mi
                if mi < 1.5 < mj:
                    extra = hydrogen_mass - mi
                    system.setParticleMass(i, hydrogen_mass * dalton)
                    system.setParticleMass(j, (mj - extra) * dalton)


def _run(context: Any, integrator: Any, frames: int, spacing: int, n_atoms: int) -> np.ndarray:
    openmm = import_openmm()
    out = np.empty((frames, n_atoms * 3))
    for f in range(frames):
        integrator.step(spacing)
        pos = context.getState(getPositions=True).getPositions(asNumpy=True).value_in_unit(openmm.unit.nanometer)
        out[f] = np.asarray(pos).reshape(-1)
    return out


def langevin_frames(
    target: OpenMMTarget,
    positions: Tensor,
    frames: int,
    *,
    spacing: int = 500,
    step_fs: float = 1.0,
    friction: float = 1.0,
    equilibration: int = 0,
    hydrogen_mass: float | None = None,
    seed: int = 1,
    minimize: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""Langevin dynamics of ``target`` at its temperature: ``frames`` configurations ``spacing`` steps apart.

    Args:
        target: the molecule (its system, temperature, platform and threads are used).
        positions: the starting configuration ``(3n,)`` in nm.
        frames: number of frames recorded.
        spacing: integration steps between frames.
        step_fs: time step in fs (1 fs with physical masses; 2 fs with ``hydrogen_mass=3``).
        friction: Langevin friction in 1/ps.
        equilibration: steps run (after minimising) before the first frame.
        hydrogen_mass: repartition hydrogen masses to this many amu (``None``: physical masses).
        seed: the integrator's random seed.
        minimize: minimise the energy first.

    Returns:
        ``(x, u)``: frames ``(frames, 3n)`` in nm (float64) and their reduced energies ``(frames,)``
        under the target (no bias).

    Raises:
        ValueError: for non-positive counts, steps or friction, or positions of the wrong size.
    """
    who = "langevin_frames"
    _check_positive(who, "frames", frames, integer=True)
    _check_positive(who, "spacing", spacing, integer=True)
    _check_positive(who, "step_fs", step_fs)
    _check_positive(who, "friction", friction)
    check_count(who, "equilibration", equilibration, minimum=0)
    context, _, integrator = _simulation(target, step_fs, friction, seed, hydrogen_mass)
    _start(context, target, positions, minimize, seed, who)
    if equilibration:
        integrator.step(equilibration)
    x = torch.from_numpy(_run(context, integrator, frames, spacing, target.n_atoms))
    return x, target.energy(x)


def _start(context: Any, target: OpenMMTarget, positions: Tensor, minimize: bool, seed: int, who: str) -> None:
    openmm = import_openmm()
    positions = torch.as_tensor(positions, dtype=torch.float64).reshape(-1)
    if positions.numel() != 3 * target.n_atoms or not bool(torch.isfinite(positions).all()):
        raise ValueError(
            f"{who}: expected finite starting positions of {3 * target.n_atoms} numbers (nm), got {positions.numel()}"
        )
    context.setPositions(positions.reshape(-1, 3).numpy() * openmm.unit.nanometer)
    if minimize:
        openmm.LocalEnergyMinimizer.minimize(context)
    context.setVelocitiesToTemperature(target.temperature * openmm.unit.kelvin, seed)


def torsion_bias_energy(torsion: Tensor, centres: Tensor, force_constant_kT: float) -> Tensor:
    r"""Reduced bias energies :math:`\tfrac12 k\, d(\phi_n, c_i)^2`, shape ``(windows, N)``, :math:`d` wrapped.

    Example:
        >>> import math, torch
        >>> round(torsion_bias_energy(torch.tensor([3.0]), torch.tensor([-3.0]), 2.0).item(), 4)  # d = 6 - 2π
        0.0802
    """
    d = torch.remainder(torsion[None, :] - centres[:, None] + math.pi, 2 * math.pi) - math.pi
    return 0.5 * force_constant_kT * d.square()


def umbrella_sampling(
    target: OpenMMTarget,
    atoms: Sequence[int],
    centres: Sequence[float] | Tensor,
    force_constant: float,
    positions: Tensor,
    frames_per_window: int,
    *,
    spacing: int = 500,
    equilibration: int = 20_000,
    step_fs: float = 1.0,
    friction: float = 1.0,
    hydrogen_mass: float | None = None,
    seed: int = 1,
) -> dict[str, Tensor]:
    r"""Umbrella sampling on the torsion of four ``atoms``: one Langevin run per window centre.

    Window :math:`i` adds the bias :math:`\tfrac12 k\, d(\phi, c_i)^2` (``force_constant`` :math:`k`
    in kJ/mol/rad²); windows run in the given order, each starting from the last frame of the
    previous one, with ``equilibration`` steps before its ``frames_per_window`` frames.

    Returns:
        a dict with ``positions`` ``(W·F, 3n)``, ``window`` ``(W·F,)`` (int64), ``torsion`` (the
        biased coordinate, rad), ``energy_kT`` (unbiased reduced energies), ``centres`` ``(W,)``
        and ``force_constant_kT`` (:math:`k/(RT)`, a 0-d tensor).

    Raises:
        ValueError: for other than four distinct atoms, no centres, or non-positive counts.
    """
    who = "umbrella_sampling"
    atoms = [int(a) for a in atoms]
    if len(set(atoms)) != 4 or not all(0 <= a < target.n_atoms for a in atoms):
        raise ValueError(f"{who}: expected four distinct atoms of the {target.n_atoms}, got {atoms}")
    centres = torch.as_tensor(centres, dtype=torch.float64).reshape(-1)
    if centres.numel() == 0:
        raise ValueError(f"{who}: expected at least one window centre, got none")
    _check_positive(who, "force_constant", force_constant)
    _check_positive(who, "frames_per_window", frames_per_window, integer=True)
    context, bias, integrator = _simulation(target, step_fs, friction, seed, hydrogen_mass)
    bias.addTorsion(*atoms, [])
    context.reinitialize(preserveState=False)
    _start(context, target, positions, True, seed, who)
    context.setParameter("k", float(force_constant))
    xs, window = [], []
    for w, centre in enumerate(centres.tolist()):
        context.setParameter("theta0", centre)
        integrator.step(equilibration)
        xs.append(_run(context, integrator, frames_per_window, spacing, target.n_atoms))
        window.append(torch.full((frames_per_window,), w, dtype=torch.long))
    x = torch.from_numpy(np.concatenate(xs))
    pos = x.reshape(len(x), -1, 3)
    from flows.bijections.internal_coordinates import dihedral

    torsion = dihedral(*(pos[:, a] for a in atoms))
    return {
        "positions": x,
        "window": torch.cat(window),
        "torsion": torsion,
        "energy_kT": target.energy(x),
        "centres": centres,
        "force_constant_kT": torch.tensor(float(force_constant) / target.kT, dtype=torch.float64),
    }


def mbar_log_weights(
    bias_kT: Tensor, window: Tensor, *, solver_tolerance: float = 1e-7, maximum_iterations: int = 10_000
) -> tuple[Tensor, Tensor, Tensor]:
    r"""MBAR for biased windows of one unbiased ensemble: window free energies and each sample's unbiased log weight.

    For windows :math:`i` with reduced bias :math:`b_i(x)` (the unbiased energy is common to all
    and cancels) MBAR solves :math:`f_i = -\log \sum_n \exp(-b_i(x_n)) / \sum_j N_j \exp(f_j - b_j(x_n))`
    through ``pymbar``; the log weight of sample :math:`n` in the unbiased ensemble is
    :math:`-\log \sum_j N_j \exp(f_j - b_j(x_n))`, normalised so that the weights sum to one
    (the mean of :math:`g` is :math:`\sum_n e^{\log w_n} g(x_n)`).

    Args:
        bias_kT: reduced bias energies ``(windows, N)`` of every sample under every window's bias
            (e.g. :func:`torsion_bias_energy`).
        window: the window each sample was drawn in, ``(N,)`` integers in ``[0, windows)``.
        solver_tolerance: pymbar's relative convergence tolerance.
        maximum_iterations: pymbar's iteration limit (windows that do not overlap converge slowly,
            if at all: choose centres and force constants so that neighbours share samples).

    Returns:
        ``(f, f_stderr, log_w)``: window free energies relative to the unbiased ensemble
        (:math:`f_i - f_0` with :math:`f_0` the unbiased state) ``(windows,)``, pymbar's
        asymptotic standard errors of them, and the normalised log weights ``(N,)``.

    Raises:
        ImportError: without pymbar (``pip install "flows[molecules]"``).
        ValueError: for shapes that do not match or a window without samples.
    """
    try:
        import pymbar
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            'mbar_log_weights: expected the optional dependency pymbar: pip install "flows[molecules]" (or pymbar)'
        ) from error
    bias_kT = torch.as_tensor(bias_kT, dtype=torch.float64)
    window = torch.as_tensor(window)
    if bias_kT.dim() != 2 or window.shape != bias_kT.shape[1:]:
        raise ValueError(
            f"mbar_log_weights: expected bias_kT (windows, N) and window (N,), got {tuple(bias_kT.shape)} "
            f"and {tuple(window.shape)}"
        )
    counts = torch.bincount(window.long(), minlength=bias_kT.shape[0])
    if len(counts) != bias_kT.shape[0] or bool((counts == 0).any()):
        raise ValueError(
            f"mbar_log_weights: expected samples in each of the {bias_kT.shape[0]} windows, got {counts.tolist()}"
        )
    # states: the windows, plus the unbiased ensemble (no samples) as the last state
    u_kn = torch.cat([bias_kT, torch.zeros(1, bias_kT.shape[1], dtype=torch.float64)]).numpy()
    n_k = np.concatenate([counts.numpy(), [0]])
    mbar = pymbar.MBAR(u_kn, n_k, relative_tolerance=solver_tolerance, maximum_iterations=maximum_iterations)
    result = mbar.compute_free_energy_differences()
    f = torch.from_numpy(np.asarray(result["Delta_f"])[-1, :-1])  # f_i - f_unbiased
    se = torch.from_numpy(np.asarray(result["dDelta_f"])[-1, :-1])
    f_k = torch.from_numpy(np.asarray(mbar.f_k, dtype=np.float64))
    log_n = torch.log(counts.double())
    log_w = -torch.logsumexp(log_n[:, None] + f_k[:-1, None] - bias_kT, 0)
    log_w = log_w - torch.logsumexp(log_w, 0)
    return f, se, log_w
