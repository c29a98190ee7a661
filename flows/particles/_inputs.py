"""The one input check of the public :mod:`flows.particles` functions: flat configurations ``(..., n·d)``."""

from __future__ import annotations

import torch
from torch import Tensor

from flows._validation import check_samples
from flows.nn._particles import _check_sizes

__all__ = ["check_configurations", "non_finite_rows"]


def check_configurations(
    x: object,
    who: str,
    what: str,
    n_particles: int,
    spatial_dim: int,
    *,
    ndim: int | None = 2,
    nan: str = "propagate",
    empty_batch: bool = True,
) -> Tensor:
    """Flat configurations ``(N, n·d)`` (or ``(*batch, n·d)`` with ``ndim=None``) as a real floating tensor.

    :func:`flows._validation.check_samples` (tensor, real, bool/int promoted to float64, no empty
    dimension except zero rows when ``empty_batch``) plus the particle sizes and the width ``n·d``.
    ``nan="refuse"`` also refuses infinite values (an assignment or a coupling has no answer for
    them); ``"propagate"`` leaves them for the caller, which gives NaN rows out.

    Raises:
        TypeError: for a non-tensor or complex input.
        ValueError: for bad sizes, a wrong rank or width, empty dimensions, or refused NaN/Inf.
    """
    _check_sizes(n_particles, spatial_dim, who)
    features = n_particles * spatial_dim
    layout = f"(N, {features})" if ndim == 2 else f"(*batch, {features})"
    inf = "refuse" if nan == "refuse" else "allow"
    x = check_samples(x, who, what, layout=layout, ndim=ndim, min_ndim=1, nan=nan, inf=inf, empty_batch=empty_batch)
    if x.shape[-1] != features:
        raise ValueError(
            f"{who}: expected {what} of shape {layout} for {n_particles} particles in {spatial_dim} dimensions, "
            f"got {tuple(x.shape)}"
        )
    return x


def non_finite_rows(*tensors: Tensor) -> Tensor:
    """Rows (first dimension, broadcast) of the given ``(N, ...)`` tensors that hold a NaN or infinite value."""
    rows = [~torch.isfinite(t).flatten(1).all(1) for t in tensors]
    out = rows[0]
    for r in rows[1:]:
        out = out | r
    return out
