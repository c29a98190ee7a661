r"""Hand-written autograd for :class:`~flows.bijections.splines.RationalQuadraticSpline`.

The knot location (softmax sizes, running sums, bin search, gather) and the whole forward map run
as ``torch.autograd.Function``\ s whose backward passes apply closed-form derivatives, instead of
PyTorch's generic path (softmax, cumsum, pad, gather and some forty elementwise nodes, each with
its own backward), which cost more than the conditioner's matmuls on CPU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from flows.bijections.splines import RationalQuadraticSpline

__all__ = [
    "BinEnds",
    "SplineForward",
    "dense_stride",
    "empty_strided_as",
    "forward_map",
    "locate",
    "locate_autograd",
    "locate_backward",
    "log_derivative",
]

_LOG2E = math.log2(math.e)


def dense_stride(t: Tensor) -> tuple[int, ...] | None:
    """The strides of ``t`` if it fills its memory densely (a permuted contiguous tensor), else ``None``."""
    order = sorted(range(t.dim()), key=lambda i: t.stride(i))
    expected = 1
    for i in order:
        if t.shape[i] != 1 and t.stride(i) != expected:
            return None
        expected *= t.shape[i]
    return t.stride()


def empty_strided_as(
    shape: torch.Size, stride: tuple[int, ...] | None, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """An uninitialised buffer of ``shape`` with the given dense strides (contiguous for ``None``)."""
    if stride is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def locate(
    theta: Tensor, v: Tensor, offsets: Tensor, scales: Tensor, row: int, shift: float
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
    r"""Knots from raw sizes, bin search and gather (no autograd; :func:`locate_backward` differentiates it).

    ``theta`` is ``(3K - 1, *S)`` (raw parameters first), ``v`` the points ``S`` searched in row
    ``row`` (0: x, 1: y). Returns the lower knot and the size of the bin holding each ``v``, both
    ``(2, *S)`` (rows x and y), the raw derivatives at its two knots plus ``shift``, ``(2, *S)``
    (the raw derivative is 0 at the boundary knots), and what the backward pass needs.

    With :math:`e = \exp(u - \max u)` (the softmax numerators), :math:`C_j = \sum_{i<j} e_i`,
    ``b[j] = [j <= k]`` for the bin ``k`` (``b[0] = 1``, ``b[K] = 0``) and the one-hot
    ``o[j] = b[j] - b[j+1] = [j = k]``: the knot sums are :math:`C_k = \sum_{l} b[l+1] e_l` and
    :math:`C_{k+1} = e_0 + \sum_l b[l+1] e_{l+1}` (``K - 2`` fused multiply-adds on ``(2, 2, *S)``
    slices, both rows and both ends at once), and the raw derivatives
    :math:`(r_k, r_{k+1}) = \sum_j o[j]\,(r_j, r_{j+1})` (:math:`r_0 = r_K = 0`), read straight from
    the strided parameters.

    CPU performance notes (each measured in situ, PyTorch 2.13, the training step being bound by
    memory traffic): the strided raw sizes are read once (scaled by :math:`\log_2 e` on the way);
    kernels run along ``S`` on contiguous buffers, not along rows of ``K`` entries; ``exp2`` is
    several times faster than ``exp``; running sums over the bins are ``K`` adds (``cumsum`` over a
    leading dimension is slow); comparisons write float masks directly (bool outputs, ``where``,
    gathers and bool arithmetic are slow); no temporary is larger than the parameters (a
    ``(K, 3, *S)`` table was, fell above glibc's mmap threshold and page-faulted on every call);
    the maximum keeps the exponentials finite for any raw values.
    """
    k = offsets.shape[-1] - 1
    shape = v.shape
    trailing = (1,) * len(shape)
    dtype, device = theta.dtype, theta.device
    e = torch.empty((2, k, *shape), dtype=dtype, device=device)
    torch.mul(theta[: 2 * k].unflatten(0, (2, k)), _LOG2E, out=e)
    e.sub_(e.amax(1, keepdim=True)).exp2_()  # softmax numerators, (2, K, *S)
    # b[j] = [j <= k], from the interior knots of the searched row, o_j + (s / total) C_j for j = 1..K-1
    # (a point on a knot goes to the bin to its right); the running sum C_j also gives that row's total.
    b = torch.empty((k + 1, *shape), dtype=dtype, device=device)
    b[0].fill_(1)
    b[k].zero_()
    inverse_total = torch.empty((2, *shape), dtype=dtype, device=device)
    torch.sum(e[1 - row], 0, out=inverse_total[1 - row])
    if k > 1:
        interior = b[1:k]
        interior[0].copy_(e[row, 0])
        for j in range(1, k - 1):
            torch.add(interior[j - 1], e[row, j], out=interior[j])
        torch.add(interior[k - 2], e[row, k - 1], out=inverse_total[row])
    else:
        inverse_total[row].copy_(e[row, 0])
    inverse_total.reciprocal_()
    scaled = inverse_total.mul(scales.view(2, *trailing))  # s / total
    if k > 1:
        torch.addcmul(offsets[row, 1:k].view(k - 1, *trailing), interior, scaled[row], out=interior)
        torch.ge(v, interior, out=interior)
    below = b[1:k]  # [l < k] for l = 0..K-2
    one_hot = b[:-1] - b[1:]  # [j = k] for j = 0..K-1
    # C_k = Σ_l [l < k] e_l and C_{k+1} = e_0 + Σ_l [l < k] e_{l+1} (both rows, as [:, 0] and [:, 1]); the raw
    # derivatives (r_k, r_{k+1}) = Σ_j [j = k] (r_j, r_{j+1}), r_0 = r_K = 0, read from the strided parameters.
    r = theta[2 * k :]
    raw = torch.empty((2, *shape), dtype=dtype, device=device)
    if k > 1:
        sums = e[:, 0:2] * below[0]
        for m in range(1, k - 1):
            sums.addcmul_(e[:, m : m + 2], below[m])
        torch.mul(one_hot[0], r[0], out=raw[1])
        torch.mul(one_hot[k - 1], r[k - 2], out=raw[0])
        for j in range(1, k - 1):
            raw.addcmul_(r[j - 1 : j + 1], one_hot[j])
    else:
        sums = torch.zeros((2, 2, *shape), dtype=dtype, device=device)
        raw.zero_()
    sums[:, 1].add_(e[:, 0])
    index = below.sum(0)  # the bin, as a float
    c_low, c_high = sums[:, 0], sums[:, 1]
    step = (offsets[:, 1] - offsets[:, 0]).view(2, *trailing)  # o_j = o_0 + step j
    lower = torch.addcmul(offsets[:, 0].view(2, *trailing), index, step).addcmul_(c_low, scaled)  # knot k
    size = torch.addcmul(step, c_high - c_low, scaled)  # knot k + 1 - knot k
    raw.add_(shift)
    return lower, size, raw, (e, b, one_hot, scaled, inverse_total, c_low, c_high)


def locate_backward(saved: tuple[Tensor, ...], g_low: Tensor, g_high: Tensor, g_raw: Tensor, out: Tensor) -> None:
    r"""Write the gradient of :func:`locate`'s outputs with respect to ``theta`` into ``out`` (``(3K - 1, *S)``).

    ``g_low`` and ``g_high`` (``(2, *S)``) are the gradients with respect to the bin's two knots
    (rows x and y), ``g_raw`` those with respect to its raw derivatives. Knot ``j`` is
    :math:`o_j + s\,\hat C_j` with :math:`\hat C_j = \sum_{i<j} p_i`, ``p = softmax(u)``, and
    :math:`\partial \hat C_j / \partial u_l = p_l([l < j] - \hat C_j)`; with
    :math:`a = g_{low}\,s/\text{total}` and :math:`c = g_{high}\,s/\text{total}`:
    :math:`\partial L/\partial u_l = e_l\,(a [l < k] + c [l \le k] - a \hat C_k - c \hat C_{k+1})`.
    The raw derivatives give :math:`\partial r_k / \partial r_j = [j = k] = b[j] - b[j+1]`.
    Each part of ``out`` is written once (it may be a strided view of the parameters' layout).
    """
    e, b, one_hot, scaled, inverse_total, c_low, c_high = saved
    k = e.shape[1]
    a = g_low * scaled
    c = g_high * scaled
    gamma = torch.addcmul(a * c_low, c, c_high).mul_(inverse_total)
    g = out[: 2 * k].unflatten(0, (2, k))  # (2, K, *S), written in place (no temporary of that size)
    torch.addcmul(gamma.unsqueeze(1).neg_(), b[1:].unsqueeze(0), a.unsqueeze(1), out=g)
    g.addcmul_(b[:-1].unsqueeze(0), c.unsqueeze(1)).mul_(e)
    if k > 1:
        g = out[2 * k :]  # ∂r_k/∂r_j = [j = k], ∂r_{k+1}/∂r_j = [j - 1 = k], j = 1..K-1
        torch.mul(one_hot[1:], g_raw[0], out=g).addcmul_(one_hot[:-1], g_raw[1])


def _fold(tensor: Tensor, dim: int | None, size: int) -> Tensor:
    """A vmap rule's input with its batch dimension first (broadcast to ``size`` when it had none)."""
    if dim is None:
        return tensor.expand(size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _zeros_if_none(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad


class BinEnds(torch.autograd.Function):
    """:func:`locate` as an autograd function (used by the inverse and the double-backward path).

    ``apply`` returns ``(lower, size, raw, *saved)``: the intermediates of :func:`locate` are
    outputs (marked non-differentiable) so that :meth:`setup_context` can keep them for the
    backward, the form that :mod:`torch.func` requires. Under :func:`torch.func.vmap` the
    :meth:`vmap` rule folds the mapped dimension into the points' leading dimensions, so the same
    kernels run once on the whole batch.
    """

    @staticmethod
    def forward(
        params: Tensor, v: Tensor, offsets: Tensor, scales: Tensor, row: int, shift: float
    ) -> tuple[Tensor, ...]:
        lower, size, raw, saved = locate(params.movedim(-1, 0), v, offsets, scales, row, shift)
        return lower, size, raw, *saved

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        params = inputs[0]
        ctx.mark_non_differentiable(*output[3:])
        ctx.set_materialize_grads(False)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(output[0], *output[3:])  # freed after the backward, unlike attributes of ctx
            ctx.layout = (params.shape, dense_stride(params), params.dtype, params.device)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_lower: Tensor | None, grad_size: Tensor | None, grad_raw: Tensor | None, *_: Any
    ) -> tuple[Tensor | None, ...]:
        lower, *saved = ctx.saved_tensors
        grad_lower, grad_size, grad_raw = (_zeros_if_none(g, lower) for g in (grad_lower, grad_size, grad_raw))
        grad = empty_strided_as(*ctx.layout)
        locate_backward(tuple(saved), grad_lower - grad_size, grad_size, grad_raw, grad.movedim(-1, 0))
        return grad, None, None, None, None, None

    @staticmethod
    def vmap(
        info: Any,
        in_dims: tuple[Any, ...],
        params: Tensor,
        v: Tensor,
        offsets: Tensor,
        scales: Tensor,
        row: int,
        shift: float,
    ) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
        if in_dims[2] is not None or in_dims[3] is not None:
            raise ValueError("BinEnds: expected unbatched knot offsets and scales under vmap, got batched ones")
        params, v = _fold(params, in_dims[0], info.batch_size), _fold(v, in_dims[1], info.batch_size)
        out = BinEnds.apply(params, v, offsets, scales, row, shift)
        # lower, size, raw: (2, V, *S); e: (2, K, V, *S); b, one_hot: (K(+1), V, *S); the rest (2, V, *S)
        return out, (1, 1, 1, 2, 1, 1, 1, 1, 1, 1)


def locate_autograd(
    params: Tensor, v: Tensor, offsets: Tensor, scales: Tensor, row: int, shift: float
) -> tuple[Tensor, Tensor, Tensor]:
    """:class:`BinEnds` from differentiable operations (softmax, cumsum, gather), for :mod:`torch.func`.

    The same knots, bin search and raw derivatives as :func:`locate`, without in-place kernels: it
    composes with ``jacrev``, ``jacfwd``, ``jvp`` and ``grad`` (used under those transforms only;
    :func:`locate` is several times faster). ``params`` is ``(*S, 3K - 1)``, ``v`` is ``S``.
    """
    k = offsets.shape[-1] - 1
    p = torch.softmax(params[..., : 2 * k].unflatten(-1, (2, k)), dim=-1)  # (*S, 2, K)
    sums = F.pad(torch.cumsum(p, dim=-1), (1, 0))  # C_j, j = 0..K
    knots = offsets + scales * sums  # (*S, 2, K + 1)
    index = (v.unsqueeze(-1) >= knots[..., row, 1:k]).sum(-1, keepdim=True)  # the bin k, (*S, 1)
    ends = index.unsqueeze(-2).expand(*index.shape[:-1], 2, 1)
    lower = knots.gather(-1, ends).squeeze(-1)
    size = knots.gather(-1, ends + 1).squeeze(-1) - lower
    r = F.pad(params[..., 2 * k :], (1, 1))  # r_0 = r_K = 0
    raw = torch.cat((r.gather(-1, index), r.gather(-1, index + 1)), dim=-1) + shift
    return lower.movedim(-1, 0), size.movedim(-1, 0), raw.movedim(-1, 0)


def log_derivative(
    xi2: Tensor, t: Tensor, one_minus2: Tensor, s: Tensor, d_k: Tensor, d_k1: Tensor, den: Tensor
) -> tuple[Tensor, Tensor]:
    """``M = d_{k+1} ξ² + 2 s ξ(1-ξ) + d_k (1-ξ)²`` and ``log dy/dx = log M + 2 log(s / den)``."""
    numerator = torch.addcmul(d_k1 * xi2, s, t, value=2)
    numerator = torch.addcmul(numerator, d_k, one_minus2)
    return numerator, torch.add(torch.log(numerator), torch.log(s / den), alpha=2)


def forward_map(
    xc: Tensor, x_k: Tensor, w: Tensor, y_k: Tensor, h: Tensor, d_k: Tensor, d_k1: Tensor
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """``y`` and ``log dy/dx`` inside the domain, and the intermediates the hand-written backward reuses."""
    s = h / w
    xi = (xc - x_k) / w
    one_minus = 1 - xi
    t = xi * one_minus
    xi2 = xi * xi
    delta = torch.add(d_k + d_k1, s, alpha=-2)
    den = torch.addcmul(s, delta, t)  # s + (d_k + d_{k+1} - 2s) t
    q = torch.addcmul(d_k * t, s, xi2) / den  # (s ξ² + d_k t) / den
    y = torch.addcmul(y_k, h, q)
    one_minus2 = one_minus * one_minus
    numerator, ladj = log_derivative(xi2, t, one_minus2, s, d_k, d_k1, den)
    return y, ladj, (s, xi, one_minus, t, xi2, one_minus2, delta, den, q, numerator)


class SplineForward(torch.autograd.Function):
    r"""The whole forward spline map ``(x, θ) → (y, log dy/dx)`` with a hand-written backward.

    Forward: :func:`locate` and :func:`forward_map` without autograd recording. Backward: with
    :math:`Q` the denominator, :math:`M` the derivative's numerator, :math:`q = (y - y_k)/h` and
    upstream gradients :math:`g_y, g_l`, the partial derivatives in :math:`\xi, s, d_k, d_{k+1}` are

    .. math::

        G_\xi &= g_y \frac{h s M}{Q^2} + 2\frac{g_l}{M}\,(d_{k+1}\xi + s(1-2\xi) - d_k(1-\xi))
                 - 2\frac{g_l}{Q}\,\delta(1-2\xi), \\
        G_s &= g_y \frac{h}{Q}\,(\xi^2 - q(1-2t)) + 2t\frac{g_l}{M} + \frac{2 g_l}{s} - 2(1-2t)\frac{g_l}{Q}, \\
        G_{d_k} &= t\,(g_y \tfrac{h}{Q} (1-q) - 2\tfrac{g_l}{Q}) + (1-\xi)^2 \frac{g_l}{M}, \qquad
        G_{d_{k+1}} = \xi^2 \frac{g_l}{M} - t\,(g_y \tfrac{h}{Q} q + 2\tfrac{g_l}{Q}),

    then :math:`\partial_x = G_\xi/w`, :math:`\partial_{x_k} = -G_\xi/w`,
    :math:`\partial_w = -(G_\xi \xi + G_s s)/w`, :math:`\partial_h = g_y q + G_s/w`,
    :math:`\partial_{y_k} = g_y` and :func:`locate_backward` for the raw parameters. One node in the
    graph instead of some forty, no autograd bookkeeping, every intermediate computed once.

    A backward with ``create_graph=True`` (scores, force matching) differentiates
    :meth:`RationalQuadraticSpline._forward_autograd` instead, so derivatives of any order in
    ``x`` work exactly as before; a second derivative in the raw parameters raises (the knot
    search is once-differentiable).
    """

    @staticmethod
    def forward(x: Tensor, params: Tensor, spline: RationalQuadraticSpline) -> tuple[Tensor, ...]:
        bound = spline.bound
        xc = x.clamp(-bound, bound)
        inside = xc == x
        offsets, scales = spline._knot_constants(params)
        lower, size, raw, saved = locate(params.movedim(-1, 0), xc, offsets, scales, 0, spline._softplus_shift)
        d = F.softplus(raw).add_(spline.min_derivative)
        y, ladj, inter = forward_map(xc, lower[0], size[0], lower[1], size[1], d[0], d[1])
        inside_f = inside.to(x.dtype)
        y = torch.where(inside, y, x)
        ladj = ladj.masked_fill_(~inside, 0.0)  # not mul_(inside_f): inf * 0 is NaN
        return y, ladj, inside_f, size, d, raw, *saved, *inter

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        x, params, spline = inputs
        ctx.mark_non_differentiable(*output[2:])
        ctx.set_materialize_grads(False)
        if any(ctx.needs_input_grad[:2]):
            ctx.save_for_backward(x, params, *output[2:])
            ctx.spline = spline
            ctx.layout = (params.shape, dense_stride(params), params.dtype, params.device)

    @staticmethod
    def vmap(
        info: Any, in_dims: tuple[Any, ...], x: Tensor, params: Tensor, spline: RationalQuadraticSpline
    ) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
        x, params = _fold(x, in_dims[0], info.batch_size), _fold(params, in_dims[1], info.batch_size)
        out = SplineForward.apply(x, params, spline)
        # y, ladj, inside: (V, *S); size, d, raw: (2, V, *S); locate's saved tensors (see BinEnds.vmap); the
        # intermediates of forward_map: (V, *S)
        return out, (0, 0, 0, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, *(0,) * 10)

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor | None, grad_ladj: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:
        x, params, inside, size, d, raw, *rest = ctx.saved_tensors
        grad_y, grad_ladj = _zeros_if_none(grad_y, x), _zeros_if_none(grad_ladj, x)
        if torch.is_grad_enabled():  # create_graph=True: differentiate the autograd formulation
            inputs = [t for t, needed in zip((x, params), ctx.needs_input_grad[:2], strict=True) if needed]
            with torch.enable_grad():
                outputs = ctx.spline._forward_autograd(x, params)
            grads = iter(torch.autograd.grad(outputs, inputs, (grad_y, grad_ladj), create_graph=True))
            return (*(next(grads) if needed else None for needed in ctx.needs_input_grad[:2]), None)
        saved, (s, xi, one_minus, t, xi2, one_minus2, delta, den, q, numerator) = rest[:7], rest[7:]
        w, h = size[0], size[1]
        gy = grad_y * inside
        gl = grad_ladj * inside
        inv_den = den.reciprocal()
        gyh = torch.mul(gy, h).mul_(inv_den)  # g_y h / Q
        c = gl / numerator  # g_l / M
        e1 = gl * inv_den  # g_l / Q
        one_m2xi = one_minus - xi
        one_m2t = torch.rsub(t, 1, alpha=2)  # 1 - 2t
        g_xi = torch.mul(gyh, s).mul_(numerator).mul_(inv_den)
        bracket = torch.addcmul(d[1] * xi, s, one_m2xi).addcmul_(d[0], one_minus, value=-1)
        g_xi.addcmul_(c, bracket, value=2).addcmul_(e1 * delta, one_m2xi, value=-2)
        g_s = torch.addcmul(xi2, q, one_m2t, value=-1).mul_(gyh)
        g_s.addcmul_(t, c, value=2).addcmul_(one_m2t, e1, value=-2).add_(gl / s, alpha=2)
        inv_w = w.reciprocal()
        g_xc = g_xi.mul_(inv_w)  # ∂/∂x inside the domain
        grad_x = grad_params = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.lerp(grad_y, g_xc, inside)  # the identity's gradient outside (exact for weights 0, 1)
        if ctx.needs_input_grad[1]:
            shape = x.shape
            g_low, g_high, g_raw = torch.empty((3, 2, *shape), dtype=x.dtype, device=x.device).unbind(0)
            torch.mul(one_minus2, c, out=g_raw[0])  # G_{d_k} = (1-ξ)² g_l/M + t (g_y h/Q - g_y h q/Q - 2 g_l/Q)
            torch.mul(xi2, c, out=g_raw[1])  # G_{d_{k+1}} = ξ² g_l/M - t (g_y h q/Q + 2 g_l/Q)
            g_raw.addcmul_(t, torch.mul(gyh, q).add_(e1, alpha=2), value=-1)
            g_raw[0].addcmul_(t, gyh)
            g_raw.mul_(torch.sigmoid(raw))
            u = g_s.mul_(inv_w)
            v = u * s
            torch.addcmul(v, g_xc, xi, out=g_high[0]).neg_()  # ∂/∂w = -(G_ξ ξ + G_s s)/w
            torch.addcmul(v, g_xc, one_minus, value=-1, out=g_low[0])  # ∂/∂x_k - ∂/∂w
            torch.addcmul(u, gy, q, out=g_high[1])  # ∂/∂h = g_y q + G_s/w
            torch.sub(gy, g_high[1], out=g_low[1])  # ∂/∂y_k - ∂/∂h
            grad_params = empty_strided_as(*ctx.layout)
            locate_backward(saved, g_low, g_high, g_raw, grad_params.movedim(-1, 0))
        return grad_x, grad_params, None
