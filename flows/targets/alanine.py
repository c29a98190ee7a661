r"""Alanine dipeptide (Ace-Ala-Nme), the standard molecular Boltzmann-generator benchmark, through OpenMM.

22 atoms in the order of the openmmtools test system and of the reference data
(``aldp_vacuum_*.npz``): 0 H1, 1 CH3, 2 H2, 3 H3, 4 C, 5 O (ACE); 6 N, 7 H, 8 CA, 9 HA, 10 CB,
11-13 HB, 14 C, 15 O (ALA); 16 N, 17 H, 18 C, 19-21 H (NME). The backbone torsions are
:math:`\phi` = (4, 6, 8, 14) and :math:`\psi` = (6, 8, 14, 16), IUPAC sign (as ``mdtraj``).
The topology is built in code and parametrised with OpenMM's own force-field files, so nothing is
downloaded: AMBER ff96 (``amber96.xml``) in vacuum, or with OBC1 implicit solvent
(``implicit/obc1.xml``), NoCutoff, **no constraints**. This reproduces the openmmtools
``AlanineDipeptideVacuum(constraints=None)`` prmtop Hamiltonian that made the reference data to
about 1e-4 kJ/mol (tested against the stored energies).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

from flows.bijections.circular import CircularReflection
from flows.bijections.internal_coordinates import InternalCoordinates, dihedral
from flows.data.files import data_file
from flows.targets.openmm import OpenMMTarget, import_openmm

__all__ = ["AlanineDipeptide"]

# (residue, [(name, element), ...]) in the openmmtools atom order; names are those of amber96.xml.
_RESIDUES = (
    ("ACE", (("HH31", "H"), ("CH3", "C"), ("HH32", "H"), ("HH33", "H"), ("C", "C"), ("O", "O"))),
    (
        "ALA",
        (
            ("N", "N"), ("H", "H"), ("CA", "C"), ("HA", "H"), ("CB", "C"),
            ("HB1", "H"), ("HB2", "H"), ("HB3", "H"), ("C", "C"), ("O", "O"),
        ),
    ),
    ("NME", (("N", "N"), ("H", "H"), ("CH3", "C"), ("HH31", "H"), ("HH32", "H"), ("HH33", "H"))),
)  # fmt: skip
_BONDS = (
    (0, 1), (1, 2), (1, 3), (1, 4), (4, 5), (4, 6), (6, 7), (6, 8), (8, 9), (8, 10), (10, 11),
    (10, 12), (10, 13), (8, 14), (14, 15), (14, 16), (16, 17), (16, 18), (18, 19), (18, 20), (18, 21),
)  # fmt: skip
PHI_ATOMS = (4, 6, 8, 14)
PSI_ATOMS = (6, 8, 14, 16)

# Frame CA, N, C; then each placed atom (atom, bond, angle, torsion reference). The CB row
# (10, 8, 6, 14) is the improper CB-CA-N-C: stiff (about -124 degrees) and negative on every L
# configuration, so it alone carries the chirality. Methyl and carbonyl rows refer to a sibling
# atom, so their torsions are stiff offsets, not copies of a soft rotor.
Z_MATRIX = (
    (8,), (6, 8), (14, 8, 6),
    (4, 6, 8, 14), (1, 4, 6, 8), (5, 4, 6, 1), (0, 1, 4, 6), (2, 1, 4, 0), (3, 1, 4, 0),
    (7, 6, 8, 4), (9, 8, 6, 14), (10, 8, 6, 14), (11, 10, 8, 6), (12, 10, 8, 11), (13, 10, 8, 11),
    (16, 14, 8, 6), (15, 14, 8, 16), (18, 16, 14, 8), (17, 16, 14, 18),
    (19, 18, 16, 14), (20, 18, 16, 19), (21, 18, 16, 19),
)  # fmt: skip
CHIRAL_ROW = (10, 8, 6, 14)

# An L configuration (a 300 K MD frame, nm, 4 decimals) used as a default starting structure.
_POSITIONS = (
    (0.8318, 0.5712, 0.1237), (0.7222, 0.5608, 0.1491), (0.6827, 0.6647, 0.1529), (0.7043, 0.5231, 0.249),
    (0.6455, 0.4936, 0.039), (0.7076, 0.4552, -0.0583), (0.5162, 0.4683, 0.061), (0.4872, 0.5015, 0.1462),
    (0.4307, 0.3836, -0.0179), (0.4697, 0.3648, -0.1199), (0.4177, 0.2443, 0.0576), (0.4571, 0.2559, 0.1599),
    (0.3176, 0.2125, 0.0833), (0.4848, 0.1629, 0.0225), (0.2918, 0.4533, -0.0494), (0.1943, 0.4206, 0.0052),
    (0.302, 0.5533, -0.1436), (0.3884, 0.5816, -0.1895), (0.2018, 0.6626, -0.17), (0.2224, 0.7425, -0.0976),
    (0.2129, 0.692, -0.2751), (0.0998, 0.6203, -0.1708),
)  # fmt: skip

_REFERENCE_FILES = {300.0: "aldp_vacuum_300K_md.npz", 1000.0: "aldp_vacuum_1000K_md.npz"}


def _topology(app: Any) -> Any:
    top = app.Topology()
    chain = top.addChain()
    atoms = []
    for res_name, names in _RESIDUES:
        residue = top.addResidue(res_name, chain)
        for name, element in names:
            atoms.append(top.addAtom(name, app.Element.getBySymbol(element), residue))
    for i, j in _BONDS:
        top.addBond(atoms[i], atoms[j])
    return top


class AlanineDipeptide(OpenMMTarget):
    r"""Alanine dipeptide (22 atoms, 66 Cartesian coordinates in nm) at temperature ``T``.

    AMBER ff96 in vacuum or with OBC1 implicit solvent, no cutoff, no constraints (see the module
    docstring); :math:`u = E/(RT)`. The reference data of the vacuum system (MD at 300 K and
    1000 K) are read with :meth:`reference_samples`; :meth:`internal_coordinates` gives the
    Z-matrix bijection in which the CB improper alone carries the chirality.

    Args:
        solvent: ``"vacuum"`` or ``"implicit"`` (OBC1 generalised Born).
        temperature: temperature in kelvin.
        platform, threads, check_units: as :class:`OpenMMTarget`.

    Raises:
        ValueError: for another ``solvent``.

    Example:
        >>> target = AlanineDipeptide()  # doctest: +SKIP
        >>> target.energy(target.positions0)  # u of the built-in L structure, in kT  # doctest: +SKIP
    """

    phi_atoms, psi_atoms, z_matrix = PHI_ATOMS, PSI_ATOMS, Z_MATRIX

    def __init__(
        self,
        solvent: str = "vacuum",
        temperature: float = 300.0,
        *,
        platform: str = "Reference",
        threads: int = 1,
        check_units: bool = True,
    ) -> None:
        files = {"vacuum": ("amber96.xml",), "implicit": ("amber96.xml", "implicit/obc1.xml")}
        if solvent not in files:
            raise ValueError(f"AlanineDipeptide: expected solvent 'vacuum' or 'implicit', got {solvent!r}")
        import_openmm()
        from openmm import app

        forcefield = app.ForceField(*files[solvent])
        system = forcefield.createSystem(
            _topology(app), nonbondedMethod=app.NoCutoff, constraints=None, rigidWater=False
        )
        super().__init__(system, temperature, platform=platform, threads=threads, check_units=check_units)
        self.solvent = solvent

    @property
    def positions0(self) -> Tensor:
        """A built-in L configuration ``(66,)`` in nm (in the target's dtype)."""
        return torch.tensor(_POSITIONS, dtype=self._anchor.dtype).flatten()

    def phi_psi(self, x: Tensor) -> Tensor:
        r"""Backbone torsions :math:`(\phi, \psi)` in radians, shape ``(*batch, 2)``."""
        pos = self._flat(x).unflatten(-1, (self.n_atoms, 3))
        return torch.stack([dihedral(*(pos[..., a, :] for a in atoms)) for atoms in (PHI_ATOMS, PSI_ATOMS)], -1)

    def internal_coordinates(self, **kwargs: Any) -> InternalCoordinates:
        """The :class:`~flows.bijections.InternalCoordinates` of :data:`Z_MATRIX` (keyword options passed on).

        The CB torsion is declared chiral with sign −1 (the L form), so its domain is (−π, 0).
        """
        kwargs.setdefault("chirality", {CHIRAL_ROW[0]: -1})
        return InternalCoordinates(Z_MATRIX, **kwargs)

    def backbone_reflection(self, ic: InternalCoordinates) -> CircularReflection:
        r"""The move :math:`(\phi, \psi) \to (-\phi, -\psi)` in the coordinates of ``ic`` (other entries unchanged).

        It carries the :math:`\alpha_R` and C7eq minima of basin A onto :math:`\alpha_L` and C7ax of
        basin B (the mirror images of the backbone), with log-det 0: a mode-jumping move for
        :class:`~flows.train.ImportanceForwardKL`, which lets a flow trained on basin-A frames learn
        basin B from the energy.

        Args:
            ic: this molecule's internal coordinates (:meth:`internal_coordinates`), with :math:`\phi`
                and :math:`\psi` on the circle (choose ``linear_torsions`` below their spread).

        Raises:
            ValueError: for internal coordinates of another Z-matrix, or with φ or ψ cut open.
        """
        if tuple(map(tuple, ic.z_matrix)) != Z_MATRIX:
            raise ValueError("AlanineDipeptide.backbone_reflection: expected the internal coordinates of Z_MATRIX")
        placed = [row[0] for row in Z_MATRIX[3:]]
        index = [ic.torsions.start + placed.index(atom) for atom in (PHI_ATOMS[0], PSI_ATOMS[-1])]
        features = ic.event_shape_out[-1]
        mask = torch.zeros(features, dtype=torch.bool)
        mask[index] = True
        if not bool(ic.circular[mask].all()):
            raise ValueError(
                "AlanineDipeptide.backbone_reflection: expected φ and ψ on the circle, got them cut open "
                "(choose linear_torsions below their spread)"
            )
        axis = torch.zeros(features)
        axis[: len(ic.loc)] = -ic.loc  # z = wrap(q - loc) on the circle, so q -> -q is z -> wrap(-2 loc - z)
        return CircularReflection(features, axis=axis, circular=mask)

    def reference_samples(
        self, split: str = "test", data_dir: str | os.PathLike | None = None, *, dtype: torch.dtype | None = None
    ) -> Tensor:
        """MD frames ``(N, 66)`` (nm, uncentred) of the vacuum system at 300 K or 1000 K from the data directory.

        Raises:
            ValueError: for the implicit solvent or another temperature (no reference file), or an unknown split.
            FileNotFoundError: when the file is missing.
        """
        name = _REFERENCE_FILES.get(self.temperature)
        if self.solvent != "vacuum" or name is None:
            raise ValueError(
                "AlanineDipeptide: expected solvent='vacuum' and temperature 300 or 1000 for reference samples, "
                f"got solvent={self.solvent!r}, temperature={self.temperature}"
            )
        with np.load(data_file(name, data_dir)) as arrays:
            if split not in ("train", "val", "test"):
                raise ValueError(f"AlanineDipeptide: expected split 'train', 'val' or 'test', got {split!r}")
            x = torch.from_numpy(np.asarray(arrays[split], dtype=np.float64))
        return x.to(dtype or self._anchor.dtype)

    def extra_repr(self) -> str:
        return f"solvent={self.solvent!r}, " + super().extra_repr()
