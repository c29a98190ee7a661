"""Data files outside the repository: a data directory, checksum verification and downloads.

Real data sets are never part of the repository. They are read from a data directory given as an
argument or by the ``FLOWS_DATA_DIR`` environment variable, and every known file is checked
against its SHA-256 before use. :func:`download` fetches a file from its canonical address for
users who are online; without a network it fails quickly with a message saying where to put the file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KNOWN_FILES", "DataFile", "data_dir", "data_file", "download", "sha256sum"]

ENV_VAR = "FLOWS_DATA_DIR"


@dataclass(frozen=True)
class DataFile:
    """A known data file: accepted SHA-256 digests, a canonical download address and a description."""

    name: str
    sha256: tuple[str, ...]
    description: str
    url: str | None = None


KNOWN_FILES: dict[str, DataFile] = {
    f.name: f
    for f in (
        DataFile(
            "mnist.npz",
            (
                "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64",
                # the Keras distribution of the same arrays (same keys, different compression)
                "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1",
            ),
            "MNIST (LeCun, Cortes, Burges): x_train (60000, 28, 28) uint8, y_train, x_test, y_test",
            "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz",
        ),
        DataFile(
            "miniboone_maf_valtest.npz",
            ("c41fdb2ce15ed431b1343ddf243878ec3fd20f96f9db243b9f3cf147ac254c2a",),
            "MiniBooNE after MAF preprocessing (Papamakarios et al. 2017): val (3284, 43), test (3648, 43)",
        ),
        DataFile(
            "dw4_reference_samples.npz",
            ("b93d80f9a17cd66ef0965253b99663bb117a3eb018ffd6e20af092bb32c71b58",),
            "DW4 reference samples (Klein et al. 2023): train, val, test (N, 8), not centred",
        ),
        DataFile(
            "lj13_reference_samples.npz",
            ("6012ba5ea5bb96e0c5a444cdbcb97ea897fea5356171eec1bf6d43ccd8390d5d",),
            "LJ13 reference samples (Klein et al. 2023): val, test (N, 39), centred",
        ),
        DataFile(
            "aldp_vacuum_300K_md.npz",
            ("4187727eef13e5cbd282bbc0ee98d4cb937a4af6c0989f28eee73a581cba1b8f",),
            "alanine dipeptide, vacuum ff96, 300 K MD: train (40000, 66), val, test (5000, 66) nm; energy_kT_*",
        ),
        DataFile(
            "aldp_vacuum_1000K_md.npz",
            ("298cf99cc0d446ee754cf8ca3a25457938625ad4e5e3412ac1387d6adaceb641",),
            "alanine dipeptide, vacuum ff96, 1000 K MD: train (16000, 66), val, test (2000, 66) nm; energy_kT_*",
        ),
        DataFile(
            "aldp_vacuum_300K_umbrella.npz",
            ("0c3f6458a81ae6b84177fc5920349956f5ec6ce3494938564030581c9901b681",),
            "alanine dipeptide, vacuum ff96, 300 K umbrella sampling on phi with MBAR log_weights, F_phi_kT, dF_kT",
        ),
    )
}

_VERIFIED: dict[tuple[str, int, int], str] = {}


def data_dir(path: str | os.PathLike | None = None) -> Path:
    """Resolve the data directory: ``path`` if given, else ``$FLOWS_DATA_DIR``.

    Raises:
        FileNotFoundError: if neither is set or the directory does not exist.
    """
    if path is None:
        path = os.environ.get(ENV_VAR)
        if not path:
            raise FileNotFoundError(
                f"no data directory: pass data_dir=... or set the {ENV_VAR} environment variable "
                "to the folder holding the data files"
            )
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"data directory {str(directory)!r} does not exist")
    return directory


def sha256sum(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def data_file(name: str, data_dir_: str | os.PathLike | None = None, *, verify: bool = True) -> Path:
    """Path of a known data file in the data directory, checksum-verified.

    Args:
        name: file name (a key of :data:`KNOWN_FILES`, or any file when ``verify=False``).
        data_dir_: the data directory (default: ``$FLOWS_DATA_DIR``).
        verify: check the SHA-256 against the known digests (cached per process by size and mtime).

    Raises:
        FileNotFoundError: naming the expected file and directory when it is missing.
        ValueError: when the file's checksum is not the expected one (corrupt or different file).
    """
    directory = data_dir(data_dir_)
    path = directory / name
    info = KNOWN_FILES.get(name)
    if not path.is_file():
        how = f"; download it with flows.data.download({name!r})" if info and info.url else ""
        what = f" ({info.description})" if info else ""
        raise FileNotFoundError(f"expected the data file {name!r}{what} in {str(directory)!r}, it is not there{how}")
    if verify:
        if info is None:
            raise ValueError(f"no known checksum for {name!r}; pass verify=False to read it unchecked")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        digest = _VERIFIED.get(key) or sha256sum(path)
        if digest not in info.sha256:
            raise ValueError(
                f"checksum mismatch for {str(path)!r}: expected sha256 {info.sha256[0]}, got {digest} "
                "(the file is corrupt or not the expected one)"
            )
        _VERIFIED[key] = digest
    return path


def download(
    name: str, data_dir_: str | os.PathLike | None = None, *, url: str | None = None, timeout: float = 30.0
) -> Path:
    """Download a known file to the data directory, verify its checksum and move it into place atomically.

    Raises:
        ValueError: for a file with no known download address (and none given) or a bad checksum.
        RuntimeError: when the download fails (no network, refused, timed out), saying where to put
            the file by hand.
    """
    directory = data_dir(data_dir_)
    info = KNOWN_FILES.get(name)
    url = url or (info.url if info else None)
    if url is None:
        raise ValueError(f"no public download address is known for {name!r}; place the file in {str(directory)!r}")
    target = directory / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            while block := response.read(1 << 20):
                out.write(block)
        if info is not None:
            digest = sha256sum(tmp)
            if digest not in info.sha256:
                raise ValueError(f"downloaded {url} has sha256 {digest}, expected {info.sha256[0]}")
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        raise RuntimeError(
            f"could not download {name!r} from {url}: {error}; without a network, copy the file to "
            f"{str(target)!r} by hand"
        ) from error
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
