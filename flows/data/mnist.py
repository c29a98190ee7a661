"""MNIST (60,000 + 10,000 handwritten digits, 28×28, 256 grey levels) read from the data directory."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from flows.data.files import data_file

__all__ = ["MNIST_LEVELS", "load_mnist"]

MNIST_LEVELS = 256
"""Number of grey levels of MNIST (integer values 0..255)."""

_FILE = "mnist.npz"


def load_mnist(
    data_dir: str | os.PathLike | None = None, *, image: bool = True, verify: bool = True, labels: bool = False
) -> tuple[Tensor, Tensor] | tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Load MNIST's standard train and test sets from ``mnist.npz`` in the data directory.

    The file (arrays ``x_train`` (60000, 28, 28), ``x_test`` (10000, 28, 28), uint8, and the labels)
    is looked up in ``data_dir`` or ``$FLOWS_DATA_DIR`` and checked against its known SHA-256 by
    :func:`flows.data.files.data_file`. Online users can fetch it with
    ``flows.data.download("mnist.npz")``.

    Args:
        data_dir: folder holding ``mnist.npz`` (default: ``$FLOWS_DATA_DIR``).
        image: return ``(N, 1, 28, 28)`` images instead of ``(N, 784)`` vectors.
        verify: check the checksum (cached per process).
        labels: also return the digit labels (``y_train``, ``y_test``).

    Returns:
        ``(train, test)`` grey levels in ``0..255`` as ``torch.uint8`` tensors. Wrap them in a
        ``torch.utils.data.TensorDataset`` for a ``DataLoader``; dequantize each batch with
        :func:`flows.data.uniform_dequantize` (``levels=MNIST_LEVELS``). With ``labels=True``:
        ``((train, train_labels), (test, test_labels))``, the labels ``0..9`` as ``torch.int64`` ``(N,)``.

    Raises:
        FileNotFoundError: naming ``mnist.npz`` and the directory when the file or the directory is missing.
        ValueError: when the checksum does not match, or the file lacks the expected arrays (the
            labels ``y_train``, ``y_test`` too when asked for).

    Example:
        The file must be in the data directory (the real load is skipped here: it needs ``$FLOWS_DATA_DIR``):

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as empty:
        ...     load_mnist(empty)
        Traceback (most recent call last):
        FileNotFoundError: expected the data file 'mnist.npz' (MNIST ...) in '...', it is not there; ...
        >>> train, test = load_mnist()  # doctest: +SKIP
        >>> train.shape, test.shape, train.dtype  # doctest: +SKIP
        (torch.Size([60000, 1, 28, 28]), torch.Size([10000, 1, 28, 28]), torch.uint8)
    """
    path = data_file(_FILE, data_dir, verify=verify)
    with np.load(path) as arrays:
        wanted = {"x_train", "x_test"} | ({"y_train", "y_test"} if labels else set())
        missing = wanted - set(arrays.files)
        if missing:
            raise ValueError(f"expected arrays {sorted(wanted)} in {str(path)!r}, missing {sorted(missing)}")
        train, test = arrays["x_train"], arrays["x_test"]
        targets = [np.asarray(arrays[name]) for name in ("y_train", "y_test")] if labels else []
    out = []
    for name, a in (("x_train", train), ("x_test", test)):
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[1:] != (28, 28):
            raise ValueError(f"expected {name} of shape (N, 28, 28) and dtype uint8, got {a.shape} {a.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(a))
        out.append(t.reshape(-1, 1, 28, 28) if image else t.reshape(-1, 784))
    if not labels:
        return out[0], out[1]
    ys = []
    for images, y, name in zip(out, targets, ("y_train", "y_test"), strict=True):
        if y.shape != (len(images),) or y.dtype.kind not in "iu" or (y.size and not 0 <= y.min() <= y.max() <= 9):
            raise ValueError(
                f"expected {name} of shape ({len(images)},) holding integers 0..9, got {y.shape} {y.dtype}"
            )
        ys.append(torch.from_numpy(y.astype(np.int64)))
    return (out[0], ys[0]), (out[1], ys[1])
