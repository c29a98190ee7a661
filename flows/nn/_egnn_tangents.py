r"""The EGNN's tangents by hand: its exact divergence in forward mode, and the helpers its JVPs share.

``EGNN.divergence`` (``flows/nn/egnn.py``) calls :func:`exact_divergence` chunk by chunk; the
method's docstring and ``docs/particles.md`` ("Fast exact log q") describe what is propagated
where.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from flows.nn._particles import remove_mean

if TYPE_CHECKING:
    from flows.nn.egnn import EGNN

__all__ = ["edge_tangents", "exact_divergence", "linear_jvp", "mm", "silu_grad", "silu_jvp"]


def linear_jvp(layer: nn.Linear, a: Tensor, va: Tensor) -> tuple[Tensor, Tensor]:
    return layer(a), va @ layer.weight.T


def mm(a: Tensor, w: Tensor) -> Tensor:
    """``a @ w.T`` as one two-dimensional matrix product (batched matmuls over many leading axes are slower)."""
    return (a.reshape(-1, a.shape[-1]) @ w.T).reshape(*a.shape[:-1], w.shape[0])


def edge_tangents(
    edge: nn.Sequential, coord: nn.Sequential, pre: tuple[Tensor, ...], va: Tensor, messages: bool = True
) -> tuple[Tensor | None, Tensor]:
    r"""Tangents of the messages and coordinate weights from those of the first edge pre-activation.

    ``pre`` holds the pre-activations of the three SiLUs (edge, edge, coordinate MLP) at the
    primal shape, broadcastable to the tangents'. The coordinate weight
    :math:`c = w_3^\top \sigma(W_c m + b_c) + b_3` is a scalar per pair, so its tangent is a dot
    product with the per-pair gradient :math:`g_m = W_c^\top (\sigma'(\cdot) \odot w_3)`, formed
    once on the primal instead of pushing every tangent through :math:`W_c` (half the matrix
    products of a layer). Without ``messages`` (the last layer, whose messages reach nothing) the
    gradient is pulled back to the pre-activation, :math:`g_a = \sigma'(a_1) \odot W_2^\top
    (\sigma'(a_2) \odot g_m)`, and no tangent goes through a matrix at all. Without a graph to
    keep, ``va`` is overwritten.
    """
    g1, g2, g3 = (silu_grad(a) for a in pre)
    gm = message_gradient(coord, g3)  # (..., hidden) on the primal
    if not messages:
        return None, (va * preactivation_gradient(edge, g1, g2, gm)).sum(-1, keepdim=True)
    if va.requires_grad:
        vm = g2 * mm(g1 * va, edge[2].weight)
    else:
        vm = mm(va.mul_(g1), edge[2].weight).mul_(g2)
    return vm, (vm * gm).sum(-1, keepdim=True)


def message_gradient(coord: nn.Sequential, g3: Tensor) -> Tensor:
    r"""``d c / d m`` of the coordinate weight :math:`c = w_3^\top \sigma(W_c m + b_c) + b_3`; ``g3 = σ'(·)``."""
    return mm(g3 * coord[2].weight[0], coord[0].weight.T)


def preactivation_gradient(edge: nn.Sequential, g1: Tensor, g2: Tensor, gm: Tensor) -> Tensor:
    """``d c / d a1``: ``gm`` pulled back through the message MLP (``g1``, ``g2`` its SiLUs' derivatives)."""
    return g1 * mm(g2 * gm, edge[2].weight.T)


def distance_tangent(vx: Tensor, diff: Tensor) -> Tensor:
    """Tangents ``(N, k, a, i, j)`` of all squared distances, ``2 diff_ij · (v_i - v_j)``, without ``v_i - v_j``."""
    return 2 * (torch.einsum("bkaid,bijd->bkaij", vx, diff) - torch.einsum("bkajd,bijd->bkaij", vx, diff))


def silu_grad(a: Tensor) -> Tensor:
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


def silu_jvp(a: Tensor, va: Tensor) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(a)
    return a * s, va * (s * (1 + a * (1 - s)))


