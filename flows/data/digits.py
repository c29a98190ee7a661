"""scikit-learn's handwritten digits (1797 images of 8×8 pixels, 17 grey levels), shipped inside its wheel."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DIGITS_LEVELS", "load_digits"]

DIGITS_LEVELS = 17
"""Number of grey levels of the digits data (integer values 0..16)."""


def load_digits(
    *, test_size: float = 0.2, seed: int = 0, image: bool = False, labels: bool = False
) -> tuple[Tensor, Tensor] | tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Load the digits and split them with ``train_test_split(test_size=test_size, random_state=seed)``.

    Args:
        test_size: fraction of the 1797 images held out for testing.
        seed: ``random_state`` of the split (0 gives the split used by the benchmarks).
        image: return ``(N, 1, 8, 8)`` images instead of ``(N, 64)`` vectors.
        labels: also return the digit labels, split alike.

    Returns:
        ``(train, test)`` integer grey levels in ``0..16`` as ``torch.uint8`` tensors; with
        ``labels=True``, ``((train, train_labels), (test, test_labels))``, the labels ``0..9`` as
        ``torch.int64`` ``(N,)`` (the same split: the images are those of ``labels=False``).

    Raises:
        ImportError: if scikit-learn is not installed (``pip install "flows[examples]"``).

    Example:
        >>> train, test = load_digits()
        >>> train.shape, test.shape, int(train.max())
        (torch.Size([1437, 64]), torch.Size([360, 64]), 16)
    """
    try:
        from sklearn.datasets import load_digits as sk_load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "flows.data.load_digits needs scikit-learn, which ships the digits data: "
            'pip install "flows[examples]" (or pip install scikit-learn)'
        ) from error
    digits = sk_load_digits()
    data = digits.data.astype("uint8")
    if labels:
        train, test, y_train, y_test = train_test_split(data, digits.target, test_size=test_size, random_state=seed)
    else:
        train, test = train_test_split(data, test_size=test_size, random_state=seed)
    train, test = torch.from_numpy(train), torch.from_numpy(test)
    if image:
        train, test = train.reshape(-1, 1, 8, 8), test.reshape(-1, 1, 8, 8)
    if not labels:
        return train, test
    y_train, y_test = (torch.from_numpy(y.astype("int64")) for y in (y_train, y_test))
    return (train, y_train), (test, y_test)
