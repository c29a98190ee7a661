r"""An E(n)-equivariant graph network as the time-dependent vector field of a continuous flow over particles."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from flows._validation import check_count
from flows.nn._egnn_tangents import exact_divergence, linear_jvp, silu_jvp
from flows.nn._particles import _check_sizes, remove_mean

__all__ = ["EGNN"]

_COMPILED = None  # exact_divergence through torch.compile, made on first use (EGNN.compile_divergence)


def _mlp(sizes: list[int], activation: type[nn.Module], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if k < len(sizes) - 2 or last_activation:
            layers.append(activation())
    return nn.Sequential(*layers)


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
        width: width of node features and messages.
        layers: number of message-passing layers.

    Example:
        >>> import torch
        >>> field = EGNN(4, 2, width=8, layers=2)
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

    compile_divergence: bool = False
    """Run :meth:`divergence` through ``torch.compile`` (inductor fuses its many small operations;
    LJ13 on one CPU thread: 1.5x faster per call, after a compilation of about half a minute per
    batch size). Opt-in: it needs a C++ compiler, and a short run does not repay the compilation."""

    contract_from: int = 18
    """:meth:`divergence` contracts the last node update with the last layer (``flows/nn/_egnn_tangents.py``) from
    this many coordinates ``n·d`` on; below, its handful of extra operations cost more than they save."""

    def __init__(self, n_particles: int, spatial_dim: int, *, width: int = 32, layers: int = 3) -> None:
        super().__init__()
        _check_sizes(n_particles, spatial_dim, "EGNN")
        for name, value in (("width", width), ("layers", layers)):
            check_count("EGNN", name, value)
        self.n_particles, self.spatial_dim, self.width, self.layers = n_particles, spatial_dim, width, layers
        n = n_particles
        rows = torch.arange(n).repeat_interleave(n - 1)  # pairs grouped by i: (0,1), (0,2), ..., (1,0), ...
        cols = torch.tensor([j for i in range(n) for j in range(n) if j != i])
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)
        self.register_buffer("_offdiag", (1 - torch.eye(n))[:, :, None], persistent=False)
        act = nn.SiLU
        self.embed = _mlp([3, width, width], act, last_activation=False)
        self.edge = nn.ModuleList(_mlp([2 * width + 2, width, width], act, True) for _ in range(layers))
        # the last layer's node update would not reach the output: there are layers - 1 of them
        self.node = nn.ModuleList(_mlp([2 * width, width, width], act, False) for _ in range(layers - 1))
        self.coord = nn.ModuleList(_mlp([width, width, 1], act, False) for _ in range(layers))
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
        """Node features of layer 0, ``(N, 1, width)``: the time embedding, the same for every particle."""
        t = t.expand(shape).reshape(batch)[:, None]
        return self.embed(torch.cat((t, torch.cos(math.pi * t), torch.sin(math.pi * t)), -1))[:, None, :]

    def _edge_input(self, index: int, h: Tensor, d2: Tensor, d2_0: Tensor) -> Tensor:
        r"""Pre-activation of the first edge layer on all ordered pairs, ``(N, n, n, width)``.

        :math:`W [h_i, h_j, d^2_{ij}, d^{2,0}_{ij}] + b` split into its node parts
        :math:`W_a h_i + W_b h_j` (computed once per node, broadcast over pairs) and its two
        distance columns: the same function as the concatenated layer, with the node-level
        products ``n - 1`` times cheaper.
        """
        first, hid = self.edge[index][0], self.width
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
                h = h + self.node[index](torch.cat((h.expand(batch, n, self.width), (m * offdiag).sum(2)), -1))
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
        chunk = max(1, self.divergence_chunk // (self.n_particles**3 * self.spatial_dim * self.width))
        if self.compile_divergence:
            return self._compiled_divergence(t, z, min(chunk, z.shape[0]))
        if z.shape[0] > chunk:  # the dense tangents are n·d times the activations: keep them in cache
            t = t.expand(shape)
            parts = [exact_divergence(self, t[i : i + chunk], z[i : i + chunk]) for i in range(0, z.shape[0], chunk)]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return exact_divergence(self, t, z)

    def _compiled_divergence(self, t: Tensor, z: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
        """:func:`exact_divergence` through ``torch.compile``, every chunk of one shape (the last one padded)."""
        global _COMPILED
        if _COMPILED is None:
            _COMPILED = torch.compile(exact_divergence, dynamic=False)
        batch = z.shape[0]
        pad = -batch % chunk  # the last chunk repeats the first row: one compiled shape per batch size
        if pad:
            z = torch.cat((z, z[:1].expand(pad, -1)))
            t = torch.cat((t, t[:1].expand(pad))) if t.dim() else t
        parts = []
        try:
            for i in range(0, z.shape[0], chunk):
                parts.append(_COMPILED(self, t[i : i + chunk] if t.dim() else t, z[i : i + chunk]))
        except Exception as error:  # a missing compiler or an unsupported backend: say which switch to turn
            raise RuntimeError(
                f"EGNN.divergence: torch.compile failed ({type(error).__name__}: {error}); "
                "set compile_divergence = False to run it eagerly"
            ) from error
        return torch.cat([p[0] for p in parts])[:batch], torch.cat([p[1] for p in parts])[:batch]

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
        h = h[:, None, :].expand(batch, n, self.width)
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
                hid = self.width
                va = va + (vh @ w[:, :hid].T)[:, :, rows] + (vh @ w[:, hid : 2 * hid].T)[:, :, cols]
            m, vm = silu_jvp(a, va)
            m, vm = silu_jvp(*linear_jvp(edge[2], m, vm))
            # coordinate MLP: Linear, SiLU, Linear
            c, vc = silu_jvp(*linear_jvp(coord[0], m, vm))
            c, vc = linear_jvp(coord[2], c, vc)
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
            va = vagg @ first.weight[:, self.width :].T
            if vh is not None:
                va = va + vh @ first.weight[:, : self.width].T
            b, vb = linear_jvp(node[2], *silu_jvp(a, va))
            h = h + b
            vh = vb if vh is None else vh + vb
        f = remove_mean((x - x0).flatten(-2), n, d)
        jv = remove_mean((v - v0).flatten(-2), n, d)
        return f, jv

    def extra_repr(self) -> str:
        sizes = f"n_particles={self.n_particles}, spatial_dim={self.spatial_dim}"
        return f"{sizes}, width={self.width}, layers={self.layers}"
