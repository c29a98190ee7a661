"""Density metrics: bits per dimension for dequantized discrete data."""

from __future__ import annotations

import math

from torch import Tensor

from flows._validation import check_count, check_samples

__all__ = ["bits_per_dim"]


def bits_per_dim(log_prob: Tensor, dims: int, levels: int) -> Tensor:
    r"""Bits per dimension of discrete data from the log-density of its dequantized version.

    For data with ``levels`` grey levels dequantized to ``[0, 1]^D`` (see
    :func:`flows.data.uniform_dequantize`) with log-density :math:`\log p(x)` (nats, including any
    preprocessing log-determinant such as a logit layer inside the flow),

    .. math:: \text{bpd} = -\frac{\log p(x) - D \log K}{D \ln 2},

    an upper bound on the discrete negative log-likelihood in bits per dimension.

    Args:
        log_prob: log-density in nats of dequantized samples in ``[0, 1]^D`` (any shape).
        dims: number of dimensions ``D`` of one sample.
        levels: number of discrete levels ``K`` (256 for 8-bit images, 17 for the digits).

    Returns:
        bits per dimension, the shape of ``log_prob`` (NaN where ``log_prob`` is NaN).

    Raises:
        TypeError: for a non-tensor ``log_prob`` or non-integer ``dims``/``levels``.
        ValueError: for an empty ``log_prob``, ``dims < 1`` or ``levels < 2``.

    Example:
        >>> import torch
        >>> bits_per_dim(torch.tensor(0.0), dims=4, levels=256).item()  # uniform density: 8 bits
        8.0
    """
    log_prob = check_samples(log_prob, "bits_per_dim", "log_prob")
    check_count("bits_per_dim", "dims", dims)
    check_count("bits_per_dim", "levels", levels, minimum=2)
    return -(log_prob - dims * math.log(levels)) / (dims * math.log(2))
