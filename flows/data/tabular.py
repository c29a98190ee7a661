"""Tabular data: scikit-learn's shipped tables, user CSV, ``.npy`` and ``.npz`` files, and MiniBooNE.

Every loader returns ``float32`` tensors of shape ``(N, D)`` and checks that there is at least one
value and that every value is finite and either 0 or of a magnitude between :data:`SMALLEST` and
:data:`LARGEST`: one rule, the values whose squares float32 holds (standardising, Gaussian
log-densities and gradients square them; a larger value overflows to inf, a smaller one such as
1e-300 is flushed to zero or loses its digits in float32). The first bad value is named by its
file line and column (CSV) or array index.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from flows.data.files import data_file

__all__ = ["LARGEST", "SKLEARN_TABLES", "SMALLEST", "load_array", "load_csv", "load_miniboone", "load_sklearn_table"]

SKLEARN_TABLES = ("iris", "wine", "breast_cancer", "diabetes")
"""The real tabular data sets shipped inside scikit-learn's wheel (no download)."""


LARGEST = float(np.sqrt(np.finfo(np.float32).max))
"""Largest magnitude accepted in data (about 1.8e19): squares of larger values overflow float32,
so training and standardising on them give inf/NaN losses and silently skipped batches."""

SMALLEST = 1.0 / LARGEST
"""Smallest non-zero magnitude accepted in data (about 5.4e-20): squares of smaller values underflow
float32 (and values below about 1.2e-38 are flushed to zero or lose digits on conversion), so a column of
them would be standardised by a zero scale or silently become a column of zeros."""


def _finite(array: np.ndarray, what: str, *, row_offset: int | None = None) -> Tensor:
    """``array`` as a float32 tensor, refusing non-numeric, non-finite and overflowing values.

    Args:
        array: the loaded values.
        what: the source, for messages (a path or ``name[key]``).
        row_offset: for text files, the number of lines before the first data row; the first bad
            value is then named by its file line, else by its array index.
    """
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{what}: expected numeric values, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(f"{what}: expected at least one row of values, got an empty array of shape {array.shape}")
    wide = np.asarray(array, dtype=np.float64)
    for bad, expected, got in (
        (~np.isfinite(wide), "finite values", "NaN/Inf/missing value(s)"),
        (np.abs(np.nan_to_num(wide)) > LARGEST, f"values of magnitude at most {LARGEST:.2g}", "larger value(s)"),
        (
            (wide != 0) & (np.abs(np.nan_to_num(wide)) < SMALLEST),
            f"0 or values of magnitude at least {SMALLEST:.2g} (float32 training squares them)",
            "smaller non-zero value(s)",
        ),
    ):
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            if row_offset is not None and wide.ndim == 2:
                where = f"line {index[0] + row_offset + 1}, column {index[1] + 1} (value {float(wide[index])!r})"
            else:
                where = f"index {index} (value {float(wide[index])!r})"
            raise ValueError(f"{what}: expected {expected}, got {int(bad.sum())} {got}, the first at {where}")
    return torch.from_numpy(np.ascontiguousarray(wide, dtype=np.float32))


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
    path = _existing_file(path)
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline()
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r}: expected a UTF-8 text CSV file, got bytes that are not text") from error
    if not first.strip():
        raise ValueError(f"{str(path)!r}: expected a CSV table with at least one row of numbers, got an empty file")
    cells = [c.strip() for c in first.split(delimiter)]
    try:
        [float(c) for c in cells]
        skip = 0
    except ValueError:
        skip = 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": reported below
            array = np.loadtxt(path, delimiter=delimiter, skiprows=skip, ndmin=2, dtype=np.float64)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{str(path)!r}: expected a numeric CSV table, got: {error}") from error
    if array.size == 0:
        raise ValueError(f"{str(path)!r}: expected at least one row of numbers below the header, got none")
    return _finite(array, str(path), row_offset=skip)


def _existing_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"expected a data file, got the directory {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {str(path)!r}")
    return path


def _load_numpy(path: Path) -> np.ndarray | np.lib.npyio.NpzFile:
    """``np.load`` without pickles, with the file named in every error about its content."""
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as error:
        kind = "an .npz archive" if path.suffix.lower() == ".npz" else "a .npy array"
        reason = str(error).split(".")[0] if "pickle" in str(error) else str(error)
        raise ValueError(
            f"{str(path)!r}: expected {kind} of numbers (no Python objects), got a file numpy cannot read that way "
            f"({reason})"
        ) from error


def load_array(path: str | os.PathLike, key: str | None = None) -> Tensor | dict[str, Tensor]:
    """Read ``.npy``, ``.npz`` or ``.csv`` data.

    An ``.npz`` file gives the array named ``key``; without a key, its only array, or a dict of
    the arrays named ``train``/``val``/``test`` when it has a ``train`` or ``test`` array (ready-made splits).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for an unknown suffix, a missing key, an ambiguous ``.npz`` or non-finite values.
    """
    path = _existing_file(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_csv(path)
    if suffix == ".npy":
        return _finite(_load_numpy(path), str(path))
    if suffix != ".npz":
        raise ValueError(f"expected a .csv, .npy or .npz file, got {str(path)!r}")
    with _load_numpy(path) as archive:
        names = list(archive.keys())
        if key is not None:
            if key not in names:
                raise ValueError(f"{str(path)!r}: expected an array named {key!r}, it has {names}")
            return _finite(_member(archive, key, path), f"{path.name}[{key}]")
        splits = [n for n in ("train", "val", "test") if n in names]
        if "train" in splits or "test" in splits:
            return {n: _finite(_member(archive, n, path), f"{path.name}[{n}]") for n in splits}
        if len(names) != 1:
            raise ValueError(f"{str(path)!r} holds several arrays {names}; choose one with key=...")
        return _finite(_member(archive, names[0], path), f"{path.name}[{names[0]}]")


def _member(archive: np.lib.npyio.NpzFile, name: str, path: Path) -> np.ndarray:
    try:
        return archive[name]
    except (ValueError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise ValueError(
            f"{str(path)!r}: expected the array {name!r} to hold numbers (no Python objects), got an unreadable one "
            f"({str(error).split('.')[0]})"
        ) from error


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
