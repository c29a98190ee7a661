r"""Dequantization of discrete data into the unit cube.

Uniform dequantization maps integer levels :math:`v \in \{0, \dots, K-1\}^D` to
:math:`x = (v + u)/K` with :math:`u \sim \mathcal U[0, 1)^D`. For any density :math:`p` on
:math:`[0, 1]^D`, Jensen's inequality gives a lower bound on the discrete log-likelihood,

.. math:: \log P(v) \ge \mathbb E_u[\log p((v + u)/K)] - D \log K,

which :func:`flows.metrics.bits_per_dim` turns into bits per dimension.

References:
    Theis, van den Oord, Bethge (2016), "A note on the evaluation of generative models", ICLR,
    arXiv:1511.01844.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["uniform_dequantize"]


def uniform_dequantize(
    levels_data: Tensor, levels: int, *, generator: torch.Generator | None = None, dtype: torch.dtype | None = None
) -> Tensor:
    """Map integer data in ``0..levels-1`` to ``(v + u) / levels`` in ``[0, 1)`` with uniform noise ``u``.

    Args:
        levels_data: integer-valued tensor (any integer or float dtype holding integers).
        levels: number of discrete levels ``K``.
        generator: random generator for the noise.
        dtype: floating dtype of the result (default: the default dtype).

    Raises:
        ValueError: if values fall outside ``0..levels-1``.

    Example:
        >>> import torch
        >>> x = uniform_dequantize(torch.tensor([0, 16]), 17)
        >>> bool((x >= 0).all() and (x < 1).all())
        True
    """
    dtype = dtype or torch.get_default_dtype()
    v = levels_data.to(dtype)
    if v.numel() and (float(v.min()) < 0 or float(v.max()) > levels - 1):
        raise ValueError(
            f"uniform_dequantize: expected values in 0..{levels - 1}, got values in "
            f"[{float(v.min()):g}, {float(v.max()):g}]"
        )
    u = torch.rand(v.shape, generator=generator, dtype=dtype, device=v.device)
    return (v + u) / levels
