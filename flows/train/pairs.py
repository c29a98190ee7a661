r"""Data–latent pairs :math:`(x_i, z_i)` for regression-trained flows: from a teacher flow, or from optimal transport.

A flow trained by regression (:class:`~flows.train.PairRegression`) learns a map that sends each
base sample :math:`z_i` to its partner :math:`x_i`. Pairs are ``(x, z)``, data side first, as
everywhere in the library (couplings of flow matching, ``forward_and_log_det``). The pairs must
come from a coupling whose
:math:`z`-marginal is the student's base distribution and whose :math:`x`-marginal is the target,
and that is (close to) deterministic, :math:`x = \Phi(z)`, so that the regression has an exact
solution:

* :func:`teacher_pairs`: :math:`z \sim p_Z`, :math:`x = \Phi(z)` with :math:`\Phi` the sampling map
  of a trained flow (typically a continuous normalizing flow: its inverse integrates the ODE from
  the latent to the data side). The pairs are exact samples of a deterministic coupling, and a
  student that fits them has the teacher's density;
* :func:`ot_pairs`: base samples and target samples (e.g. exact samples, MD data) matched by the
  exact optimal assignment for the squared distance on mini-batches (:func:`ot_assignment`). The
  mini-batch coupling approaches the optimal-transport map as the batch grows; at a finite batch
  it is random, and the regression learns its conditional mean (a blurred map).

References:
    Rehman, Davis, Lu, Tang, Bronstein, Bengio, Tong, Bose (2025), "FORT: Forward-Only Regression
    Training of Normalizing Flows" (also "Efficient Regression-based Training of Normalizing Flows
    for Boltzmann Generators", RegFlow), arXiv:2506.01158.
    Tong, Fatras, Malkin, Huguet, Zhang, Rector-Brooks, Wolf, Bengio (2024), "Improving and
    generalizing flow-based generative models with minibatch optimal transport", TMLR,
    arXiv:2302.00482 (mini-batch OT couplings).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from flows._validation import check_count, check_finite
from flows.flow import Flow, evaluating

__all__ = ["ot_assignment", "ot_pairs", "teacher_pairs"]


def _check_pair_tensors(a: Tensor, b: Tensor, who: str, names: tuple[str, str]) -> None:
    for t, name in zip((a, b), names, strict=True):
        if not isinstance(t, Tensor):
            raise TypeError(f"{who}: expected {name} to be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{who}: expected a floating-point {name}, got dtype {t.dtype}")
        if t.dim() < 2 or t.shape[0] == 0:
            raise ValueError(f"{who}: expected {name} of shape (N, *event) with N >= 1, got {tuple(t.shape)}")
        check_finite(t, who, name)
    if a.shape != b.shape:
        raise ValueError(
            f"{who}: expected {names[0]} and {names[1]} of the same shape (N, *event), "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def ot_assignment(x: Tensor, z: Tensor) -> Tensor:
    r"""The exact optimal assignment of ``z`` to ``x`` for the squared Euclidean cost.

    Returns the permutation :math:`\sigma` minimising :math:`\sum_i \|x_i - z_{\sigma(i)}\|^2`
    (the discrete optimal-transport plan between two empirical measures of equal size), by the
    Jonker–Volgenant algorithm of :func:`scipy.optimize.linear_sum_assignment` on the cost matrix
    computed in float64 (:math:`O(N^2 D)` memory-light distances, :math:`O(N^3)` time;
    measurements: ``docs/flow_maps.md``).

    Args:
        x: samples, shape ``(N, *event)`` (kept in place).
        z: samples of the same shape (reordered by ``sigma``).

    Returns:
        ``sigma``, a ``LongTensor`` of shape ``(N,)``: ``z[sigma]`` is paired with ``x``. The cost
        is symmetric, so ``ot_assignment(z, x)`` reorders ``x`` against ``z`` instead.

    Raises:
        TypeError: for non-tensors or non-floating dtypes.
        ValueError: for mismatched or empty shapes, or NaN/Inf values.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.0], [1.0], [2.0]])
        >>> ot_assignment(x, torch.tensor([[2.1], [-0.1], [0.9]])).tolist()
        [1, 2, 0]
    """
    _check_pair_tensors(x, z, "ot_assignment", ("x", "z"))
    a = x.detach().reshape(x.shape[0], -1).to("cpu", torch.float64)
    b = z.detach().reshape(z.shape[0], -1).to("cpu", torch.float64)
    cost = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square()
    from scipy.optimize import linear_sum_assignment  # imported on first use: keeps `import flows` fast

    rows, cols = linear_sum_assignment(cost.numpy())
    sigma = np.empty_like(cols)
    sigma[rows] = cols
    return torch.from_numpy(sigma).to(device=x.device, dtype=torch.long)


def ot_pairs(
    x: Tensor,
    z: Tensor,
    *,
    batch_size: int = 1024,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Pair base samples with target samples by exact optimal transport on mini-batches.

    The samples are cut into consecutive chunks of ``batch_size`` and within each chunk ``x`` is
    reordered by :func:`ot_assignment`, so that ``(x_paired[i], z[i])`` minimise the total squared
    distance of the chunk. With ``shuffle`` (default) ``x`` is first permuted at random, so that
    ordered data (an MD trajectory, samples sorted by mode) still gives every chunk the target
    marginal. Larger chunks give couplings closer to the optimal-transport map (and cost
    :math:`O(B^3)` each).

    Args:
        x: target samples, shape ``(N, *event)``.
        z: base samples (draws of the student's base distribution), the same shape.
        batch_size: chunk size ``B`` of the exact assignments.
        shuffle: permute ``x`` at random before chunking.
        generator: random generator of that permutation.

    Returns:
        ``(x_paired, z)``: ``x`` reordered and ``z`` unchanged, both ``(N, *event)``.

    Raises:
        TypeError: for non-tensors or non-floating dtypes.
        ValueError: for mismatched or empty shapes, NaN/Inf values or a non-positive batch size.

    Example:
        >>> import torch
        >>> z = torch.randn(64, 2)
        >>> xp, zp = ot_pairs(z.flip(0), z, batch_size=64)  # the same points in another order
        >>> torch.equal(xp, z)  # the optimal plan between identical point sets is the identity
        True
    """
    _check_pair_tensors(x, z, "ot_pairs", ("x", "z"))
    check_count("ot_pairs", "batch_size", batch_size)
    n = x.shape[0]
    if shuffle:
        x = x[torch.randperm(n, generator=generator).to(x.device)]
    paired = torch.empty_like(x)
    for start in range(0, n, batch_size):
        chunk = slice(start, min(start + batch_size, n))
        paired[chunk] = x[chunk][ot_assignment(z[chunk], x[chunk])]
    return paired, z


