r"""An E(n)-equivariant graph network as the time-dependent vector field of a continuous flow over particles."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from flows.nn._particles import _check_sizes, remove_mean

__all__ = ["EGNN"]


def _mlp(sizes: list[int], activation: type[nn.Module], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if k < len(sizes) - 2 or last_activation:
            layers.append(activation())
    return nn.Sequential(*layers)


def _linear_jvp(layer: nn.Linear, a: Tensor, va: Tensor) -> tuple[Tensor, Tensor]:
    return layer(a), va @ layer.weight.T


def _mm(a: Tensor, w: Tensor) -> Tensor:
    """``a @ w.T`` as one two-dimensional matrix product (batched matmuls over many leading axes are slower)."""
    return (a.reshape(-1, a.shape[-1]) @ w.T).reshape(*a.shape[:-1], w.shape[0])


def _edge_tangents(
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
    g1, g2, g3 = (_silu_grad(a) for a in pre)
    gm = _mm(g3 * coord[2].weight[0], coord[0].weight.T)  # d c / d m, (..., hidden) on the primal
    if not messages:
        ga = g1 * _mm(g2 * gm, edge[2].weight.T)  # d c / d a1
        return None, (va * ga).sum(-1, keepdim=True)
    if va.requires_grad:
        vm = g2 * _mm(g1 * va, edge[2].weight)
    else:
        vm = _mm(va.mul_(g1), edge[2].weight).mul_(g2)
    return vm, (vm * gm).sum(-1, keepdim=True)


def _silu_grad(a: Tensor) -> Tensor:
    s = torch.sigmoid(a)
    return s * (1 + a * (1 - s))


def _silu_jvp(a: Tensor, va: Tensor) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(a)
    return a * s, va * (s * (1 + a * (1 - s)))


class EGNN(nn.Module):
    r"""Time-conditioned E(n)-equivariant graph network (Satorras, Hoogeboom, Welling 2021) on a complete graph.

    The state is a flat configuration ``z`` of shape ``(N, n·d)`` (particle-major); every particle
    is identical and starts with the node feature :math:`h_i^0 = \phi_t(t)` (an MLP of
    :math:`[t, \cos\pi t, \sin\pi t]`). Each of the ``layers`` layers updates, over ordered pairs
    :math:`i \ne j`,

    .. math::
        m_{ij} &= \phi_e\big(h_i, h_j, \|x_i - x_j\|^2, \|x^0_i - x^0_j\|^2\big), \\
        x_i &\leftarrow x_i + \frac{1}{n-1} \sum_{j \ne i}
            \frac{x_i - x_j}{\sqrt{\|x_i - x_j\|^2 + 1}}\, \phi_x(m_{ij}), \\
        h_i &\leftarrow h_i + \phi_h\big(h_i, \textstyle\sum_{j \ne i} m_{ij}\big),

    and the field is :math:`f(t, z) = P(x^L - x^0)` with :math:`P` the projection onto the
    zero-centre-of-mass subspace (:func:`~flows.particles.remove_mean`). It only sees differences
    and distances, so for any permutation :math:`\sigma` of the particles, orthogonal matrix
    :math:`R` (rotations and reflections) and translation :math:`c`,
    :math:`f(t, \sigma(Rz + c)) = \sigma(R f(t, z))`: equivariant, translation invariant and
    mean free. Because :math:`f` is translation invariant and mean free, its Jacobian satisfies
    :math:`J = P J P`, so the trace over all :math:`n d` coordinates equals the trace over the
    :math:`(n-1)d`-dimensional subspace (the dimension bookkeeping of ``docs/particles.md``). The
    distance normalisation :math:`1/\sqrt{\|\cdot\|^2 + 1}` keeps the field smooth everywhere (as
    in E-NF's stabilised coordinate update). SiLU activations throughout (smooth, so adaptive
    solvers stay efficient); the last layer of :math:`\phi_x` starts small (Xavier gain 0.001, as in
    the reference code) so the flow starts near the identity.

    ``t`` is a scalar tensor (ODE solves) or one time per sample, shape ``(N,)`` (flow matching).
    The pairs are laid out densely, all :math:`n^2` ordered pairs by broadcasting (the diagonal
    has :math:`x_i - x_i = 0`, moves nothing and is masked out of the message sums), which avoids
    gathers and scatters. :meth:`divergence` returns the field and its exact divergence in one
    forward-mode pass that propagates the basis tangents only where they reach the trace (what
    :class:`~flows.CNF` uses for the exact trace); :meth:`jvp` returns a stack of arbitrary
    Jacobian-vector products (Hutchinson traces, Jacobian Frobenius norms).

    References:
        Satorras, Hoogeboom, Welling (2021), "E(n) Equivariant Graph Neural Networks", ICML,
        arXiv:2102.09844. Satorras, Hoogeboom, Fuchs, Posner, Welling (2021), "E(n) Equivariant
        Normalizing Flows", NeurIPS, arXiv:2105.09016. Klein, Krämer, Noé (2023), "Equivariant flow
        matching", NeurIPS, arXiv:2306.15030.

    Args:
        n_particles: number of particles ``n``.
        spatial_dim: spatial dimension ``d``.
        hidden: width of node features and messages.
        layers: number of message-passing layers.

    Example:
        >>> import torch
        >>> field = EGNN(4, 2, hidden=8, layers=2)
        >>> z = torch.randn(5, 8)
        >>> f = field(torch.tensor(0.3), z)
        >>> f.shape, bool(f.unflatten(-1, (4, 2)).sum(-2).abs().max() < 1e-5)
        (torch.Size([5, 8]), True)
        >>> swap = torch.tensor([2, 3, 0, 1, 4, 5, 6, 7])  # particles 0 and 1 exchanged
        >>> torch.allclose(field(torch.tensor(0.3), z[:, swap]), f[:, swap], atol=1e-6)
        True
    """

    divergence_chunk: int = 2**22
    """Elements of the dense tangent tensor of :meth:`divergence` per chunk of the batch (cache-sized)."""

    contract_from: int = 18
    """:meth:`divergence` contracts the last node update with the last layer (:meth:`_penultimate`) from
    this many coordinates ``n·d`` on; below, its handful of extra operations cost more than they save."""

    def __init__(self, n_particles: int, spatial_dim: int, *, hidden: int = 32, layers: int = 3) -> None:
        super().__init__()
        _check_sizes(n_particles, spatial_dim, "EGNN")
        for name, value in (("hidden", hidden), ("layers", layers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EGNN: expected {name} to be a positive int, got {value!r}")
        self.n_particles, self.spatial_dim, self.hidden, self.layers = n_particles, spatial_dim, hidden, layers
        n = n_particles
        rows = torch.arange(n).repeat_interleave(n - 1)  # pairs grouped by i: (0,1), (0,2), ..., (1,0), ...
        cols = torch.tensor([j for i in range(n) for j in range(n) if j != i])
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)
        self.register_buffer("_offdiag", (1 - torch.eye(n))[:, :, None], persistent=False)
        act = nn.SiLU
        self.embed = _mlp([3, hidden, hidden], act, last_activation=False)
        self.edge = nn.ModuleList(_mlp([2 * hidden + 2, hidden, hidden], act, True) for _ in range(layers))
        # the last layer's node update would not reach the output: there are layers - 1 of them
        self.node = nn.ModuleList(_mlp([2 * hidden, hidden, hidden], act, False) for _ in range(layers - 1))
        self.coord = nn.ModuleList(_mlp([hidden, hidden, 1], act, False) for _ in range(layers))
        for c in self.coord:
            nn.init.xavier_uniform_(c[-1].weight, gain=0.001)
            nn.init.zeros_(c[-1].bias)

    def _check(self, t: Tensor, z: Tensor, who: str) -> tuple[Tensor, torch.Size]:
        t = torch.as_tensor(t, dtype=z.dtype, device=z.device)
        features = self.n_particles * self.spatial_dim
        if z.dim() < 1 or z.shape[-1] != features:
            raise ValueError(f"EGNN.{who}: expected z of shape (*batch, {features}), got {tuple(z.shape)}")
        shape = z.shape[:-1]
        if t.dim() != 0 and t.shape != shape:
            raise ValueError(f"EGNN.{who}: expected t of shape () or {tuple(shape)}, got {tuple(t.shape)}")
        return t, shape

    def _embed(self, t: Tensor, shape: torch.Size, batch: int) -> Tensor:
        """Node features of layer 0, ``(N, 1, hidden)``: the time embedding, the same for every particle."""
        t = t.expand(shape).reshape(batch)[:, None]
        return self.embed(torch.cat((t, torch.cos(math.pi * t), torch.sin(math.pi * t)), -1))[:, None, :]

    def _edge_input(self, index: int, h: Tensor, d2: Tensor, d2_0: Tensor) -> Tensor:
        r"""Pre-activation of the first edge layer on all ordered pairs, ``(N, n, n, hidden)``.

        :math:`W [h_i, h_j, d^2_{ij}, d^{2,0}_{ij}] + b` split into its node parts
        :math:`W_a h_i + W_b h_j` (computed once per node, broadcast over pairs) and its two
        distance columns: the same function as the concatenated layer, with the node-level
        products ``n - 1`` times cheaper.
        """
        first, hid = self.edge[index][0], self.hidden
        w = first.weight
        hi = torch.nn.functional.linear(h, w[:, :hid], first.bias)
        hj = h @ w[:, hid : 2 * hid].T
        return hi[:, :, None] + hj[:, None, :] + d2 * w[:, -2] + d2_0 * w[:, -1]

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        """The field ``(*batch, n·d)`` at times ``t`` (``()`` or ``batch``) and states ``z`` (``(*batch, n·d)``)."""
        t, shape = self._check(t, z, "forward")
        features = self.n_particles * self.spatial_dim
        z = z.reshape(-1, features)
        n, batch = self.n_particles, z.shape[0]
        x0 = z.unflatten(-1, (n, self.spatial_dim))
        h = self._embed(t, shape, batch)
        # all n^2 ordered pairs; the diagonal has diff = 0, so it moves nothing and is masked out of
        # the message sums (dense broadcasting instead of gathers and scatters of the n(n-1) pairs)
        offdiag = self._offdiag.to(z.dtype)
        d2_0 = (x0[:, :, None] - x0[:, None, :]).square().sum(-1, keepdim=True)
        x = x0
        for index, (edge, coord) in enumerate(zip(self.edge, self.coord, strict=True)):
            diff = x[:, :, None] - x[:, None, :]  # (N, n, n, d): x_i - x_j
            d2 = diff.square().sum(-1, keepdim=True)
            m = edge[3](edge[2](edge[1](self._edge_input(index, h, d2, d2_0))))
            shift = diff * (coord(m) * (d2 + 1).rsqrt())
            x = x + shift.sum(2) / (n - 1)
            if index < len(self.node):
                h = h + self.node[index](torch.cat((h.expand(batch, n, self.hidden), (m * offdiag).sum(2)), -1))
        return remove_mean((x - x0).flatten(-2), n, self.spatial_dim).reshape(*shape, features)

    def divergence(self, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        r"""The field and its exact divergence :math:`\operatorname{tr} \partial f / \partial z`, in forward mode.

        The ``n·d`` basis tangents :math:`e_{k,a}` (particle ``k``, axis ``a``) are propagated by
        hand as in :meth:`jvp`, but only where they can reach the trace:

        * **first layer**: every node starts with the same features (the time embedding), so the
          layer is symmetric in :math:`i \leftrightarrow j` and the tangent of :math:`e_{k,a}`
          lives on the pairs of row :math:`k` alone (:math:`2(n-1)` pairs, the column being its
          mirror), not on all :math:`n^2`;
        * **middle layers**: dense (every pair sees every particle through the node features);
        * **last layer**: only the diagonal entry :math:`\partial f_{k,a} / \partial z_{k,a}` is
          needed, which the pairs :math:`(k, j)` alone update: ``n`` pairs per tangent;
        * **coordinate weights**: each pair's :math:`\phi_x(m_{ij})` is a scalar, so its tangent is
          a dot product with its gradient, formed once per pair on the primal, instead of a
          matrix product per tangent (in the last layer no tangent meets a matrix at all).

        With :math:`L` layers that is :math:`2n + (L-2)\,n^2 + n` pair-tangents instead of
        :math:`L n^2` (LJ13, 3 layers: 208 against 507). The mean-free projection does not
        change the trace: :math:`\operatorname{tr}(P J) = \operatorname{tr} J` because
        :math:`J` maps the translation directions to zero. The value is the trace of the
        Jacobian of :meth:`forward`, tested against autograd in float64.

        Args:
            t: time, ``()`` or ``(N,)``.
            z: states ``(N, n·d)``.

        Returns:
            ``(f, div)`` of shapes ``(N, n·d)`` and ``(N,)``; differentiable.
        """
        t, shape = self._check(t, z, "divergence")
        if z.dim() != 2:
            raise ValueError(f"EGNN.divergence: expected z of shape (N, n·d), got {tuple(z.shape)}")
        chunk = max(1, self.divergence_chunk // (self.n_particles**3 * self.spatial_dim * self.hidden))
        if z.shape[0] > chunk:  # the dense tangents are n·d times the activations: keep them in cache
            t = t.expand(shape)
            parts = [self._divergence(t[i : i + chunk], z[i : i + chunk]) for i in range(0, z.shape[0], chunk)]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return self._divergence(t, z)

    def _divergence(self, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        shape = z.shape[:-1]
        n, d, hid, batch = self.n_particles, self.spatial_dim, self.hidden, z.shape[0]
        x0 = z.unflatten(-1, (n, d))
        h = self._embed(t, shape, batch)
        offdiag = self._offdiag.to(z.dtype)
        eye_n = torch.eye(n, dtype=z.dtype, device=z.device)
        eye_d = torch.eye(d, dtype=z.dtype, device=z.device)
        ones_row = offdiag.reshape(1, n, 1, n, 1) * eye_d.reshape(1, 1, d, 1, d)  # d(x_k - x_j)/dz_{k,a} = e_a, j != k
        diff0 = x0[:, :, None] - x0[:, None, :]
        d2_0 = diff0.square().sum(-1, keepdim=True)
        vd2_0_row = 2 * diff0.transpose(-1, -2)[..., None]  # (N, k, a, j, 1): d d2_0[k, j] / dz_{k,a}
        x, vx, vh = x0, None, None  # tangents: (N, k, a, i, d) and (N, k, a, i, hidden)
        trace = z.new_zeros(batch)
        for index, (edge, coord) in enumerate(zip(self.edge, self.coord, strict=True)):
            diff = x[:, :, None] - x[:, None, :]
            d2 = diff.square().sum(-1, keepdim=True)
            a1 = self._edge_input(index, h, d2, d2_0)
            m1 = edge[1](a1)
            a2 = edge[2](m1)
            m = edge[3](a2)
            c1 = coord[0](m)
            c = coord[2](coord[1](c1))
            scale = (d2 + 1).rsqrt()
            w = edge[0].weight  # its column blocks as contiguous copies: strided operands are slow
            wa, wb = w[:, :hid].contiguous(), w[:, hid : 2 * hid].contiguous()
            w_d2, w_d2_0 = w[:, -2].contiguous(), w[:, -1].contiguous()
            last = index == self.layers - 1
            if index > 0 and index == self.layers - 2 and n * d >= self.contract_from:  # contracted, see below
                x, h, vx, vh, extra = self._penultimate(
                    index, (x, h, d2_0, diff0), (vx, vh), (diff, scale, a1, a2, m, c1, c)
                )
                trace = trace + extra
                continue
            if index == 0 or last:  # tangents on the pairs (k, j) of row k only
                row = (slice(None), slice(None), None)  # primal (N, k, j, .) -> (N, k, 1, j, .)
                if vx is None:
                    vdiff = ones_row
                    vd2 = vd2_0_row
                else:
                    vx_kk = torch.diagonal(vx, dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, k, a, d)
                    vdiff = vx_kk[:, :, :, None, :] - vx
                    vd2 = 2 * (diff[row] * vdiff).sum(-1, keepdim=True)
                va = vd2 * w_d2 + vd2_0_row * w_d2_0
                if vh is not None:
                    vh_kk = torch.diagonal(vh, dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, k, a, hidden)
                    va = va + _mm(vh_kk, wa)[:, :, :, None, :] + _mm(vh, wb)
            else:  # dense: all pairs (i, j), in as few passes over the big tangent tensors as possible
                row = (slice(None), None, None)  # primal (N, i, j, .) -> (N, 1, 1, i, j, .)
                # d d2[i, j] = 2 diff_ij . (v_i - v_j), without forming v_i - v_j
                vd2 = (
                    2
                    * (torch.einsum("bkaid,bijd->bkaij", vx, diff) - torch.einsum("bkajd,bijd->bkaij", vx, diff))[
                        ..., None
                    ]
                )
                va = (_mm(vh, wa)[..., :, None, :] + _mm(vh, wb)[..., None, :, :]).addcmul_(vd2, w_d2)
                # d d2_0[i, j] / dz_{k,a} = 2 diff0[i, j, a] (delta_ik - delta_jk): only row k and column k,
                # both equal to 2 diff0[k, ., a] (d2_0 is symmetric)
                g = (2 * diff0.transpose(-1, -2))[..., None] * w_d2_0  # (N, k, a, j, hidden)
                torch.diagonal(va, dim1=1, dim2=3).add_(g.permute(0, 2, 3, 4, 1))
                torch.diagonal(va, dim1=1, dim2=4).add_(g.permute(0, 2, 3, 4, 1))
                vm, vc = _edge_tangents(edge, coord, (a1[row], a2[row], c1[row]), va)
                # sum_j of the shift's tangent (v_i - v_j) c s + diff (vc s + c ds), node by node
                cs = (c * scale)[..., 0]  # (N, i, j)
                q = (vc * scale[row] - 0.5 * c[row] * scale[row].pow(3) * vd2)[..., 0]  # (N, k, a, i, j)
                vx = vx + (
                    vx * cs.sum(-1)[:, None, None, :, None]
                    - torch.einsum("bij,bkajd->bkaid", cs, vx)
                    + torch.einsum("bijd,bkaij->bkaid", diff, q)
                ) / (n - 1)
                vagg = vm.sum(-2) - torch.diagonal(vm, dim1=-3, dim2=-2).transpose(-1, -2)
                x = x + (diff * (c * scale)).sum(2) / (n - 1)
            if index == 0 or last:
                vm, vc = _edge_tangents(edge, coord, (a1[row], a2[row], c1[row]), va, messages=not last)
                vscale = -0.5 * scale[row].pow(3) * vd2
                vshift = vdiff * (c * scale)[row] + diff[row] * (vc * scale[row] + c[row] * vscale)
                x = x + (diff * (c * scale)).sum(2) / (n - 1)
                if last:
                    # d f_{k,a} / d z_{k,a}: the k-th row's own shift, plus the incoming tangent, minus the identity
                    trace = trace + torch.diagonal(vshift, dim1=2, dim2=4).sum((1, 2, 3)) / (n - 1)
                    if vx is not None:
                        vx_kk = torch.diagonal(vx, dim1=1, dim2=3).permute(0, 3, 1, 2)
                        trace = trace + torch.diagonal(vx_kk, dim1=2, dim2=3).sum((1, 2)) - n * d
                    break
                # node k moves by its whole row; node i != k by the mirrored pair (i, k) = -(k, i)
                own = eye_d + vshift.sum(3) / (n - 1)  # (N, k, a, d)
                vx = -vshift / (n - 1) + eye_n.reshape(1, n, 1, n, 1) * own[:, :, :, None, :]
                vagg = vm + eye_n.reshape(1, n, 1, n, 1) * vm.sum(3, keepdim=True)
            node = self.node[index]
            hh = h.expand(batch, n, hid)
            an = node[0](torch.cat((hh, (m * offdiag).sum(2)), -1))
            vn = _mm(vagg, node[0].weight[:, hid:].contiguous())
            if vh is not None:
                vn = vn + _mm(vh, node[0].weight[:, :hid].contiguous())
            vb = _mm(_silu_grad(an)[:, None, None] * vn, node[2].weight)
            h = hh + node[2](node[1](an))
            vh = vb if vh is None else vh + vb
        f = remove_mean((x - x0).flatten(-2), n, d)
        return f, trace

    def _penultimate(
        self, index: int, primal: tuple[Tensor, ...], tangents: tuple[Tensor, Tensor], layer: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
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
        tangents, which are ``n`` times smaller. Returns the state, the node features, the state
        tangents, the node-feature tangents *without* this layer's messages, and the contracted
        messages' share of the trace.
        """
        n, hid = self.n_particles, self.hidden
        x, h, d2_0, diff0 = primal
        vx, vh = tangents
        diff, scale, a1, a2, m, c1, c = layer
        batch = x.shape[0]
        edge, coord, node = self.edge[index], self.coord[index], self.node[index]
        offdiag = self._offdiag[..., 0].to(x.dtype)  # (n, n)
        w = edge[0].weight
        wa, wb = w[:, :hid].contiguous(), w[:, hid : 2 * hid].contiguous()
        w_d2, w_d2_0 = w[:, -2].contiguous(), w[:, -1].contiguous()
        g1, g2, g3 = _silu_grad(a1), _silu_grad(a2), _silu_grad(c1)
        grad_a1 = g1 * _mm(g2 * _mm(g3 * coord[2].weight[0], coord[0].weight.T), edge[2].weight.T)  # dc/da1
        # state tangents: the coordinate weights' tangents by dot products with their gradients
        vd2 = 2 * (torch.einsum("bkaid,bijd->bkaij", vx, diff) - torch.einsum("bkajd,bijd->bkaij", vx, diff))
        g0 = (grad_a1 * w_d2_0).sum(-1)  # (N, i, j)
        d0 = 2 * diff0.permute(0, 1, 3, 2)  # (N, k, a, j): d d2_0[k, j] / dz_{k,a}
        vc = (
            torch.einsum("bijh,bkaih->bkaij", _mm(grad_a1, wa.T), vh)
            + torch.einsum("bijh,bkajh->bkaij", _mm(grad_a1, wb.T), vh)
            + (grad_a1 * w_d2).sum(-1)[:, None, None] * vd2
        )
        torch.diagonal(vc, dim1=1, dim2=3).add_((g0[:, :, None] * d0).permute(0, 2, 3, 1))  # i = k
        torch.diagonal(vc, dim1=1, dim2=4).add_((g0.transpose(1, 2)[:, :, None] * d0).permute(0, 2, 3, 1))  # j = k
        cs = (c * scale)[..., 0]
        q = vc * scale[..., 0][:, None, None] - 0.5 * (c * scale.pow(3))[..., 0][:, None, None] * vd2
        vx = vx + (
            vx * cs.sum(-1)[:, None, None, :, None]
            - torch.einsum("bij,bkajd->bkaid", cs, vx)
            + torch.einsum("bijd,bkaij->bkaid", diff, q)
        ) / (n - 1)
        x = x + (diff * (c * scale)).sum(2) / (n - 1)
        # node update: the primal, and the tangent without the messages' part
        hh = h.expand(batch, n, hid)
        an = node[0](torch.cat((hh, (m * offdiag[..., None]).sum(2)), -1))
        gn = _silu_grad(an)  # (N, i, hidden)
        w_n = node[0].weight
        vh_part = vh + _mm(gn[:, None, None] * _mm(vh, w_n[:, :hid].contiguous()), node[2].weight)
        h = hh + node[2](node[1](an))
        # what the last layer reads: its pair gradients at the updated state
        last, lcoord = self.edge[index + 1], self.coord[index + 1]
        ldiff = x[:, :, None] - x[:, None, :]
        ld2 = ldiff.square().sum(-1, keepdim=True)
        la1 = self._edge_input(index + 1, h, ld2, d2_0)
        la2 = last[2](last[1](la1))
        lc1 = lcoord[0](last[3](la2))
        lgrad = _silu_grad(la1) * _mm(
            _silu_grad(la2) * _mm(_silu_grad(lc1) * lcoord[2].weight[0], lcoord[0].weight.T), last[2].weight.T
        )  # (N, k, j, hidden)
        lw = last[0].weight
        beta = (ld2 + 1).rsqrt() / (n - 1)  # (N, k, j, 1)
        lam = beta * _mm(lgrad, lw[:, hid : 2 * hid].T)  # Lambda^{(k,a)}_j / Delta_{kj,a}, j != k
        lam_self = torch.einsum("bkja,bkjh->bkah", ldiff * beta, _mm(lgrad, lw[:, :hid].T))  # Lambda^{(k,a)}_k
        # pull back through the node update (W_n2, SiLU', the aggregate's block of W_n0) ...
        w_agg = w_n[:, hid:].contiguous()
        mu = _mm(gn[:, None] * _mm(lam, node[2].weight.T), w_agg.T)  # (N, k, i, hidden)
        mu_self = _mm(gn[:, :, None] * _mm(lam_self, node[2].weight.T), w_agg.T)  # (N, k, a, hidden)
        # ... and through this layer's message MLP, pair by pair (the aggregate sums over j != i)
        g1 = g1 * offdiag[:, :, None]  # the diagonal pair (i, i) is not in the aggregate
        r = _mm(g2[:, None] * mu[:, :, :, None], edge[2].weight.T)  # (N, k, i, j, hidden)
        r = r.mul_(g1[:, None]) if not r.requires_grad else r * g1[:, None]
        r_self = g1[:, :, None] * _mm(g2[:, :, None] * mu_self[:, :, :, None], edge[2].weight.T)  # j != k
        # contract with the first pre-activation's tangent W_a v_i + W_b v_j + w_d2 vd2_ij + w_d2_0 vd2_0_ij
        dk = ldiff.permute(0, 1, 3, 2)  # (N, k, a, i): Delta_{ki,a}
        eye = torch.eye(n, dtype=x.dtype, device=x.device)[None, :, None, :, None]
        u = dk[..., None] * r.sum(3)[:, :, None] + eye * r_self.sum(3)[:, :, :, None]  # sum over j, (N, k, a, i, h)
        v = torch.einsum("bkai,bkijh->bkajh", dk, r) + r_self  # sum over i, (N, k, a, j, h)
        extra = (_mm(u, wa.T) * vh).sum((1, 2, 3, 4)) + (_mm(v, wb.T) * vh).sum((1, 2, 3, 4))
        w_dist = torch.stack((w_d2, w_d2_0))  # the distance columns, as one product
        rd2, r0 = _mm(r, w_dist).unbind(-1)  # (N, k, i, j)
        rd2_self, r0_self = _mm(r_self, w_dist).unbind(-1)  # (N, k, a, j)
        extra = extra + (vd2 * dk[..., None] * rd2[:, :, None]).sum((1, 2, 3, 4))
        extra = extra + (torch.diagonal(vd2, dim1=1, dim2=3).permute(0, 3, 1, 2) * rd2_self).sum((1, 2, 3))
        extra = extra + (r0_self * d0).sum((1, 2, 3))  # i = k: d d2_0[k, j] = 2 diff0[k, j, a]
        r0_kik = torch.diagonal(r0, dim1=1, dim2=3).transpose(1, 2)  # (N, k, i): pair (i, k) of pull-back k
        extra = extra + (dk * r0_kik[:, :, None] * d0).sum((1, 2, 3))  # j = k: d d2_0[i, k] = 2 diff0[k, i, a]
        return x, h, vx, vh_part, extra

    def jvp(self, t: Tensor, z: Tensor, tangents: Tensor) -> tuple[Tensor, Tensor]:
        r"""The field and :math:`J v` for a stack of tangents, propagated through the layers in forward mode.

        Tangents are carried through every operation by hand (``v ← v Wᵀ`` through a linear layer,
        ``v ← σ'(a) ⊙ v`` through SiLU, product rules through the coordinate update), all ``K``
        at once, as :class:`~flows.nn.TimeMLP` does: one pass for the exact trace, differentiable
        with first-order backpropagation. The time embedding does not depend on ``z``, so the
        first layer's node features carry no tangent and its edge tangents are only those of the
        two distance inputs.

        Args:
            t: time, ``()`` or ``(N,)``.
            z: states ``(N, n·d)``.
            tangents: ``(K, N or 1, n·d)``.

        Returns:
            ``(f, jv)`` of shapes ``(N, n·d)`` and ``(K, N, n·d)``.
        """
        t = torch.as_tensor(t, dtype=z.dtype, device=z.device)
        features = self.n_particles * self.spatial_dim
        if z.dim() != 2 or z.shape[-1] != features:
            raise ValueError(f"EGNN.jvp: expected z of shape (N, {features}), got {tuple(z.shape)}")
        if tangents.dim() != 3 or tangents.shape[-1] != features or tangents.shape[1] not in (1, z.shape[0]):
            raise ValueError(
                f"EGNN.jvp: expected tangents of shape (K, {z.shape[0]} or 1, {features}), got {tuple(tangents.shape)}"
            )
        n, d, batch, k = self.n_particles, self.spatial_dim, z.shape[0], tangents.shape[0]
        x0 = z.unflatten(-1, (n, d))
        v0 = tangents.expand(k, batch, features).unflatten(-1, (n, d))
        tt = t.expand(batch)[:, None]
        h = self.embed(torch.cat((tt, torch.cos(math.pi * tt), torch.sin(math.pi * tt)), -1))
        h = h[:, None, :].expand(batch, n, self.hidden)
        vh: Tensor | None = None  # tangent of h: none until the first node update
        rows, cols = self._rows, self._cols
        diff0 = x0[:, rows] - x0[:, cols]
        vdiff0 = v0[:, :, rows] - v0[:, :, cols]
        d2_0 = diff0.square().sum(-1, keepdim=True)
        vd2_0 = 2 * (diff0 * vdiff0).sum(-1, keepdim=True)
        x, v = x0, v0
        for index, (edge, coord) in enumerate(zip(self.edge, self.coord, strict=True)):
            diff = x[:, rows] - x[:, cols]
            vdiff = v[:, :, rows] - v[:, :, cols]
            d2 = diff.square().sum(-1, keepdim=True)
            vd2 = 2 * (diff * vdiff).sum(-1, keepdim=True)
            # edge MLP: Linear, SiLU, Linear, SiLU on [h_i, h_j, d2, d2_0]
            first = edge[0]
            a = first(torch.cat((h[:, rows], h[:, cols], d2, d2_0), -1))
            w = first.weight
            va = vd2 * w[:, -2] + vd2_0 * w[:, -1]
            if vh is not None:  # multiply at the n nodes, then gather to the n(n-1) pairs
                hid = self.hidden
                va = va + (vh @ w[:, :hid].T)[:, :, rows] + (vh @ w[:, hid : 2 * hid].T)[:, :, cols]
            m, vm = _silu_jvp(a, va)
            m, vm = _silu_jvp(*_linear_jvp(edge[2], m, vm))
            # coordinate MLP: Linear, SiLU, Linear
            c, vc = _silu_jvp(*_linear_jvp(coord[0], m, vm))
            c, vc = _linear_jvp(coord[2], c, vc)
            scale = (d2 + 1).rsqrt()
            vscale = -0.5 * scale.pow(3) * vd2
            shift = diff * (c * scale)
            vshift = vdiff * (c * scale) + diff * (vc * scale + c * vscale)
            x = x + shift.unflatten(1, (n, n - 1)).mean(2)
            v = v + vshift.unflatten(2, (n, n - 1)).mean(3)
            if index == len(self.node):
                break
            # node MLP: Linear, SiLU, Linear on [h, sum_j m_ij]
            node = self.node[index]
            agg, vagg = m.unflatten(1, (n, n - 1)).sum(2), vm.unflatten(2, (n, n - 1)).sum(3)
            first = node[0]
            a = first(torch.cat((h, agg), -1))
            va = vagg @ first.weight[:, self.hidden :].T
            if vh is not None:
                va = va + vh @ first.weight[:, : self.hidden].T
            b, vb = _linear_jvp(node[2], *_silu_jvp(a, va))
            h = h + b
            vh = vb if vh is None else vh + vb
        f = remove_mean((x - x0).flatten(-2), n, d)
        jv = remove_mean((v - v0).flatten(-2), n, d)
        return f, jv

    def extra_repr(self) -> str:
        sizes = f"n_particles={self.n_particles}, spatial_dim={self.spatial_dim}"
        return f"{sizes}, hidden={self.hidden}, layers={self.layers}"
