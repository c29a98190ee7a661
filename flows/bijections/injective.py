r"""Injective transforms onto a d-dimensional manifold in R^D: :class:`InjectiveLinear`, :class:`FreeFormInjective`.

How they fit the contract. The generative map of an injective flow is an embedding
:math:`g: \mathbb R^d \to \mathbb R^D` (``d ≤ D``) whose image is a d-dimensional manifold
:math:`\mathcal M`. As everywhere in the library the **forward** direction maps data to latent, so
here it is a left inverse :math:`f: \mathbb R^D \to \mathbb R^d` (``event_shape = (D,)``,
``event_shape_out = (d,)``) and the second output of the fused methods is the exact **volume term**
of the embedding instead of a log-determinant:

* ``forward_and_log_det(x) -> (z, -½ log det(J_gᵀ J_g)(z))`` with ``z = f(x)``;
* ``inverse_and_log_det(z) -> (g(z), +½ log det(J_gᵀ J_g)(z))``.

With these, a :class:`~flows.flow.Flow` whose transform is ``Chain(injective, *latent_bijections)``
reports the density **on the manifold** (with respect to its d-dimensional volume measure),

.. math:: \log p(x) = \log p_Z(f(x)) - \tfrac12 \log\det\big(J_g(z)^\top J_g(z)\big),\quad z = f(x),

which is exact for points of :math:`\mathcal M`. A point off the manifold gets the density of
:math:`g(f(x))`, the point it is mapped to (its orthogonal projection for :class:`InjectiveLinear`).
For ``d = D`` both reduce to ordinary bijections (``½ log det(JᵀJ) = log|det J|``).

Neither can pass :func:`~flows.testing.check_bijection` (``D × d`` Jacobian); their oracles are
in ``tests/test_injective.py``.

References:
    Caterini, Loaiza-Ganem, Pleiss, Cunningham (2021), "Rectangular Flows for Manifold Learning",
    NeurIPS, arXiv:2106.01413. Brehmer, Cranmer (2020), "Flows for simultaneous manifold learning
    and density estimation", NeurIPS, arXiv:2003.13913. Sorrenson, Draxler, Rousselot, Hummerich,
    Zimmermann, Köthe (2024), "Lifting Architectural Constraints of Injective Flows", ICLR,
    arXiv:2306.01843.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.autograd import forward_ad
from torch.func import jvp, vmap

from flows._validation import check_context, check_count, check_event
from flows.bijections.base import Bijection
from flows.nn import MLP

__all__ = ["FreeFormInjective", "InjectiveLinear", "half_log_det_gram", "orthogonal_probes"]


def _check_dims(who: str, features: int, latent_features: int) -> None:
    ok = isinstance(features, int) and isinstance(latent_features, int) and 1 <= latent_features <= features
    if not ok:
        raise ValueError(
            f"{who}: expected ints 1 <= latent_features <= features, "
            f"got features={features!r}, latent_features={latent_features!r}"
        )


def half_log_det_gram(jacobian: Tensor) -> Tensor:
    r"""Exact volume term :math:`\tfrac12 \log\det(J^\top J)` of a tall Jacobian.

    Computed from the reduced QR decomposition :math:`J = QR` as :math:`\sum_i \log|R_{ii}|`, which
    avoids squaring the condition number (as forming :math:`J^\top J` would). Differentiable.

    Args:
        jacobian: ``(*batch, D, d)`` with ``d ≤ D`` and full column rank.

    Returns:
        ``(*batch,)``; ``-inf`` where ``J`` is rank deficient.

    Example:
        >>> import torch
        >>> j = torch.tensor([[3.0], [4.0]])  # a 2 × 1 Jacobian of length 5
        >>> round(half_log_det_gram(j).item(), 6) == round(math.log(5.0), 6)
        True
    """
    if jacobian.dim() < 2 or jacobian.shape[-1] > jacobian.shape[-2]:
        raise ValueError(
            f"half_log_det_gram: expected a (*batch, D, d) Jacobian with d <= D, got {tuple(jacobian.shape)}"
        )
    r = torch.linalg.qr(jacobian, mode="reduced").R
    return r.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)


def orthogonal_probes(reference: Tensor, samples: int = 1, *, generator: torch.Generator | None = None) -> Tensor:
    r"""Hutchinson probe vectors with :math:`E[vv^\top] = I`, ``‖v‖² = d`` and mutually orthogonal samples.

    Draws a Gaussian ``(d, K)`` matrix per batch element, orthonormalises its columns by QR with the
    signs fixed so that ``diag(R) > 0`` (this makes the columns uniformly, i.e. rotation-invariantly,
    distributed on the sphere) and scales them by :math:`\sqrt d`. Hence each column satisfies
    :math:`E[vv^\top] = I_d` and :math:`\|v\|^2 = d` exactly, and with ``K = d`` samples
    :math:`\sum_k v_k v_k^\top = d\,I`, so the Hutchinson estimate
    :math:`\tfrac1K\sum_k v_k^\top A v_k` of :math:`\operatorname{tr}A` is exact.

    Args:
        reference: ``(*batch, d)``; gives the batch shape, ``d``, dtype and device.
        samples: number ``K`` of probes per batch element, ``1 ≤ K ≤ d``.
        generator: random generator (CPU generators only for CPU tensors).

    Returns:
        ``(*batch, d, K)``.

    Example:
        >>> import torch
        >>> v = orthogonal_probes(torch.zeros(5, 3), samples=2)
        >>> v.shape, torch.allclose(v.square().sum(-2), torch.full((5, 2), 3.0))
        (torch.Size([5, 3, 2]), True)
    """
    if reference.dim() < 1:
        raise ValueError(f"orthogonal_probes: expected a reference of shape (*batch, d), got {tuple(reference.shape)}")
    d = reference.shape[-1]
    if not isinstance(samples, int) or not 1 <= samples <= d:
        raise ValueError(f"orthogonal_probes: expected 1 <= samples <= d = {d}, got {samples!r}")
    gaussian = torch.randn(
        (*reference.shape, samples), generator=generator, dtype=reference.dtype, device=reference.device
    )
    if samples == 1:  # the QR of one column (with R > 0) is its normalisation
        return gaussian * (math.sqrt(d) / torch.linalg.vector_norm(gaussian, dim=-2, keepdim=True))
    q, r = torch.linalg.qr(gaussian, mode="reduced")
    signs = torch.where(r.diagonal(dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(q.dtype)
    return q * signs.unsqueeze(-2) * math.sqrt(d)


class InjectiveLinear(Bijection):
    r"""Exact injective linear layer :math:`g(z) = Wz + b`, :math:`W \in \mathbb R^{D\times d}`, and its projection.

    Forward (data → latent) is the left inverse :math:`f(x) = W^+(x - b)` with
    :math:`W^+ = (W^\top W)^{-1}W^\top = R^{-1}Q^\top` (reduced QR :math:`W = QR`), so
    :math:`g(f(x))` is the orthogonal projection of ``x`` onto the affine subspace
    :math:`\{Wz + b\}`. The volume term is constant:

    * forward: :math:`z = R^{-1}Q^\top (x - b)`, second output :math:`-\tfrac12\log\det(W^\top W)
      = -\sum_i \log|R_{ii}|`;
    * inverse: :math:`x = Wz + b`, second output :math:`+\sum_i \log|R_{ii}|`.

    Cost: one O(D d²) QR per call plus O(D d) per sample. ``W`` must keep full column rank (a
    rank-deficient ``W`` gives infinite outputs). Composes with bijections on the latent side:
    ``Chain(InjectiveLinear(D, d), *bijections_on_R^d)``; ``d = D`` is an invertible linear map.

    References:
        Caterini, Loaiza-Ganem, Pleiss, Cunningham (2021), "Rectangular Flows for Manifold
        Learning", NeurIPS, arXiv:2106.01413 (injective linear/padding layers).

    Args:
        features: data dimension ``D``.
        latent_features: manifold dimension ``d`` (``1 ≤ d ≤ D``).
        init: ``"pad"`` (``W = [I_d; 0]``: zero padding, ``f`` keeps the first ``d`` coordinates)
            or ``"orthogonal"`` (random orthonormal columns).
        bias: learn the offset ``b`` of the subspace.
        generator: random generator for the orthogonal initialisation.

    Example:
        >>> import torch
        >>> from flows import Chain, Flow, InjectiveLinear, RealNVP, StandardNormal
        >>> flow = Flow(Chain(InjectiveLinear(5, 2), RealNVP(2, transforms=2).transform), StandardNormal(2))
        >>> x, log_p = flow.sample_and_log_prob((4,))  # samples on a plane in R^5
        >>> x.shape, torch.allclose(flow.log_prob(x), log_p, atol=1e-5)
        (torch.Size([4, 5]), True)
    """

    def __init__(
        self,
        features: int,
        latent_features: int,
        *,
        init: str = "orthogonal",
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        _check_dims("InjectiveLinear", features, latent_features)
        super().__init__(features, latent_features)
        if init == "pad":
            weight = torch.eye(features, latent_features)
        elif init == "orthogonal":
            gaussian = torch.randn(features, latent_features, generator=generator, dtype=torch.float64)
            weight = torch.linalg.qr(gaussian).Q.to(torch.get_default_dtype())
        else:
            raise ValueError(f"InjectiveLinear: expected init 'pad' or 'orthogonal', got {init!r}")
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(features)) if bias else None

    def half_log_det_gram(self) -> Tensor:
        r""":math:`\tfrac12\log\det(W^\top W)` (a scalar)."""
        return half_log_det_gram(self.weight)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q, r = torch.linalg.qr(self.weight, mode="reduced")
        y = x if self.bias is None else x - self.bias
        rows = (y @ q).reshape(-1, q.shape[-1])
        # rows = z Rᵀ for z = R⁻¹Qᵀy: one right-side triangular solve.
        z = torch.linalg.solve_triangular(r.mT, rows, upper=False, left=False).reshape(*y.shape[:-1], -1)
        volume = r.diagonal().abs().log().sum()
        return z, (-volume).expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = z @ self.weight.mT
        if self.bias is not None:
            x = x + self.bias
        return x, self.half_log_det_gram().expand(z.shape[:-1])

    def extra_repr(self) -> str:
        d_in, d_out = self.event_shape[0], self.event_shape_out[0]
        return f"features={d_in}, latent_features={d_out}, bias={self.bias is not None}"


class FreeFormInjective(Bijection):
    r"""A free-form encoder :math:`f: \mathbb R^D \to \mathbb R^d` and decoder :math:`g: \mathbb R^d \to \mathbb R^D`.

    Any networks will do (no invertibility constraint); training (see
    :class:`~flows.architectures.FreeFormInjectiveFlow`) makes :math:`f` a left inverse of
    :math:`g` on the data. The decoder defines the model: the manifold is :math:`g(\mathbb R^d)`
    and the exact volume term comes from the decoder Jacobian :math:`J_g` (``D × d``, built from
    ``d`` forward-mode JVPs, then QR: O(d) decoder passes + O(D d²) per sample):

    * forward: :math:`z = f(x)`, second output :math:`-\tfrac12\log\det(J_g(z)^\top J_g(z))`;
    * inverse: :math:`x = g(z)`, second output :math:`+\tfrac12\log\det(J_g(z)^\top J_g(z))`.

    :meth:`forward` and :meth:`inverse` (tensor only) skip the Jacobian. :meth:`surrogate` is the
    FIF training estimator of the volume term's gradient. The networks are called as ``net(x)``,
    or ``net(x, context=c)`` when a context is given; they must be batch-independent and
    compatible with ``torch.func`` (no in-place updates of buffers, e.g. batch norm in train mode).

    References:
        Sorrenson, Draxler, Rousselot, Hummerich, Zimmermann, Köthe (2024), "Lifting Architectural
        Constraints of Injective Flows", ICLR, arXiv:2306.01843.

    Args:
        features: data dimension ``D``.
        latent_features: manifold dimension ``d`` (``1 ≤ d ≤ D``; ``d = D`` is a free-form flow).
        context: context width passed to the networks (0 for none).
        encoder: network ``(*batch, D) -> (*batch, d)``; by default an MLP.
        decoder: network ``(*batch, d) -> (*batch, D)``; by default an MLP.
        hidden: hidden widths of the default MLPs.
        activation: nonlinearity of the default MLPs (smooth by default: the volume term
            differentiates the decoder).
        jvp: how :meth:`surrogate` gets the decoder JVP :math:`J_g(z)v`: ``"double_backward"``
            (two reverse passes through the decoder graph that the reconstruction builds anyway;
            needs twice-differentiable decoder ops, which the encoder needs too) or ``"forward"``
            (forward-mode dual numbers, as in the reference implementation; needs forward-AD
            support). Same values; eager forward-mode AD has a large per-op overhead on CPU, which
            makes ``"forward"`` training steps slower (``docs/injective.md``, "Measured").

    Example:
        >>> import torch
        >>> t = FreeFormInjective(3, 1, hidden=(16,))
        >>> z, volume = t.forward_and_log_det(torch.randn(4, 3))
        >>> z.shape, volume.shape, t.inverse(z).shape
        (torch.Size([4, 1]), torch.Size([4]), torch.Size([4, 3]))
    """

    def __init__(
        self,
        features: int,
        latent_features: int,
        context: int = 0,
        *,
        encoder: nn.Module | None = None,
        decoder: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.SiLU,
        jvp: str = "double_backward",
    ) -> None:
        _check_dims("FreeFormInjective", features, latent_features)
        if jvp not in ("double_backward", "forward"):
            raise ValueError(f"FreeFormInjective: expected jvp 'double_backward' or 'forward', got {jvp!r}")
        check_count("FreeFormInjective", "context", context, minimum=0)
        super().__init__(features, latent_features)
        self.features, self.latent_features, self.context_features, self.jvp = features, latent_features, context, jvp
        mlp = {"hidden": hidden, "context": context, "activation": activation, "zero_init": False}
        self.encoder = MLP(features, latent_features, **mlp) if encoder is None else encoder
        self.decoder = MLP(latent_features, features, **mlp) if decoder is None else decoder

    def _call(self, net: nn.Module, x: Tensor, context: Tensor | None, size: int, what: str) -> Tensor:
        if self.context_features:
            check_context(context, self.context_features, type(self).__name__)
        out = net(x) if context is None else net(x, context=context)
        if out.shape != (*x.shape[:-1], size):
            raise ValueError(
                f"{type(self).__name__}: expected the {what} to return shape {(*x.shape[:-1], size)}, "
                f"got {tuple(out.shape)}"
            )
        return out

    def encode(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """``z = f(x)``: ``(*batch, D) -> (*batch, d)``."""
        return self._call(self.encoder, x, context, self.latent_features, "encoder")

    def decode(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """``x = g(z)``: ``(*batch, d) -> (*batch, D)``."""
        return self._call(self.decoder, z, context, self.features, "decoder")

    def decoder_jacobian(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(g(z), J_g(z))`` with ``J_g`` of shape ``(*batch, D, d)``, from ``d`` batched forward-mode JVPs."""
        d = self.latent_features
        basis = torch.eye(d, dtype=z.dtype, device=z.device).reshape(d, *([1] * (z.dim() - 1)), d).expand(d, *z.shape)

        def column(tangent: Tensor) -> tuple[Tensor, Tensor]:
            return jvp(lambda u: self.decode(u, context), (z,), (tangent,))

        x, columns = vmap(column, out_dims=(None, 0))(basis)
        return x, columns.movedim(0, -1)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(x, self.event_shape, type(self).__name__)
        return self.encode(x, context)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        check_event(z, self.event_shape_out, type(self).__name__, "latent input")
        return self.decode(z, context)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = self.encode(x, context)
        _, jacobian = self.decoder_jacobian(z, context)
        return z, -half_log_det_gram(jacobian)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, jacobian = self.decoder_jacobian(z, context)
        return x, half_log_det_gram(jacobian)

    def surrogate(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""The FIF volume-term surrogate :math:`\tfrac1K\sum_k v_k^\top J_f(x)\,\mathrm{SG}(J_g(z)v_k)`.

        :math:`v_k^\top J_f(x)` is a vector-Jacobian product taken at the **data point** ``x``
        (the stabilised FIF objective, not at the reconstruction) and kept differentiable;
        :math:`J_g(z)v_k` is the decoder's Jacobian-vector product at :math:`z = f(x)`, detached
        (stop-gradient). The gradient of the surrogate is
        :math:`\operatorname{tr}(\mathrm{SG}(J_g)\,\partial J_f)`, which equals
        :math:`\partial\,\tfrac12\log\det(J_fJ_f^\top) = -\partial\,\tfrac12\log\det(J_g^\top J_g)`
        when :math:`J_f = J_g^+` (good reconstruction), so ``-surrogate`` stands in for the volume
        term of the negative log-likelihood. The decoder gets no gradient from it. The decoder
        pass that gives the JVP also gives the reconstruction.

        Args:
            x: data ``(*batch, D)`` (any ``requires_grad``; gradients w.r.t. ``x`` are kept).
            context: context ``(*batch, context_features)`` or ``None``.
            samples: number ``K`` of orthogonal Hutchinson probes (``1 ≤ K ≤ d``; ``K = d`` is exact).
            generator: random generator for the probes.

        Returns:
            ``(z, x_reconstructed, surrogate)`` of shapes ``(*batch, d)``, ``(*batch, D)``, ``batch``.
        """
        check_event(x, self.event_shape, type(self).__name__)
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            z = self.encode(x, context)
            probes = orthogonal_probes(z, samples, generator=generator)
            if self.jvp == "forward":
                x_rec, jvs = self._forward_mode_jvps(z, probes, context)
            else:
                x_rec, jvs = self._double_backward_jvps(z, probes, context)
            total = None
            for k in range(samples):
                (vjf,) = torch.autograd.grad(z, x, probes[..., k], create_graph=True, retain_graph=True)
                term = (vjf * jvs[k]).sum(-1)
                total = term if total is None else total + term
        return z, x_rec, total / samples

    def _forward_mode_jvps(self, z: Tensor, probes: Tensor, context: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """Decoder output and detached ``J_g v_k`` by forward-mode dual numbers (one dual pass per probe)."""
        jvs = []
        for k in range(probes.shape[-1]):
            with forward_ad.dual_level():
                x_rec, jv = forward_ad.unpack_dual(self.decode(forward_ad.make_dual(z, probes[..., k]), context))
            jvs.append(jv.detach())
        return x_rec, jvs

    def _double_backward_jvps(self, z: Tensor, probes: Tensor, context: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """Decoder output and detached ``J_g v_k = ∂/∂u [(uᵀJ_g) v_k]``, ``uᵀJ_g`` a VJP built with ``create_graph``.

        Reuses the decoder's forward graph, which the reconstruction loss needs anyway.
        """
        x_rec = self.decode(z, context)
        u = torch.zeros_like(x_rec, requires_grad=True)
        (w,) = torch.autograd.grad(x_rec, z, u, create_graph=True)
        jvs = [
            torch.autograd.grad(w, u, probes[..., k], retain_graph=True)[0].detach() for k in range(probes.shape[-1])
        ]
        return x_rec, jvs

    def extra_repr(self) -> str:
        return (
            f"features={self.features}, latent_features={self.latent_features}, "
            f"context={self.context_features}, jvp={self.jvp!r}"
        )