@torch.no_grad()
def teacher_pairs(
    teacher: Flow,
    n: int,
    *,
    context: Tensor | None = None,
    batch_size: int = 4096,
) -> tuple[Tensor, Tensor]:
    r"""Pairs :math:`(\Phi(z), z)` from a trained flow: base draws and their images under its sampling map.

    :math:`z \sim p_Z` (the teacher's base) and :math:`x = \Phi(z) = f^{-1}(z)`, computed with the
    teacher's tensor-only inverse (for a :class:`~flows.CNF`: the ODE integrated from the latent to
    the data side without the trace, at the teacher's tolerances), in eval mode, without
    gradients, in chunks of ``batch_size``. A student with the same base distribution that fits
    the pairs exactly has the teacher's density.

    Args:
        teacher: the trained flow (its base distribution is the student's).
        n: number of pairs.
        context: for a conditional teacher, one context row per pair, shape ``(n, context_features)``.
        batch_size: samples per chunk.

    Returns:
        ``(x, z)``, both of shape ``(n, *event_shape)``.

    Raises:
        TypeError: if ``teacher`` is not a :class:`~flows.Flow`.
        ValueError: for a non-positive ``n`` or ``batch_size``, a context of the wrong shape, or a
            teacher whose samples are not finite.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> teacher = Flow(Affine(2, shift=1.0, log_scale=0.5), StandardNormal(2))
        >>> x, z = teacher_pairs(teacher, 5)
        >>> torch.allclose(x, (z - 1.0) * torch.exp(torch.tensor(-0.5)))  # x = f⁻¹(z) = (z - t) e^{-s}
        True
    """
    if not isinstance(teacher, Flow):
        raise TypeError(f"teacher_pairs: expected a Flow as teacher, got {type(teacher).__name__}")
    check_count("teacher_pairs", "n", n)
    check_count("teacher_pairs", "batch_size", batch_size)
    if context is not None:
        if not isinstance(context, Tensor):
            raise TypeError(f"teacher_pairs: expected context to be a torch.Tensor, got {type(context).__name__}")
        if context.dim() != 2 or context.shape[0] != n:
            raise ValueError(
                f"teacher_pairs: expected a context of shape ({n}, context_features), got {tuple(context.shape)}"
            )
    zs, xs = [], []
    with evaluating(teacher):
        for start in range(0, n, batch_size):
            m = min(batch_size, n - start)
            c = None if context is None else context[start : start + m]
            z = teacher.base.sample((m,)) if c is None else teacher.base.sample((), c)
            zs.append(z)
            xs.append(teacher.transform.inverse(z, c))
    z, x = torch.cat(zs), torch.cat(xs)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"teacher_pairs: expected finite teacher samples, got {int((~torch.isfinite(x)).sum())} NaN/Inf values"
        )
    return x, z
