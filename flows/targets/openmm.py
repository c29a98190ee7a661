r"""Molecular energies from OpenMM: :math:`u(x) = E(x) / (k_B T)` with forces as gradients.

:class:`OpenMMTarget` wraps any unconstrained ``openmm.System``; :class:`AlanineDipeptide` builds
the standard Boltzmann-generator benchmark (Ace-Ala-Nme, 22 atoms) from OpenMM's own force-field
files. ``openmm`` is an optional dependency (``pip install "flows[molecules]"``), imported only
when a target is built, so ``import flows`` never loads it.

Positions are in **nanometres**, flattened particle-major ``(*batch, 3 n_atoms)`` (as
:class:`~flows.targets.ParticleSystem`: ``x[..., 0:3]`` is atom 0), or ``(*batch, n_atoms, 3)``.
The energy is invariant under rigid motions, so :math:`e^{-u}` is not normalisable on the
Cartesian space: a flow models it in internal coordinates
(:class:`~flows.bijections.InternalCoordinates`) or on the zero-centre-of-mass subspace.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from flows._validation import check_count
from flows.targets.base import EnergyTarget

__all__ = ["MOLAR_GAS_CONSTANT", "OpenMMTarget"]

MOLAR_GAS_CONSTANT = 8.31446261815324e-3
r"""The molar gas constant :math:`R` in kJ/(mol K) (``openmm.unit.MOLAR_GAS_CONSTANT_R``)."""

_ANGSTROM_RATIO = (6.0, 15.0)  # every bond this many times its rest length: the positions are in Å


def import_openmm() -> Any:
    """Import ``openmm`` or raise an ``ImportError`` that says how to install it."""
    try:
        import openmm
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "expected the optional dependency openmm for molecular targets, it is not installed: "
            'pip install "flows[molecules]" (or pip install openmm)'
        ) from error
    return openmm


class _OpenMMEnergy(torch.autograd.Function):
    """Bridge: reduced energies of a ``(B, 3n)`` float64 CPU batch, with OpenMM's forces as the gradient."""

    @staticmethod
    def forward(x: Tensor, target: OpenMMTarget) -> tuple[Tensor, Tensor]:
        return target._evaluate(x, forces=True)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_u: Tensor, grad_grad: Tensor) -> tuple[Tensor | None, None]:
        (grad,) = ctx.saved_tensors
        return grad_u.unsqueeze(-1) * grad, None

    @staticmethod
    def vmap(
        info: Any, in_dims: tuple[Any, ...], x: Tensor, target: OpenMMTarget
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        """Under :func:`torch.func.vmap`: one OpenMM batch over the mapped and the batch dimension together."""
        x = x.expand(info.batch_size, *x.shape) if in_dims[0] is None else x.movedim(in_dims[0], 0)
        u, grad = _OpenMMEnergy.apply(x.reshape(-1, x.shape[-1]), target)
        return (u.reshape(x.shape[:-1]), grad.reshape(x.shape)), (0, 0)


class OpenMMTarget(EnergyTarget):
    r"""The Boltzmann density :math:`\pi(x) \propto e^{-E(x)/(k_B T)}` of an OpenMM system.

    The reduced energy :math:`u(x) = E(x) / (R T)` (kJ/mol over :math:`R T`, with
    :math:`R =` :data:`MOLAR_GAS_CONSTANT`) is evaluated by OpenMM one configuration at a time in
    float64 on the CPU, and returned in the caller's dtype and device. Its gradient is
    :math:`\nabla u = -F / (R T)` with OpenMM's forces :math:`F`, through a
    ``torch.autograd.Function``; :meth:`energy_and_grad` takes both from one OpenMM call per
    configuration. OpenMM has no Hessian, so second derivatives (``create_graph=True``) raise.

    Conventions (those of :class:`~flows.targets.EnergyTarget`): a configuration with a NaN gives
    a NaN energy (and gradient) without calling OpenMM; a finite-or-infinite configuration whose
    energy is not finite (an overflow, coinciding atoms) gives :math:`u = +\infty` with a zero
    gradient.

    **Units check.** Positions must be in nm. Before evaluating, the lengths of the system's
    harmonic bonds are compared with their rest lengths :math:`r_0`: a configuration in which
    *every* bond is between 6 and 15 times its rest length is what Ångström input looks like, and
    is refused with a ``ValueError`` (pass ``check_units=False`` to skip the check). Random or
    distorted configurations in nm do not trip it.

    The OpenMM ``Context`` is built lazily on first use and is not pickled or copied: a pickled,
    ``copy.deepcopy``-ed or unpickled target builds its own.

    Args:
        system: an ``openmm.System`` without constraints (a constrained system's density lives on
            a manifold, which no flow here models).
        temperature: temperature :math:`T` in kelvin.
        platform: OpenMM platform name (``"Reference"``, ``"CPU"``, ``"CUDA"``, ...).
        threads: threads of the CPU platform (ignored by the others).
        check_units: refuse positions that look like Ångström (see above).

    Raises:
        TypeError: when ``system`` is not an ``openmm.System``.
        ValueError: for a system with constraints or no particles, or ``temperature <= 0``.
    """

    def __init__(
        self,
        system: Any,
        temperature: float = 300.0,
        *,
        platform: str = "Reference",
        threads: int = 1,
        check_units: bool = True,
    ) -> None:
        openmm = import_openmm()
        name = type(self).__name__
        if not isinstance(system, openmm.System):
            raise TypeError(f"{name}: expected an openmm.System, got {type(system).__name__}")
        if system.getNumConstraints() > 0:
            raise ValueError(
                f"{name}: expected a system without constraints, got {system.getNumConstraints()} constraints "
                "(build it with constraints=None and rigidWater=False)"
            )
        n = system.getNumParticles()
        if n < 1:
            raise ValueError(f"{name}: expected a system with particles, got {n}")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"{name}: expected a temperature > 0 (kelvin), got {temperature!r}")
        check_count(name, "threads", threads)
        super().__init__(3 * n)
        self.n_atoms = n
        self.temperature = float(temperature)
        self.kT = MOLAR_GAS_CONSTANT * self.temperature
        self.platform, self.threads, self.check_units = str(platform), threads, bool(check_units)
        self._system_xml = openmm.XmlSerializer.serialize(system)
        self._bonds, self._rest_lengths = _harmonic_bonds(system, openmm)
        self._context: Any = None
        self._system: Any = system

    # -- pickling and copying: the Context stays behind ---------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_context"] = None
        state["_system"] = None
        return state

    @property
    def system(self) -> Any:
        """The ``openmm.System`` (rebuilt from its XML after unpickling)."""
        if self._system is None:
            self._system = import_openmm().XmlSerializer.deserialize(self._system_xml)
        return self._system

    def _get_context(self) -> Any:
        if self._context is None:
            openmm = import_openmm()
            platform = openmm.Platform.getPlatformByName(self.platform)
            properties = {"Threads": str(self.threads)} if self.platform == "CPU" else {}
            self._context = openmm.Context(self.system, openmm.VerletIntegrator(1.0), platform, properties)
        return self._context

    # -- evaluation ---------------------------------------------------------------------------------

    def _flat(self, x: Tensor) -> Tensor:
        """``x`` as ``(*batch, 3n)``: accepts ``(*batch, n, 3)`` too (for ``n > 1``)."""
        if self.n_atoms > 1 and x.dim() >= 2 and tuple(x.shape[-2:]) == (self.n_atoms, 3):
            x = x.flatten(-2)
        self._check_input(x)
        return x

    def _evaluate(self, x: Tensor, *, forces: bool) -> tuple[Tensor, Tensor]:
        """Reduced energies ``(B,)`` and gradients ``(B, 3n)`` (zeros unless ``forces``) of a float64 CPU batch."""
        xs = x.detach().numpy().reshape(len(x), self.n_atoms, 3)
        energy = np.full(len(x), np.nan)
        force = np.zeros((len(x), self.n_atoms, 3))
        clean = ~np.isnan(xs).any(axis=(1, 2))
        if clean.any():
            _openmm_loop(self._get_context(), xs, np.flatnonzero(clean), energy, force if forces else None)
        finite = np.isfinite(energy) & np.isfinite(force).all(axis=(1, 2))
        u = np.where(finite, energy / self.kT, np.where(clean, np.inf, np.nan))
        grad = np.where(finite[:, None, None], force * (-1.0 / self.kT), np.where(clean, 0.0, np.nan)[:, None, None])
        return torch.from_numpy(u), torch.from_numpy(grad.reshape(len(x), self.dim))

    def _check_positions(self, x: Tensor) -> None:
        if not self.check_units or self._bonds is None or x.numel() == 0:
            return
        pos = x.detach().reshape(-1, self.n_atoms, 3)
        d = (pos[:, self._bonds[0]] - pos[:, self._bonds[1]]).norm(dim=-1) / self._rest_lengths.to(pos)
        lo, hi = _ANGSTROM_RATIO
        looks_angstrom = ((d > lo) & (d < hi)).all(-1)
        if bool(looks_angstrom.any()):
            row = int(torch.nonzero(looks_angstrom)[0])
            raise ValueError(
                f"{type(self).__name__}: expected positions in nm, got configuration {row} with every bond "
                f"{lo:g}-{hi:g} times its rest length (median {float(d[row].median()):.3g}x): Ångström? "
                "Divide by 10, or pass check_units=False"
            )

    def energy(self, x: Tensor) -> Tensor:
        x = self._flat(x)
        self._check_positions(x)
        batch = x.shape[:-1]
        x64 = x.to(device="cpu", dtype=torch.float64).reshape(-1, self.dim)
        if torch.is_grad_enabled() and x.requires_grad:
            u, _ = _OpenMMEnergy.apply(x64, self)
        else:
            u, _ = self._evaluate(x64, forces=False)
        return u.reshape(batch).to(device=x.device, dtype=x.dtype)

    def energy_and_grad(self, x: Tensor, *, create_graph: bool = False) -> tuple[Tensor, Tensor]:
        r"""Reduced energies and :math:`\nabla u = -F/(RT)` from one OpenMM call per configuration.

        Raises:
            NotImplementedError: for ``create_graph=True`` (OpenMM gives no second derivatives).
        """
        if create_graph:
            raise NotImplementedError(
                f"{type(self).__name__}: expected create_graph=False, got True (OpenMM gives forces, not Hessians)"
            )
        shape = x.shape
        x = self._flat(x)
        self._check_positions(x)
        u, grad = self._evaluate(x.detach().to(device="cpu", dtype=torch.float64).reshape(-1, self.dim), forces=True)
        return (
            u.reshape(x.shape[:-1]).to(device=x.device, dtype=x.dtype),
            grad.reshape(shape).to(device=x.device, dtype=x.dtype),
        )

    def extra_repr(self) -> str:
        return f"n_atoms={self.n_atoms}, temperature={self.temperature}, platform={self.platform!r}"


