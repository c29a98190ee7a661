r"""Public correctness checks for transforms: run them on your own bijections.

:func:`check_bijection` verifies, on a batch of inputs:

1. shapes: the output has shape ``(*batch, *event_shape_out)`` and ``ladj`` has shape ``batch``;
2. fused vs separate calls: ``forward(x)`` equals the first output of ``forward_and_log_det(x)``
   (the same for the inverse);
3. round trips in both directions: ``f⁻¹(f(x)) = x`` and ``f(f⁻¹(z)) = z``;
4. the inverse log-determinant is minus the forward one at corresponding points;
5. ``ladj`` against :math:`\log|\det \partial f / \partial x|` computed from the full autograd
   Jacobian, per sample, in both directions (vector and image events alike, so a missing
   ``H·W`` factor is caught);
6. batch independence: the Jacobian of sample ``i`` with respect to sample ``j ≠ i`` is zero.

Run it in float64 (``transform.double()``) and away from the identity initialisation (perturb the
parameters): at the identity most log-determinant bugs are invisible.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from flows.bijections.base import Bijection

__all__ = ["BijectionCheckError", "autograd_log_det", "check_bijection", "perturb_parameters"]


class BijectionCheckError(AssertionError):
    """A transform failed a check of :func:`check_bijection`.

    The message names the check, the worst error, where it occurred and the tolerance.
    """


def _default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-7, 1e-7) if dtype == torch.float64 else (2e-3, 2e-3)


def autograd_log_det(fn: Callable[[Tensor], Tensor], x: Tensor, event_ndim: int) -> tuple[Tensor, Tensor]:
    r"""Per-sample :math:`\log|\det J|` of ``fn`` from the full autograd Jacobian.

    Args:
        fn: a function of a tensor ``(*batch, *event)`` returning ``(*batch, *event_out)`` with the
            same number of event entries.
        x: the input.
        event_ndim: number of event dimensions of ``x``.

    Returns:
        ``(ladj, coupling)``: the log-absolute-determinants of the per-sample Jacobian blocks (shape
        ``batch``) and the largest absolute Jacobian entry between different samples (0 for a
        batch-independent ``fn``).
    """
    batch = x.shape[: x.dim() - event_ndim]
    event = x.shape[x.dim() - event_ndim :]
    n_batch, n_in = math.prod(batch), math.prod(event)
    flat = x.detach().reshape(n_batch, *event)

    def g(v: Tensor) -> Tensor:
        return fn(v.reshape(*batch, *event)).reshape(n_batch, -1)

    with torch.enable_grad():
        try:
            jac = torch.autograd.functional.jacobian(g, flat, vectorize=True)
        except RuntimeError:
            jac = torch.autograd.functional.jacobian(g, flat)
    jac = jac.reshape(n_batch, -1, n_batch, n_in)
    n_out = jac.shape[1]
    if n_out != n_in:
        raise BijectionCheckError(f"the Jacobian is {n_out}×{n_in}, not square: not a bijection")
    index = torch.arange(n_batch)
    blocks = jac[index, :, index, :]
    ladj = torch.linalg.slogdet(blocks).logabsdet.reshape(batch)
    off = jac.clone()
    off[index, :, index, :] = 0
    return ladj, off.abs().max() if off.numel() else torch.zeros(())


def _compare(
    name: str, what: str, got: Tensor, want: Tensor, batch: torch.Size, atol: float, rtol: float, report: dict
) -> None:
    """Compare per-sample values (shape ``batch`` or ``(*batch, ...)``), record the error and raise if off."""
    if got.shape != want.shape:
        raise BijectionCheckError(f"{name}: {what}: shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    if not bool(torch.isfinite(got).all()):
        raise BijectionCheckError(f"{name}: {what}: got non-finite values")
    per_sample = (*batch, -1) if got.dim() > len(batch) else (*batch, 1)
    diff = (got - want).abs().reshape(per_sample)
    excess = (diff - (atol + rtol * want.abs().reshape(per_sample))).amax(-1)
    err = diff.amax(-1)
    report[what] = float(err.max()) if err.numel() else 0.0
    if excess.numel() and bool((excess > 0).any()):
        i = int(excess.reshape(-1).argmax())
        where = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), batch)) if batch else ()
        at = f" at batch index {where}" if where else ""
        raise BijectionCheckError(
            f"{name}: {what}: error {float(err.reshape(-1)[i]):.3e}{at} exceeds the tolerance "
            f"(atol={atol:g}, rtol={rtol:g})"
        )


def check_bijection(
    transform: Bijection,
    x: Tensor,
    context: Tensor | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    jacobian: bool = True,
    max_jacobian_size: int = 4096,
) -> dict[str, float]:
    """Check a transform's round trips, fused calls and log-determinants on a batch ``x``.

    Args:
        transform: the transform to check.
        x: inputs on the data side, shape ``(*batch, *event_shape)``; use float64 for tight checks.
        context: context tensor for conditional transforms.
        atol: absolute tolerance (default 1e-7 in float64, 2e-3 otherwise).
        rtol: relative tolerance (default as ``atol``).
        jacobian: compare ``ladj`` with the autograd Jacobian (skipped automatically when the
            flattened batch Jacobian would exceed ``max_jacobian_size`` rows).
        max_jacobian_size: cap on ``batch_size · event_size`` for the Jacobian checks.

    Returns:
        The largest error measured by each check (by name).

    Raises:
        BijectionCheckError: naming the failing check, the worst error and where it occurred.

    Example:
        >>> import torch
        >>> from flows import AffineCoupling
        >>> from flows.testing import check_bijection, perturb_parameters
        >>> t = perturb_parameters(AffineCoupling(4, hidden=(8,)).double())
        >>> errors = check_bijection(t, torch.randn(3, 4, dtype=torch.float64))
        >>> errors["forward ladj vs autograd"] < 1e-8
        True
    """
    name = f"check_bijection({type(transform).__name__})"
    default_atol, default_rtol = _default_tolerances(x.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    event_ndim = len(transform.event_shape)
    batch = x.shape[: x.dim() - event_ndim]
    report: dict[str, float] = {}

    with torch.no_grad():
        z, ladj = transform.forward_and_log_det(x, context)
        out_ndim = len(transform.event_shape_out)
        if z.shape[: z.dim() - out_ndim] != batch:
            raise BijectionCheckError(f"{name}: output shape {tuple(z.shape)} has batch shape != {tuple(batch)}")
        if ladj.shape != batch:
            raise BijectionCheckError(
                f"{name}: ladj has shape {tuple(ladj.shape)}, expected the batch shape {tuple(batch)}"
            )
        _compare(name, "forward vs fused forward", transform(x, context), z, batch, atol, rtol, report)
        x_back, ladj_inv = transform.inverse_and_log_det(z, context)
        if ladj_inv.shape != batch:
            raise BijectionCheckError(
                f"{name}: inverse ladj has shape {tuple(ladj_inv.shape)}, expected the batch shape {tuple(batch)}"
            )
        _compare(name, "inverse vs fused inverse", transform.inverse(z, context), x_back, batch, atol, rtol, report)
        _compare(name, "round trip x -> z -> x", x_back, x, batch, atol, rtol, report)
        _compare(name, "round trip z -> x -> z", transform(x_back, context), z, batch, atol, rtol, report)
        _compare(name, "inverse ladj vs -forward ladj", ladj_inv, -ladj, batch, atol, rtol, report)

    size = math.prod(x.shape)
    if jacobian and size <= max_jacobian_size:
        want, coupling = autograd_log_det(lambda v: transform(v, context), x, event_ndim)
        report["forward batch coupling"] = float(coupling)
        if coupling > atol:
            raise BijectionCheckError(
                f"{name}: outputs of one sample depend on other samples (Jacobian entry {float(coupling):.3e})"
            )
        _compare(name, "forward ladj vs autograd", ladj, want, batch, atol, rtol, report)
        want_inv, _ = autograd_log_det(lambda v: transform.inverse(v, context), z.detach(), out_ndim)
        _compare(name, "inverse ladj vs autograd", ladj_inv, want_inv, batch, atol, rtol, report)
    return report


@torch.no_grad()
def perturb_parameters(module: torch.nn.Module, scale: float = 0.1, *, generator: torch.Generator | None = None):
    """Add Gaussian noise of standard deviation ``scale`` to every parameter (in place) and return the module.

    Moves a transform away from its identity initialisation before checking it. Parameters are
    unconstrained by design in this library, so any perturbation keeps the transform valid.
    """
    for p in module.parameters():
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p)
        p.add_(scale * noise)
    return module