def exact_divergence(field: EGNN, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """The field and its exact divergence for one chunk of the batch (see :meth:`EGNN.divergence`)."""
    shape = z.shape[:-1]
    n, d, hid, batch = field.n_particles, field.spatial_dim, field.width, z.shape[0]
    x0 = z.unflatten(-1, (n, d))
    h = field._embed(t, shape, batch)
    start = _basis(field, x0)
    x, vx, vh = x0, None, None  # tangents: (N, k, a, i, d) and (N, k, a, i, hidden)
    trace = z.new_zeros(batch)
    primal = None  # the last layer's, when the contraction has computed it
    for index, (edge, coord) in enumerate(zip(field.edge, field.coord, strict=True)):
        if primal is None:
            diff, d2, a1, a2, m, c1 = _edge_primal(field, index, x, h, start.d2_0)
        else:
            diff, d2, a1, a2, m, c1 = primal
        c = coord[2](coord[1](c1))
        scale = (d2 + 1).rsqrt()
        weights = _first_weights(edge, hid)
        layer = (diff, scale, a1, a2, m, c1, c)
        last = index == field.layers - 1
        if index > 0 and index == field.layers - 2 and n * d >= field.contract_from:  # contracted: _penultimate
            x, h, vx, vh, extra, primal = _penultimate(
                field, index, (x, h, start.d2_0, start.diff0), (vx, vh), layer, weights
            )
            trace = trace + extra
            continue
        if index == 0 or last:  # tangents on the pairs (k, j) of row k only
            vm, vshift = _row_shift(edge, coord, start, (vx, vh), layer, weights, last)
            x = x + (diff * (c * scale)).sum(2) / (n - 1)
            if last:
                trace = _own_trace(trace, vshift, vx, n, d)
                break
            # node k moves by its whole row; node i != k by the mirrored pair (i, k) = -(k, i)
            own = start.eye_d + vshift.sum(3) / (n - 1)  # (N, k, a, d)
            vx = -vshift / (n - 1) + start.eye_n.reshape(1, n, 1, n, 1) * own[:, :, :, None, :]
            vagg = vm + start.eye_n.reshape(1, n, 1, n, 1) * vm.sum(3, keepdim=True)
        else:  # dense: all pairs (i, j), in as few passes over the big tangent tensors as possible
            x, vx, vagg = _dense_layer(edge, coord, start, x, (vx, vh), layer, weights)
        h, vh = _node_update(field.node[index], h, m, start.offdiag, vagg, vh)
    f = remove_mean((x - x0).flatten(-2), n, d)
    return f, trace


class _Basis(NamedTuple):
    """What every layer of :func:`exact_divergence` reads of the input state ``x0`` and the basis tangents."""

    offdiag: Tensor  # (n, n, 1): 1 off the diagonal
    eye_n: Tensor
    eye_d: Tensor
    ones_row: Tensor  # (1, n, d, n, d): d(x_k - x_j)/dz_{k,a} = e_a, j != k
    diff0: Tensor  # (N, i, j, d): x0_i - x0_j
    d2_0: Tensor  # (N, i, j, 1): the squared initial distances
    vd2_0_row: Tensor  # (N, k, a, j, 1): d d2_0[k, j] / dz_{k,a}


def _basis(field: EGNN, x0: Tensor) -> _Basis:
    """The constants of :func:`exact_divergence` for states ``x0`` of shape ``(N, n, d)``."""
    n, d, z = field.n_particles, field.spatial_dim, x0
    offdiag = field._offdiag.to(z.dtype)
    eye_n = torch.eye(n, dtype=z.dtype, device=z.device)
    eye_d = torch.eye(d, dtype=z.dtype, device=z.device)
    ones_row = offdiag.reshape(1, n, 1, n, 1) * eye_d.reshape(1, 1, d, 1, d)  # d(x_k - x_j)/dz_{k,a} = e_a, j != k
    diff0 = x0[:, :, None] - x0[:, None, :]
    d2_0 = diff0.square().sum(-1, keepdim=True)
    vd2_0_row = 2 * diff0.transpose(-1, -2)[..., None]  # (N, k, a, j, 1): d d2_0[k, j] / dz_{k,a}
    return _Basis(offdiag, eye_n, eye_d, ones_row, diff0, d2_0, vd2_0_row)


def _edge_primal(field: EGNN, index: int, x: Tensor, h: Tensor, d2_0: Tensor) -> tuple[Tensor, ...]:
    """Layer ``index`` on all pairs: differences, squared distances, edge pre-activations, messages, ``W_c m``."""
    edge, coord = field.edge[index], field.coord[index]
    diff = x[:, :, None] - x[:, None, :]
    d2 = diff.square().sum(-1, keepdim=True)
    a1 = field._edge_input(index, h, d2, d2_0)
    a2 = edge[2](edge[1](a1))
    m = edge[3](a2)
    c1 = coord[0](m)
    return diff, d2, a1, a2, m, c1


def _first_weights(edge: nn.Sequential, hid: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The first edge layer's column blocks ``W_a, W_b, w_d2, w_d2_0``, contiguous (strided operands are slow)."""
    w = edge[0].weight
    wa, wb = w[:, :hid].contiguous(), w[:, hid : 2 * hid].contiguous()
    w_d2, w_d2_0 = w[:, -2].contiguous(), w[:, -1].contiguous()
    return wa, wb, w_d2, w_d2_0


def _row_shift(
    edge: nn.Sequential,
    coord: nn.Sequential,
    start: _Basis,
    tangents: tuple[Tensor | None, Tensor | None],
    layer: tuple[Tensor, ...],
    weights: tuple[Tensor, ...],
    last: bool,
) -> tuple[Tensor | None, Tensor]:
    """The first or last layer: tangents of the messages and of the shifts of the pairs ``(k, j)`` of row ``k``."""
    vx, vh = tangents
    diff, scale, a1, a2, _, c1, c = layer
    wa, wb, w_d2, w_d2_0 = weights
    row = (slice(None), slice(None), None)  # primal (N, k, j, .) -> (N, k, 1, j, .)
    if vx is None:
        vdiff = start.ones_row
        vd2 = start.vd2_0_row
    else:
        vx_kk = torch.diagonal(vx, dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, k, a, d)
        vdiff = vx_kk[:, :, :, None, :] - vx
        vd2 = 2 * (diff[row] * vdiff).sum(-1, keepdim=True)
    va = vd2 * w_d2 + start.vd2_0_row * w_d2_0
    if vh is not None:
        vh_kk = torch.diagonal(vh, dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, k, a, hidden)
        va = va + mm(vh_kk, wa)[:, :, :, None, :] + mm(vh, wb)
    vm, vc = edge_tangents(edge, coord, (a1[row], a2[row], c1[row]), va, messages=not last)
    vscale = -0.5 * scale[row].pow(3) * vd2
    vshift = vdiff * (c * scale)[row] + diff[row] * (vc * scale[row] + c[row] * vscale)
    return vm, vshift


def _own_trace(trace: Tensor, vshift: Tensor, vx: Tensor | None, n: int, d: int) -> Tensor:
    """Add the last layer's ``d f_{k,a} / d z_{k,a}``: row k's own shift, plus the incoming tangent, minus 1."""
    trace = trace + torch.diagonal(vshift, dim1=2, dim2=4).sum((1, 2, 3)) / (n - 1)
    if vx is not None:
        vx_kk = torch.diagonal(vx, dim1=1, dim2=3).permute(0, 3, 1, 2)
        trace = trace + torch.diagonal(vx_kk, dim1=2, dim2=3).sum((1, 2)) - n * d
    return trace


def _dense_layer(
    edge: nn.Sequential,
    coord: nn.Sequential,
    start: _Basis,
    x: Tensor,
    tangents: tuple[Tensor, Tensor],
    layer: tuple[Tensor, ...],
    weights: tuple[Tensor, ...],
) -> tuple[Tensor, Tensor, Tensor]:
    """A middle layer on all pairs ``(i, j)``: the state, its tangents and the aggregated message tangents."""
    vx, vh = tangents
    diff, scale, a1, a2, _, c1, c = layer
    wa, wb, w_d2, w_d2_0 = weights
    n = x.shape[1]
    row = (slice(None), None, None)  # primal (N, i, j, .) -> (N, 1, 1, i, j, .)
    # d d2[i, j] = 2 diff_ij . (v_i - v_j), without forming v_i - v_j
    vd2 = distance_tangent(vx, diff)[..., None]
    va = (mm(vh, wa)[..., :, None, :] + mm(vh, wb)[..., None, :, :]).addcmul_(vd2, w_d2)
    # d d2_0[i, j] / dz_{k,a} = 2 diff0[i, j, a] (delta_ik - delta_jk): only row k and column k,
    # both equal to 2 diff0[k, ., a] (d2_0 is symmetric)
    g = (2 * start.diff0.transpose(-1, -2))[..., None] * w_d2_0  # (N, k, a, j, hidden)
    torch.diagonal(va, dim1=1, dim2=3).add_(g.permute(0, 2, 3, 4, 1))
    torch.diagonal(va, dim1=1, dim2=4).add_(g.permute(0, 2, 3, 4, 1))
    vm, vc = edge_tangents(edge, coord, (a1[row], a2[row], c1[row]), va)
    # sum_j of the shift's tangent (v_i - v_j) c s + diff (vc s + c ds), node by node
    cs = (c * scale)[..., 0]  # (N, i, j)
    q = (vc * scale[row] - 0.5 * c[row] * scale[row].pow(3) * vd2)[..., 0]  # (N, k, a, i, j)
    vx = _move_tangent(vx, cs, diff, q, n)
    vagg = vm.sum(-2) - torch.diagonal(vm, dim1=-3, dim2=-2).transpose(-1, -2)
    x = x + (diff * (c * scale)).sum(2) / (n - 1)
    return x, vx, vagg


def _move_tangent(vx: Tensor, cs: Tensor, diff: Tensor, q: Tensor, n: int) -> Tensor:
    """The state tangents after a dense coordinate update, ``v_i + sum_j [(v_i - v_j) c s + diff_ij q_ij] / (n-1)``."""
    return vx + (
        vx * cs.sum(-1)[:, None, None, :, None]
        - torch.einsum("bij,bkajd->bkaid", cs, vx)
        + torch.einsum("bijd,bkaij->bkaid", diff, q)
    ) / (n - 1)


def _node_update(
    node: nn.Sequential, h: Tensor, m: Tensor, offdiag: Tensor, vagg: Tensor, vh: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The node features after a layer and their tangents, from the aggregated message tangents ``vagg``."""
    batch, n, hid = m.shape[0], m.shape[1], m.shape[-1]
    hh = h.expand(batch, n, hid)
    an = node[0](torch.cat((hh, (m * offdiag).sum(2)), -1))
    vn = mm(vagg, node[0].weight[:, hid:].contiguous())
    if vh is not None:
        vn = vn + mm(vh, node[0].weight[:, :hid].contiguous())
    vb = mm(silu_grad(an)[:, None, None] * vn, node[2].weight)
    h = hh + node[2](node[1](an))
    vh = vb if vh is None else vh + vb
    return h, vh


def _penultimate(
    field: EGNN,
    index: int,
    primal: tuple[Tensor, ...],
    tangents: tuple[Tensor, Tensor],
    layer: tuple[Tensor, ...],
    weights: tuple[Tensor, ...],
) -> tuple[Tensor, Tensor, Tensor, None, Tensor, tuple[Tensor, ...]]:
    r"""The last layer with a node update, its message tangents contracted with what the last layer reads.

    The last layer only reads the node-feature tangents through the trace, a linear functional
    :math:`\sum_{k,a} \langle \Lambda^{(k,a)}, v_h^{(k,a)} \rangle` whose coefficients are
    primal: :math:`\Lambda^{(k,a)}_j = \Delta_{kj,a}\, s_{kj}/(n-1)\; W_b^\top g_{kj}` for
    :math:`j \ne k` (:math:`\Delta, s` the last layer's differences and distance scales,
    :math:`g_{kj}` its pair gradient of the coordinate weight) and a sum over :math:`j` with
    :math:`W_a` for :math:`j = k`. The part of :math:`v_h` that comes from this layer's
    messages is therefore pulled back, in reverse mode, to this layer's first pre-activation,
    and because :math:`\Lambda^{(k,a)}_j` depends on the axis :math:`a` only through the
    scalar :math:`\Delta_{kj,a}`, one pull-back per particle ``k`` serves its ``d`` tangents.
    The message tangents of all pairs for every tangent (``n·d`` times the activations, the
    dense cost of a middle layer) are never formed; what is left is contracted with the node
    tangents, which are ``n`` times smaller. The rest of the last layer's reading of the node
    tangents, :math:`\langle \Lambda, v_h \rangle` through the node update's skip and its own
    block of :math:`W_{n0}`, is contracted here as well, so the last layer gets no node tangents.
    Returns the state, the node features, the state tangents, ``None`` for the node-feature
    tangents, the node tangents' whole share of the trace, and the last layer's primal (its pair
    differences, squared distances and pre-activations), which the caller reuses.
    """
    n, hid = field.n_particles, field.width
    x, h, d2_0, diff0 = primal
    vx, vh = tangents
    diff, scale, a1, a2, m, c1, c = layer
    batch = x.shape[0]
    edge, coord, node = field.edge[index], field.coord[index], field.node[index]
    offdiag = field._offdiag[..., 0].to(x.dtype)  # (n, n)
    g1, g2, g3 = silu_grad(a1), silu_grad(a2), silu_grad(c1)
    grad_a1 = preactivation_gradient(edge, g1, g2, message_gradient(coord, g3))
    # state tangents: the coordinate weights' tangents by dot products with their gradients
    vd2 = distance_tangent(vx, diff)
    d0 = 2 * diff0.permute(0, 1, 3, 2)  # (N, k, a, j): d d2_0[k, j] / dz_{k,a}
    vx = _contracted_state_tangent(vx, vh, vd2, d0, layer, grad_a1, weights)
    x = x + (diff * (c * scale)).sum(2) / (n - 1)
    # node update: the primal, and the tangent without the messages' part
    hh = h.expand(batch, n, hid)
    an = node[0](torch.cat((hh, (m * offdiag[..., None]).sum(2)), -1))
    gn = silu_grad(an)  # (N, i, hidden)
    h = hh + node[2](node[1](an))
    # what the last layer reads: its pair gradients at the updated state
    lprimal = _edge_primal(field, index + 1, x, h, d2_0)
    ldiff = lprimal[0]
    lam, lam_self = _last_reading(field, index + 1, lprimal)
    # the last layer's whole reading of the node tangents, but for this layer's messages: <Lambda + mu_node, v_h>
    dvh = torch.einsum("bkai,bkaih->bkih", ldiff.permute(0, 1, 3, 2), vh)  # sum_a Delta_{ki,a} v_h^{(k,a)}_i
    vh_kk = torch.diagonal(vh, dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, k, a, hidden): v_h^{(k,a)}_k
    extra, mu, mu_self = _node_share(node, gn, lam, lam_self, dvh, vh_kk)
    # ... and through this layer's message MLP, pair by pair (the aggregate sums over j != i)
    g1 = g1 * offdiag[:, :, None]  # the diagonal pair (i, i) is not in the aggregate
    r = mm(g2[:, None] * mu[:, :, :, None], edge[2].weight.T)  # (N, k, i, j, hidden)
    r = r.mul_(g1[:, None]) if not r.requires_grad else r * g1[:, None]
    r_self = g1[:, :, None] * mm(g2[:, :, None] * mu_self[:, :, :, None], edge[2].weight.T)  # j != k
    extra = _message_share(extra, (r, r_self), ldiff, (vh, dvh, vh_kk, vd2, d0), weights)
    return x, h, vx, None, extra, lprimal


def _contracted_state_tangent(
    vx: Tensor,
    vh: Tensor,
    vd2: Tensor,
    d0: Tensor,
    layer: tuple[Tensor, ...],
    grad_a1: Tensor,
    weights: tuple[Tensor, ...],
) -> Tensor:
    """The state tangents after the contracted layer: coordinate-weight tangents as dot products with ``grad_a1``."""
    diff, scale, _, _, _, _, c = layer
    wa, wb, w_d2, w_d2_0 = weights
    n = diff.shape[1]
    g0 = (grad_a1 * w_d2_0).sum(-1)  # (N, i, j)
    vc = (
        torch.einsum("bijh,bkaih->bkaij", mm(grad_a1, wa.T), vh)
        + torch.einsum("bijh,bkajh->bkaij", mm(grad_a1, wb.T), vh)
        + (grad_a1 * w_d2).sum(-1)[:, None, None] * vd2
    )
    torch.diagonal(vc, dim1=1, dim2=3).add_((g0[:, :, None] * d0).permute(0, 2, 3, 1))  # i = k
    torch.diagonal(vc, dim1=1, dim2=4).add_((g0.transpose(1, 2)[:, :, None] * d0).permute(0, 2, 3, 1))  # j = k
    cs = (c * scale)[..., 0]
    q = vc * scale[..., 0][:, None, None] - 0.5 * (c * scale.pow(3))[..., 0][:, None, None] * vd2
    return _move_tangent(vx, cs, diff, q, n)


def _last_reading(field: EGNN, index: int, lprimal: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    r"""The last layer's trace coefficients: :math:`\Lambda^{(k,a)}_j / \Delta_{kj,a}` (``j != k``) and ``j = k``."""
    n, hid = field.n_particles, field.width
    last, lcoord = field.edge[index], field.coord[index]
    ldiff, ld2, la1, la2, _, lc1 = lprimal
    lgrad = preactivation_gradient(last, silu_grad(la1), silu_grad(la2), message_gradient(lcoord, silu_grad(lc1)))
    lw = last[0].weight
    beta = (ld2 + 1).rsqrt() / (n - 1)  # (N, k, j, 1)
    lam = beta * mm(lgrad, lw[:, hid : 2 * hid].T)  # Lambda^{(k,a)}_j / Delta_{kj,a}, j != k
    lam_self = torch.einsum("bkja,bkjh->bkah", ldiff * beta, mm(lgrad, lw[:, :hid].T))  # Lambda^{(k,a)}_k
    return lam, lam_self


def _node_share(
    node: nn.Sequential, gn: Tensor, lam: Tensor, lam_self: Tensor, dvh: Tensor, vh_kk: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The trace read through the node update's skip and own block, and the pull-backs ``mu`` to its aggregate."""
    hid = gn.shape[-1]
    w_n = node[0].weight
    # pull back through the node update (W_n2, SiLU', the aggregate's block of W_n0) ...
    mu_node, mu = mm(gn[:, None] * mm(lam, node[2].weight.T), w_n.T).split(hid, -1)  # (N, k, i, hidden)
    mu_node_self, mu_self = mm(gn[:, :, None] * mm(lam_self, node[2].weight.T), w_n.T).split(hid, -1)  # (N, k, a, h)
    extra = ((lam + mu_node) * dvh).sum((1, 2, 3)) + ((lam_self + mu_node_self) * vh_kk).sum((1, 2, 3))
    return extra, mu, mu_self


def _message_share(
    extra: Tensor,
    pullbacks: tuple[Tensor, Tensor],
    ldiff: Tensor,
    reads: tuple[Tensor, ...],
    weights: tuple[Tensor, ...],
) -> Tensor:
    """Add the message pull-backs ``r``, ``r_self`` contracted with the first pre-activation's tangent.

    That tangent is ``W_a v_i + W_b v_j + w_d2 vd2_ij + w_d2_0 vd2_0_ij``; ``reads`` holds ``v_h``,
    its contraction ``dvh`` with the last layer's differences, its diagonal ``vh_kk``, the distance
    tangents ``vd2`` and ``d0 = d d2_0[k, j] / dz_{k,a}``.
    """
    r, r_self = pullbacks
    vh, dvh, vh_kk, vd2, d0 = reads
    wa, wb, w_d2, w_d2_0 = weights
    dk = ldiff.permute(0, 1, 3, 2)  # (N, k, a, i): Delta_{ki,a}
    # W_a v_i: the pull-backs summed over j, the axes folded into dvh as above
    extra = extra + (mm(r.sum(3), wa.T) * dvh).sum((1, 2, 3)) + (mm(r_self.sum(3), wa.T) * vh_kk).sum((1, 2, 3))
    v = torch.einsum("bkai,bkijh->bkajh", dk, r) + r_self  # W_b v_j: summed over i, (N, k, a, j, h)
    extra = extra + (mm(v, wb.T) * vh).sum((1, 2, 3, 4))
    w_dist = torch.stack((w_d2, w_d2_0))  # the distance columns, as one product
    rd2, r0 = mm(r, w_dist).unbind(-1)  # (N, k, i, j)
    rd2_self, r0_self = mm(r_self, w_dist).unbind(-1)  # (N, k, a, j)
    extra = extra + (vd2 * dk[..., None] * rd2[:, :, None]).sum((1, 2, 3, 4))
    extra = extra + (torch.diagonal(vd2, dim1=1, dim2=3).permute(0, 3, 1, 2) * rd2_self).sum((1, 2, 3))
    extra = extra + (r0_self * d0).sum((1, 2, 3))  # i = k: d d2_0[k, j] = 2 diff0[k, j, a]
    r0_kik = torch.diagonal(r0, dim1=1, dim2=3).transpose(1, 2)  # (N, k, i): pair (i, k) of pull-back k
    extra = extra + (dk * r0_kik[:, :, None] * d0).sum((1, 2, 3))  # j = k: d d2_0[i, k] = 2 diff0[k, i, a]
    return extra
