r"""Numerical inverses with implicit gradients: monotone scalar roots and residual fixed points.

Two solvers serve every transform without a closed-form inverse:

* :func:`monotone_inverse` solves :math:`f(x) = y` elementwise for a strictly increasing scalar
  map :math:`f` (a monotone transformer, the scalar equation of a planar or radial layer): the
  bracket :math:`[l, h]` with :math:`f(l) \le y \le f(h)` is found by expanding geometrically around
  the initial guess, then safeguarded Newton iterations :math:`x \leftarrow x - (f(x) - y)/f'(x)`
  fall back to bisection whenever a step leaves the current bracket (so the iteration always
  converges for a continuous increasing :math:`f`, quadratically near a simple root).
* :func:`fixed_point_inverse` solves :math:`x + g(x) = y` for a residual block whose :math:`g` has
  Lipschitz constant :math:`L < 1`, by Banach's iteration :math:`x \leftarrow y - g(x)` (linear
  convergence at rate :math:`L`).

Gradients come from the implicit function theorem, not from unrolling the iterations. For
:math:`F(x, \theta) = 0` at the root :math:`x^*`,

.. math:: \frac{\partial x^*}{\partial \theta} = -\Big(\frac{\partial F}{\partial x}\Big)^{-1}
          \frac{\partial F}{\partial \theta}.

* Scalar case: the iterations run without autograd, then one differentiable Newton step from the
  detached root, :math:`x = x^* - (f(x^*; \theta) - y)/c` with :math:`c = f'(x^*)` detached, is
  returned. Its value is :math:`x^*` up to the (already negligible) residual, and its first
  derivatives are exactly the implicit ones: :math:`\partial x/\partial y = 1/f'(x^*)` and
  :math:`\partial x/\partial\theta = -\partial_\theta f(x^*; \theta)/f'(x^*)`, because :math:`x^*`
  enters only as a constant. (Second derivatives are not those of the exact inverse.)
* Residual case: the returned tensor is one differentiable fixed-point step
  :math:`x = y - g(x^*)` from the detached root, with a backward hook that replaces the incoming
  gradient :math:`u` by the solution :math:`w` of :math:`w = u - J_g(x^*)^\top w` (the same
  contraction, by vector-Jacobian products), so that the gradients reaching :math:`y` and the
  parameters of :math:`g` are :math:`(I + J_g)^{-\top} u` pulled back through :math:`y - g`:
  the implicit gradient (the "deep equilibrium" backward pass of Bai, Kolter, Koltun 2019).

Both raise :class:`NumericalInverseError` (a ``FloatingPointError``) naming the tolerance, the
iterations and the worst residual when they do not converge; nothing returns an unconverged value.

References:
    Press, Teukolsky, Vetterling, Flannery (2007), "Numerical Recipes", 3rd ed., §9.4 (Newton's
    method safeguarded by bisection, ``rtsafe``). Behrmann, Grathwohl, Chen, Duvenaud, Jacobsen
    (2019), "Invertible Residual Networks", ICML, arXiv:1811.00995 (the fixed-point inverse).
    Bai, Kolter, Koltun (2019), "Deep Equilibrium Models", NeurIPS, arXiv:1909.01377 (implicit
    backward pass).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["NumericalInverseError", "default_tolerance", "fixed_point_inverse", "monotone_inverse"]


class NumericalInverseError(FloatingPointError):
    """A numerical inverse did not converge: the message names the tolerance, the iterations and the worst residual."""


def default_tolerance(dtype: torch.dtype) -> float:
    """The default absolute and relative residual tolerance: ``1e-12`` in float64, ``1e-5`` otherwise."""
    return 1e-12 if dtype == torch.float64 else 1e-5


def _fail(who: str, what: str, tol: float, iterations: int, worst: float) -> NumericalInverseError:
    return NumericalInverseError(
        f"{who}: the numerical inverse did not converge ({what}): expected a residual <= {tol:g} "
        f"(atol + rtol·|y|) within {iterations} iterations, got a worst residual of {worst:.3g}; "
        "raise max_iter or the tolerance, or check that the map is invertible (monotone / Lipschitz < 1)"
    )


def _bracket(
    fn: Callable[[Tensor], tuple[Tensor, Tensor]], y: Tensor, x0: Tensor, max_expand: int, who: str, tol: float
) -> tuple[Tensor, Tensor]:
    """Expand ``[x0 - s, x0 + s]`` (``s`` doubling) until ``f(lo) <= y <= f(hi)`` everywhere."""
    lo, hi = x0 - 1.0, x0 + 1.0
    step = torch.ones_like(x0)
    for _ in range(max_expand):
        low_bad = ~(fn(lo)[0] <= y)  # NaN counts as not bracketed
        high_bad = ~(fn(hi)[0] >= y)
        if not bool((low_bad | high_bad).any()):
            return lo, hi
        lo = torch.where(low_bad, lo - step, lo)
        hi = torch.where(high_bad, hi + step, hi)
        step = step * 2
    missing = low_bad | high_bad
    worst = float((x0 - y).abs()[missing].max()) if bool(missing.any()) else float("nan")
    raise _fail(who, f"no bracket after {max_expand} doublings", tol, max_expand, worst)


@torch.no_grad()
def _newton_bisection(
    fn: Callable[[Tensor], tuple[Tensor, Tensor]],
    y: Tensor,
    x0: Tensor,
    atol: float,
    rtol: float,
    max_iter: int,
    max_expand: int,
    who: str,
) -> Tensor:
    tol = atol + rtol * y.abs()
    lo, hi = _bracket(fn, y, x0, max_expand, who, atol)
    x = torch.minimum(torch.maximum(x0, lo), hi)
    xtol = 16 * torch.finfo(y.dtype).eps
    for _ in range(max_iter):
        fx, dfx = fn(x)
        r = fx - y
        newton = x - r / dfx
        small = (newton - x).abs() <= xtol * (1 + x.abs())
        done = (r.abs() <= tol) | small | ((hi - lo) <= xtol * (1 + x.abs()))
        if bool(done.all()):
            return torch.where(small, newton, x)
        lo = torch.where(r < 0, x, lo)
        hi = torch.where(r > 0, x, hi)
        inside = (newton > lo) & (newton < hi)  # False for NaN
        x = torch.where(done, x, torch.where(inside, newton, (lo + hi) / 2))
    r = (fn(x)[0] - y).abs()
    raise _fail(who, "Newton-bisection", atol, max_iter, float((r - tol).clamp_min(0).add(tol).max()))


def monotone_inverse(
    fn: Callable[[Tensor], tuple[Tensor, Tensor]],
    y: Tensor,
    *,
    x0: Tensor | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    max_iter: int = 100,
    max_expand: int = 64,
    who: str = "monotone_inverse",
) -> Tensor:
    r"""Solve :math:`f(x) = y` elementwise for a strictly increasing, continuous scalar map :math:`f`.

    Bracketing (geometric expansion around ``x0``) plus Newton's method safeguarded by bisection,
    vectorised over all elements; the result carries the exact implicit first derivatives with
    respect to ``y`` and to every tensor ``fn`` closes over (see the module docstring).

    Args:
        fn: ``x -> (f(x), f'(x))``, elementwise: both outputs of the shape of ``y``, entry ``i``
            depending on ``x[i]`` only. It may close over parameters that require gradients.
        y: the targets, any shape.
        x0: the initial guess (default ``y``: the maps of this library start near the identity).
        atol: absolute residual tolerance (default :func:`default_tolerance` of ``y.dtype``).
        rtol: relative residual tolerance, times ``|y|`` (default as ``atol``).
        max_iter: most Newton-bisection iterations.
        max_expand: most bracket doublings (``2**64`` times the initial half-width at the default).
        who: the name that error messages start with (the calling layer).

    Returns:
        :math:`x` with :math:`|f(x) - y| \le` ``atol + rtol·|y|`` (or within a few ulps of the root).
        Non-finite entries of ``y`` give the same non-finite entries (``NaN`` stays ``NaN``).

    Raises:
        NumericalInverseError: when no bracket is found or the iterations do not converge.

    Example:
        >>> import torch
        >>> y = torch.tensor([-2.0, 0.5, 30.0], dtype=torch.float64)
        >>> x = monotone_inverse(lambda x: (x**3 + x, 3 * x**2 + 1), y)
        >>> torch.allclose(x**3 + x, y)
        True
    """
    tol = default_tolerance(y.dtype)
    atol = tol if atol is None else atol
    rtol = tol if rtol is None else rtol
    finite = torch.isfinite(y)
    y_safe = torch.where(finite, y, torch.zeros_like(y)).detach()
    start = y_safe if x0 is None else torch.where(finite, x0, torch.zeros_like(x0)).detach()
    x_star = _newton_bisection(fn, y_safe, start, atol, rtol, max_iter, max_expand, who)
    if torch.is_grad_enabled():
        fx, dfx = fn(x_star)
        x = x_star - (fx - torch.where(finite, y, torch.zeros_like(y))) / dfx.detach()
    else:
        x = x_star
    return torch.where(finite, x, y)


def _implicit_backward(
    g: Callable[[Tensor], Tensor], x_star: Tensor, atol: float, rtol: float, max_iter: int, who: str
) -> Callable[[Tensor], Tensor]:
    """The hook ``u -> w`` with ``w = u - J_g(x*)^T w``, solved by fixed-point iteration of vector-Jacobian products."""
    z = x_star.detach().requires_grad_(True)
    with torch.enable_grad():
        gz = g(z)

    def hook(u: Tensor | None) -> Tensor | None:
        if u is None:  # an undefined output gradient: nothing to solve
            return None
        w = u
        for _ in range(max_iter):
            (vjp,) = torch.autograd.grad(gz, z, w, retain_graph=True)
            w_new = u - vjp
            gap = (w_new - w).abs()
            if bool(((gap <= atol + rtol * w_new.abs()) | ~torch.isfinite(gap)).all()):
                return w_new
            w = w_new
        worst = float((w_new - w).abs().max())
        raise _fail(who, "implicit backward pass", atol, max_iter, worst)

    return hook


def fixed_point_inverse(
    g: Callable[[Tensor], Tensor],
    y: Tensor,
    *,
    x0: Tensor | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    max_iter: int = 1000,
    event_ndim: int = 1,
    who: str = "fixed_point_inverse",
) -> Tensor:
    r"""Solve :math:`x + g(x) = y` by the iteration :math:`x \leftarrow y - g(x)` (Lipschitz :math:`g < 1`).

    The residual :math:`|x + g(x) - y|` is the length of the next step; the iteration stops when
    it is at most ``atol + rtol·|y|`` for every entry with a finite ``y`` (the error in :math:`x`
    is then at most that over :math:`1 - L`). The result is one differentiable step from the
    detached root whose backward pass solves the implicit-gradient system (module docstring), so
    backpropagation costs a few vector-Jacobian products of :math:`g`, not the forward iterations.

    Args:
        g: the residual branch, ``(*batch, *event) -> (*batch, *event)``; rows must not interact.
        y: the targets.
        x0: the initial guess (default ``y``).
        atol: absolute residual tolerance (default :func:`default_tolerance` of ``y.dtype``).
        rtol: relative residual tolerance (default as ``atol``).
        max_iter: most iterations (the forward solve and the backward solve each).
        event_ndim: trailing dimensions of one event: a row with a non-finite entry of ``y`` is
            left out of the convergence test (its output is non-finite, the other rows are unaffected).
        who: the name that error messages start with (the calling layer).

    Returns:
        :math:`x` with the residual within tolerance; rows with a non-finite ``y`` come out non-finite.

    Raises:
        NumericalInverseError: when the iterations do not converge (e.g. a branch with :math:`L \ge 1`).

    Example:
        >>> import torch
        >>> y = torch.randn(4, 3, dtype=torch.float64)
        >>> x = fixed_point_inverse(lambda x: 0.5 * torch.sin(x), y)
        >>> torch.allclose(x + 0.5 * torch.sin(x), y)
        True
    """
    tol = default_tolerance(y.dtype)
    atol = tol if atol is None else atol
    rtol = tol if rtol is None else rtol
    finite = torch.isfinite(y)
    if event_ndim:
        finite = finite.flatten(finite.dim() - event_ndim).all(-1)
        finite = finite.reshape(*finite.shape, *(1,) * event_ndim).expand_as(y)
    bound = atol + rtol * y.detach().abs()
    with torch.no_grad():
        x = (y if x0 is None else x0).detach().clone()
        for _ in range(max_iter):
            x_new = y - g(x)
            step = (x_new - x).abs()
            x = x_new
            if bool(((step <= bound) | ~finite).all()):
                break
        else:
            worst = float(torch.where(finite, step, torch.zeros_like(step)).max())
            raise _fail(who, "fixed-point iteration", atol, max_iter, worst)
    if not torch.is_grad_enabled():
        return x
    out = y - g(x.detach())
    if out.requires_grad:
        out.register_hook(_implicit_backward(g, x, atol, rtol, max_iter, who))
    return out
