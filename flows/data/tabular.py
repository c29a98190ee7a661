"""Tabular data: scikit-learn's shipped tables, user CSV, ``.npy`` and ``.npz`` files, and MiniBooNE.

Every loader returns ``float32`` tensors of shape ``(N, D)`` and checks that the values are finite.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from flows.data.files import data_file

__all__ = ["SKLEARN_TABLES", "load_array", "load_csv", "load_miniboone", "load_sklearn_table"]

SKLEARN_TABLES = ("iris", "wine", "breast_cancer", "diabetes")
"""The real tabular data sets shipped inside scikit-learn's wheel (no download)."""


def _finite(array: np.ndarray, what: str) -> Tensor:
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{what}: expected numeric values, got dtype {array.dtype}")
    array = np.asarray(array, dtype=np.float32)
    bad = ~np.isfinite(array)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{what}: expected finite values, got {int(bad.sum())} NaN/Inf/missing value(s), the first at {where}"
        )
    return torch.from_numpy(np.ascontiguousarray(array))


def load_sklearn_table(name: str) -> Tensor:
    """The feature matrix of one of scikit-learn's shipped tables (:data:`SKLEARN_TABLES`).

    Raises:
        ValueError: for an unknown name.
        ImportError: without scikit-learn.

    Example:
        >>> load_sklearn_table("iris").shape
        torch.Size([150, 4])
    """
    if name not in SKLEARN_TABLES:
        raise ValueError(f"load_sklearn_table: expected one of {SKLEARN_TABLES}, got {name!r}")
    try:
        import sklearn.datasets
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f'the {name!r} table ships with scikit-learn: pip install "flows[examples]"') from error
    return _finite(getattr(sklearn.datasets, f"load_{name}")().data, name)


def csv_columns(path: str | os.PathLike, *, delimiter: str = ",") -> tuple[str, ...] | None:
    """The column names of a CSV file's header row, or ``None`` when its first row is numeric (no header)."""
    with open(path, encoding="utf-8") as handle:
        cells = tuple(c.strip() for c in handle.readline().split(delimiter))
    try:
        [float(c) for c in cells]
    except ValueError:
        return cells
    return None


def load_csv(path: str | os.PathLike, *, delimiter: str = ",") -> Tensor:
    """A numeric CSV file as ``(N, D)``; a first row that is not numeric is taken as a header.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for non-numeric cells, ragged rows or missing values.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    cells = [c.strip() for c in first.split(delimiter)]
    try:
        [float(c) for c in cells]
        skip = 0
    except ValueError:
        skip = 1
    try:
        array = np.loadtxt(path, delimiter=delimiter, skiprows=skip, ndmin=2, dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"{str(path)!r}: expected a numeric CSV table, got: {error}") from error
    return _finite(array, str(path))


def load_array(path: str | os.PathLike, key: str | None = None) -> Tensor | dict[str, Tensor]:
    """Read ``.npy``, ``.npz`` or ``.csv`` data.

    An ``.npz`` file gives the array named ``key``; without a key, its only array, or a dict of
    the arrays named ``train``/``val``/``test`` when it has a ``train`` or ``test`` array (ready-made splits).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for an unknown suffix, a missing key, an ambiguous ``.npz`` or non-finite values.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_csv(path)
    if suffix == ".npy":
        return _finite(np.load(path, allow_pickle=False), str(path))
    if suffix != ".npz":
        raise ValueError(f"expected a .csv, .npy or .npz file, got {str(path)!r}")
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.keys())
        if key is not None:
            if key not in names:
                raise ValueError(f"{str(path)!r}: expected an array named {key!r}, it has {names}")
            return _finite(archive[key], f"{path.name}[{key}]")
        splits = [n for n in ("train", "val", "test") if n in names]
        if "train" in splits or "test" in splits:
            return {n: _finite(archive[n], f"{path.name}[{n}]") for n in splits}
        if len(names) != 1:
            raise ValueError(f"{str(path)!r} holds several arrays {names}; choose one with key=...")
        return _finite(archive[names[0]], f"{path.name}[{names[0]}]")


def load_miniboone(data_dir: str | os.PathLike | None = None) -> dict[str, Tensor]:
    """MiniBooNE after the MAF preprocessing (validation and test splits only), checksum-verified.

    Only the standard *validation* (3284 × 43) and *test* (3648 × 43) splits are available; the
    training split is not. Results trained on ``val`` are **not comparable** to published MINIBOONE
    numbers (which use 9× more training data).

    Args:
        data_dir: the data directory (default ``$FLOWS_DATA_DIR``).

    Returns:
        ``{"val": (3284, 43), "test": (3648, 43)}`` float32 tensors.
    """
    path = data_file("miniboone_maf_valtest.npz", data_dir)
    with np.load(path, allow_pickle=False) as archive:
        return {name: _finite(archive[name], f"MiniBooNE {name}") for name in ("val", "test")}