def _openmm_loop(context: Any, xs: np.ndarray, rows: np.ndarray, energy: np.ndarray, force: np.ndarray | None) -> None:
    """Fill ``energy[i]`` (kJ/mol) and ``force[i]`` (kJ/mol/nm) for ``i in rows``; NaN where OpenMM fails."""
    want = force is not None
    for i in rows:
        try:
            context.setPositions(xs[i])
            state = context.getState(getEnergy=True, getForces=want)
        except Exception:  # OpenMM refuses some non-finite or overflowing coordinates
            continue  # energy[i] stays NaN: +inf for a clean row
        energy[i] = state.getPotentialEnergy()._value
        if want:
            force[i] = state.getForces(asNumpy=True)._value


def _harmonic_bonds(system: Any, openmm: Any) -> tuple[Tensor | None, Tensor | None]:
    """Atom pairs ``(2, n_bonds)`` and rest lengths (nm) of the system's ``HarmonicBondForce`` terms."""
    pairs, lengths = [], []
    for force in system.getForces():
        if isinstance(force, openmm.HarmonicBondForce):
            for k in range(force.getNumBonds()):
                i, j, r0, _ = force.getBondParameters(k)
                r0 = r0._value if hasattr(r0, "_value") else float(r0)
                if r0 > 0:
                    pairs.append((i, j))
                    lengths.append(r0)
    if not pairs:
        return None, None
    return torch.tensor(pairs).T.contiguous(), torch.tensor(lengths, dtype=torch.float64)
