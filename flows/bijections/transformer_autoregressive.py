r"""Transformer autoregressive flow block (TarFlow): :class:`TransformerAutoregressive`.

An affine autoregressive map over a sequence of tokens whose conditioner is a causal transformer
(:class:`~flows.nn.CausalTransformer`). Not to be confused with ``transformers.py``, the
elementwise maps ("transformers" in the NSF sense) of the MADE layers.

In the block's token order :math:`\tilde x = \pi(x)` (a permutation of the ``T`` tokens), token
:math:`t` is mapped with parameters computed from the tokens before it:

.. math:: \tilde z_t = (\tilde x_t - b_t) \odot s_t^{-1}, \qquad
          (\log s_t, b_t) = \mathrm{net}(\tilde x_{<t}), \qquad z = \pi^{-1}(\tilde z),

so the Jacobian :math:`\partial\tilde z/\partial\tilde x` is block lower-triangular with diagonal
blocks :math:`\operatorname{diag}(s_t^{-1})` and :math:`\log|\det J| = -\sum_{t,c}\log s_{t,c}`
(summed, not TarFlow's per-dimension mean). The network reads the sequence
:math:`(0, \tilde x_0, \dots, \tilde x_{T-2})` and its output at position :math:`t` gives token
:math:`t`'s parameters: the first position is a start token (its learned positional embedding),
so with ``first_token="transform"`` token 0 gets an affine map that does not depend on :math:`x`
(STARFlow's SOS token); with ``"identity"`` (TarFlow) token 0 passes unchanged.

Scale parameterisations of the raw output :math:`a` (optionally soft-clipped first,
:math:`a \leftarrow c \tanh(a / c)`):

* ``"exp"``: :math:`s = e^{a}` (TarFlow, unbounded);
* ``"softplus"``: :math:`s = \operatorname{softplus}(a + \log(e - 1))`, 1 at :math:`a = 0` (STARFlow);
* ``"sigmoid"``: :math:`s = 2\sigma(a) \in (0, 2)` (Jet's bounded scale): sampling, which multiplies
  by :math:`s`, grows a token by at most 2 per block.

The inverse (sampling direction) is sequential: ``T`` single-token network passes with a
:class:`~flows.nn.KVCache` (``decoding="cached"``), ``T`` full-prefix passes (``"uncached"``, for
checking), or Jacobi fixed-point sweeps in parallel (``"jacobi"``; exact after ``T`` sweeps, the
system being triangular; iterates of magnitude above ``1e8`` are reset to ``z`` so that a wild
guess cannot overflow). :meth:`TransformerAutoregressive.inverse_teacher_forced` is the inverse
with the parameters computed from a given forward input: one parallel, differentiable pass.

References:
    Zhai et al. (2024), "Normalizing Flows are Capable Generative Models", arXiv:2412.06329
    (TarFlow). Gu et al. (2025), "STARFlow: Scaling Latent Normalizing Flows for High-resolution
    Image Synthesis", arXiv:2506.06276 (softplus scale, soft clip, SOS token, Jacobi decoding).
    Kolesnikov, Susano Pinto, Tschannen (2024), "Jet: A Modern Transformer-Based Normalizing
    Flow", arXiv:2412.15129 (bounded scale). Kingma et al. (2016), arXiv:1606.04934, and
    Papamakarios et al. (2017), arXiv:1705.07057 (affine autoregressive flows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from flows._validation import check_count
from flows.bijections.base import Bijection
from flows.nn.transformer import CausalTransformer

__all__ = ["TransformerAutoregressive"]

SCALES = ("exp", "softplus", "sigmoid")
DECODINGS = ("cached", "uncached", "jacobi")
_SOFTPLUS_ONE = math.log(math.e - 1.0)  # softplus(log(e - 1)) = 1
_JACOBI_LIMIT = 1e8  # Jacobi iterates beyond it are reset (|x| of real samples is far below)


def _permutation(order: str | Sequence[int], tokens: int) -> Tensor:
    if isinstance(order, str):
        if order not in ("forward", "reverse"):
            raise ValueError(
                f"TransformerAutoregressive: expected order 'forward', 'reverse' or a permutation, got {order!r}"
            )
        return torch.arange(tokens) if order == "forward" else torch.arange(tokens - 1, -1, -1)
    perm = list(order)
    if sorted(perm) != list(range(tokens)) or not all(isinstance(i, int) for i in perm):
        raise ValueError(
            f"TransformerAutoregressive: expected order to be a permutation of 0..{tokens - 1}, got {perm}"
        )
    return torch.tensor(perm, dtype=torch.long)


class TransformerAutoregressive(Bijection):
    r"""The TarFlow block: an affine autoregressive flow over ``T`` tokens with a causal transformer conditioner.

    Events are token sequences ``(T, C)``; the forward (data → latent) pass is one parallel
    transformer pass, the inverse is sequential (see the module docstring for the formulas).

    Conditioning (``context_features`` is what the flow's context must have):

    * ``num_classes = K``: the context is the class index as a float ``(*batch, 1)``, a whole
      number in ``0..K-1``, or ``-1`` for the null class (label dropout, the unconditional model
      of guidance; its embedding is the mean of the class table, or a learned row with
      ``null_class="learned"``);
    * ``context = c``: a continuous context ``(*batch, c)`` embedded linearly into every token.

    Args:
        tokens: number of tokens ``T``.
        features: features per token ``C``.
        context: continuous context width (0 for none; not with ``num_classes``).
        width: transformer width.
        layers: transformer blocks.
        heads: attention heads (``width`` divisible by it).
        mlp_ratio: MLP expansion of each transformer block.
        num_classes: number of classes (0 for none).
        null_class: ``"mean"`` (TarFlow) or ``"learned"``, the embedding of class ``-1``.
        order: ``"forward"``, ``"reverse"`` or a permutation of ``0..T-1``: the autoregressive order.
        scale: ``"exp"``, ``"softplus"`` or ``"sigmoid"``.
        soft_clip: bound ``c`` of the soft clip of the raw log-scale (``None``: no clip).
        first_token: ``"identity"`` (TarFlow) or ``"transform"`` (an x-independent affine map).
        decoding: the inverse's algorithm, ``"cached"``, ``"uncached"`` or ``"jacobi"``.
        jacobi_iterations: most Jacobi sweeps (default ``T``: exact).
        jacobi_tol: Jacobi stops when no entry moved more than this in a sweep.

    Raises:
        ValueError: for a bad size or option (the message lists the choices).

    Example:
        >>> import torch
        >>> t = TransformerAutoregressive(5, 3, width=16, layers=1, heads=2)
        >>> x = torch.randn(4, 5, 3)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> z.shape, ladj.shape, torch.allclose(t.inverse(z), x, atol=1e-6)
        (torch.Size([4, 5, 3]), torch.Size([4]), True)
    """

    def __init__(
        self,
        tokens: int,
        features: int,
        context: int = 0,
        *,
        width: int = 64,
        layers: int = 2,
        heads: int = 1,
        mlp_ratio: int = 4,
        num_classes: int = 0,
        null_class: str = "mean",
        order: str | Sequence[int] = "forward",
        scale: str = "exp",
        soft_clip: float | None = None,
        first_token: str = "identity",
        decoding: str = "cached",
        jacobi_iterations: int | None = None,
        jacobi_tol: float = 0.0,
    ) -> None:
        who = "TransformerAutoregressive"
        for name, value in (("tokens", tokens), ("features", features)):
            check_count(who, name, value)
        check_count(who, "context", context, minimum=0)
        for name, value, choices in (
            ("scale", scale, SCALES),
            ("first_token", first_token, ("identity", "transform")),
            ("decoding", decoding, DECODINGS),
        ):
            if value not in choices:
                raise ValueError(f"{who}: expected {name} in {list(choices)}, got {value!r}")
        # above 1e4 the clip c·tanh(a/c) is the identity for any usable scale, and c overflows float32 soon after
        if soft_clip is not None and not (
            isinstance(soft_clip, (int, float)) and not isinstance(soft_clip, bool) and 0 < soft_clip <= 1e4
        ):
            raise ValueError(f"{who}: expected soft_clip to be None or a number in (0, 1e4], got {soft_clip!r}")
        if jacobi_iterations is not None and (not isinstance(jacobi_iterations, int) or jacobi_iterations < 1):
            raise ValueError(f"{who}: expected jacobi_iterations to be None or an int >= 1, got {jacobi_iterations!r}")
        super().__init__((tokens, features))
        self.tokens, self.features, self.num_classes = tokens, features, num_classes
        self.context_features = 1 if num_classes else context
        self.scale, self.soft_clip, self.first_token = scale, soft_clip, first_token
        self.decoding, self.jacobi_tol = decoding, float(jacobi_tol)
        self.jacobi_iterations = tokens if jacobi_iterations is None else jacobi_iterations
        self.net = CausalTransformer(
            features,
            2 * features,
            tokens=tokens,
            width=width,
            layers=layers,
            heads=heads,
            mlp_ratio=mlp_ratio,
            num_classes=num_classes,
            context_features=context,
            null_class=null_class,
        )
        perm = _permutation(order, tokens)
        self.register_buffer("perm", perm)
        self.register_buffer("inverse_perm", torch.argsort(perm))
        keep = torch.ones(tokens, 1)
        if first_token == "identity":
            keep[0] = 0.0
        self.register_buffer("keep", keep)

    # -- pieces ---------------------------------------------------------------------------------
    def _net_context(self, context: Tensor | None, batch: torch.Size) -> Tensor | None:
        """The network's per-sequence context ``(N, ...)``: class indices (long) or the continuous context."""
        if not self.context_features:
            return None
        flat = context.expand(*batch, self.context_features).reshape(-1, self.context_features)
        if not self.num_classes:
            return flat
        labels = flat[:, 0]
        bad = (labels != labels.round()) | (labels < -1) | (labels >= self.num_classes)
        if bool(bad.any()):
            raise ValueError(
                f"TransformerAutoregressive: expected class indices (whole numbers in 0..{self.num_classes - 1}, "
                f"or -1 for the null class) as the context, got {labels[bad][0].item()!r}"
            )
        return labels.long()

    def _log_scale(self, raw: Tensor) -> Tensor:
        if self.soft_clip is not None:
            raw = self.soft_clip * torch.tanh(raw / self.soft_clip)
        if self.scale == "exp":
            return raw
        if self.scale == "softplus":
            return torch.log(F.softplus(raw + _SOFTPLUS_ONE))
        return math.log(2.0) + F.logsigmoid(raw)

    def _scale_shift(self, out: Tensor, positions: slice) -> tuple[Tensor, Tensor]:
        """``(log s, b)`` of the tokens at ``positions`` from the network's raw output ``(N, s, 2C)``."""
        raw, shift = out.chunk(2, dim=-1)
        keep = self.keep[positions]
        return self._log_scale(raw) * keep, shift * keep

    def _shifted(self, x: Tensor) -> Tensor:
        """The network's input sequence ``(0, x_0, ..., x_{T-2})``."""
        return torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)

    def _flat(self, x: Tensor) -> tuple[Tensor, torch.Size]:
        batch = x.shape[:-2]
        return x.reshape(-1, self.tokens, self.features).index_select(1, self.perm), batch

    def _unflat(self, y: Tensor, ladj: Tensor, batch: torch.Size) -> tuple[Tensor, Tensor]:
        y = y.index_select(1, self.inverse_perm)
        return y.reshape(*batch, self.tokens, self.features), ladj.reshape(batch)

    # -- the contract -------------------------------------------------------------------------------
    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        xs, batch = self._flat(x)
        return self._forward(xs, self._net_context(context, batch), batch)

    def _forward(self, xs: Tensor, c: Tensor | None, batch: torch.Size) -> tuple[Tensor, Tensor]:
        return self._affine(xs, self.net(self._shifted(xs), c), batch)

    def _affine(self, xs: Tensor, out: Tensor, batch: torch.Size) -> tuple[Tensor, Tensor]:
        """``(z, ladj)`` of ``z = (x − b(x_<)) / s(x_<)`` from the network's output ``out`` on ``xs``."""
        log_s, b = self._scale_shift(out, slice(None))
        z = (xs - b) * torch.exp(-log_s)
        return self._unflat(z, -log_s.sum(dim=(-2, -1)), batch)

    def forward_with_class_weights(self, x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        r"""``(z, ladj)`` of the forward map conditioned on the class mixture :math:`w^\top E` (soft labels).

        ``weights`` ``(*batch, K)``: real weights of the ``K`` class embeddings (one-hot gives the
        class's forward, ``1/K`` the mean-embedding null class); differentiable in ``weights``,
        which is what FlowBack's gradient classifier needs (:func:`flows.classify.gradient_classifier`).

        Raises:
            ValueError: for a block without classes, or weights of the wrong shape, dtype or not finite.
        """
        who = type(self).__name__
        if not self.num_classes:
            raise ValueError(f"{who}: expected a class-conditional block (num_classes > 0) for class weights")
        batch = x.shape[:-2]
        if (
            not weights.is_floating_point()
            or weights.shape[-1:] != (self.num_classes,)
            or not torch.isfinite(weights).all()
        ):
            raise ValueError(
                f"{who}: expected finite float class weights (*batch, {self.num_classes}), got {weights.dtype} "
                f"of shape {tuple(weights.shape)}"
            )
        xs, _ = self._flat(x)
        c = weights.expand(*batch, self.num_classes).reshape(-1, self.num_classes)
        return self._forward(xs, c, batch)

    def hidden_states(self, x: Tensor, context: Tensor | None = None, *, layers: Sequence[int]) -> list[Tensor]:
        """The conditioner's hidden states after the transformer layers ``layers``, ``(*batch, T, width)`` each.

        Row ``t`` is in the data's token order (the block's permutation undone) and is the state
        from which token ``t``'s scale and shift are computed: it depends on the tokens before
        ``t`` in the block's order. What :class:`flows.train.RepresentationAlignment` aligns.
        """
        xs, batch = self._flat(x)
        states = self.net.hidden_states(self._shifted(xs), self._net_context(context, batch), layers=layers)
        return [h.index_select(1, self.inverse_perm).reshape(*batch, self.tokens, h.shape[-1]) for h in states]

    def forward_with_states(
        self, x: Tensor, context: Tensor | None = None, *, layers: Sequence[int]
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """``(z, ladj, hidden_states(x, context, layers=layers))`` from one pass of the network.

        The states are those the forward map is computed through: forward-route alignment
        (:class:`flows.train.RepresentationAlignment`) adds no second pass through the block.
        """
        xs, batch = self._flat(x)
        out, states = self.net.forward_with_states(self._shifted(xs), self._net_context(context, batch), layers=layers)
        z, ladj = self._affine(xs, out, batch)
        return z, ladj, [h.index_select(1, self.inverse_perm).reshape(*batch, self.tokens, h.shape[-1]) for h in states]

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        zs, batch = self._flat(z)
        c = self._net_context(context, batch)
        if self.decoding == "jacobi":
            x, log_s = self._jacobi(zs, c, self.jacobi_iterations, self.jacobi_tol)
        else:
            x, log_s = self._sequential(zs, c, cached=self.decoding == "cached")
        return self._unflat(x, log_s.sum(dim=(-2, -1)), batch)

    # -- decoding algorithms --------------------------------------------------------------------------
    def _sequential(
        self, zs: Tensor, c: Tensor | None, *, cached: bool, guidance: tuple[float, str, float, str] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Token by token: ``T`` network passes, one new token each (cached) or the whole prefix (uncached).

        ``guidance = (w, schedule, temperature, rule)`` adds a second, unconditional pass (null
        class, attention ``temperature``) with its own cache and combines the two per token with
        weight ``g_t = w`` or ``w · t / (T − 1)`` (``"linear"``) by :meth:`_guide`.
        """
        uncond = None if guidance is None or c is None else torch.full_like(c, -1)
        cache, cache_u = self.net.empty_cache(zs), self.net.empty_cache(zs)
        inputs = [torch.zeros_like(zs[:, :1])]
        xs, log_ss = [], []
        for t in range(self.tokens):
            if cached:
                out, cache = self.net.decode(inputs[-1], cache, c)
            else:
                out = self.net(torch.cat(inputs, dim=1), c)[:, -1:]
            if guidance is None:
                log_s, b = self._scale_shift(out, slice(t, t + 1))
            else:
                weight, schedule, temperature, rule = guidance
                if cached:
                    out_u, cache_u = self.net.decode(inputs[-1], cache_u, uncond, temperature=temperature)
                else:
                    out_u = self.net(torch.cat(inputs, dim=1), uncond, temperature=temperature)[:, -1:]
                g = weight if schedule == "constant" else weight * t / max(self.tokens - 1, 1)
                log_s, b = self._guide(out, out_u, g, rule, slice(t, t + 1))
            x_t = zs[:, t : t + 1] * torch.exp(log_s) + b
            xs.append(x_t)
            log_ss.append(log_s)
            inputs.append(x_t)
        return torch.cat(xs, dim=1), torch.cat(log_ss, dim=1)

    def _guide(self, out: Tensor, out_u: Tensor, g: float, rule: str, positions: slice) -> tuple[Tensor, Tensor]:
        r"""Guided ``(log s, b)`` from the conditional and unconditional raw outputs.

        ``"tarflow"``: raw outputs moved, :math:`o + g (o - o_u)`. ``"product"`` (STARFlow): the
        Gaussian :math:`\mathcal N(b, s^2)` of each coordinate becomes the normalised product
        :math:`p_c^{1+g} p_u^{-g}`, with :math:`r = \min(s_c / s_u, 1)^2`:
        :math:`s = s_c / \sqrt{1 + g - g r}`, :math:`b = ((1 + g) b_c - g r b_u) / (1 + g - g r)`.
        """
        if rule == "tarflow":
            return self._scale_shift(out + g * (out - out_u), positions)
        log_c, b_c = self._scale_shift(out, positions)
        log_u, b_u = self._scale_shift(out_u, positions)
        r = torch.exp(2 * torch.clamp(log_c - log_u, max=0.0))
        denominator = 1 + g - g * r
        return log_c - 0.5 * torch.log(denominator), ((1 + g) * b_c - g * r * b_u) / denominator

    def _jacobi(self, zs: Tensor, c: Tensor | None, iterations: int, tol: float) -> tuple[Tensor, Tensor]:
        """Fixed-point sweeps ``x ← s(x) ⊙ z + b(x)`` over all tokens at once; token ``t`` is exact after ``t + 1``."""
        x = zs
        for _ in range(iterations):
            log_s, b = self._scale_shift(self.net(self._shifted(x), c), slice(None))
            new = zs * torch.exp(log_s) + b
            # A wild guess for a not-yet-exact token would poison the exact ones (LayerNorm and masked
            # attention scores overflow to NaN): guesses beyond _JACOBI_LIMIT restart from z.
            new = torch.where(new.abs() <= _JACOBI_LIMIT, new, zs)
            moved = (new - x).abs().max() if new.numel() else new.new_zeros(())
            x = new
            if moved <= tol:
                break
        return x, log_s

    def inverse_sequential(self, z: Tensor, context: Tensor | None = None, *, cached: bool = True) -> Tensor:
        """The sequential inverse with (``cached=True``) or without a KV cache, whatever ``decoding`` says."""
        self.check_call(z, context, inverse=True)
        zs, batch = self._flat(z)
        x, log_s = self._sequential(zs, self._net_context(context, batch), cached=cached)
        return self._unflat(x, log_s.sum(dim=(-2, -1)), batch)[0]

    def inverse_jacobi(
        self, z: Tensor, context: Tensor | None = None, *, iterations: int | None = None, tol: float = 0.0
    ) -> Tensor:
        """The inverse by at most ``iterations`` Jacobi sweeps (default ``T``: exact), until no move exceeds ``tol``."""
        self.check_call(z, context, inverse=True)
        if iterations is not None and (not isinstance(iterations, int) or iterations < 1):
            raise ValueError(f"TransformerAutoregressive: expected iterations to be an int >= 1, got {iterations!r}")
        zs, batch = self._flat(z)
        c = self._net_context(context, batch)
        x, log_s = self._jacobi(zs, c, self.tokens if iterations is None else iterations, tol)
        return self._unflat(x, log_s.sum(dim=(-2, -1)), batch)[0]

    def inverse_guided(
        self,
        z: Tensor,
        context: Tensor | None = None,
        *,
        weight: float,
        schedule: str = "constant",
        temperature: float = 1.0,
        rule: str = "tarflow",
        cached: bool = True,
    ) -> Tensor:
        r"""Sequential decoding with classifier-free guidance, as TarFlow samples.

        At every token the raw network output :math:`o` (log-scale and shift) of the conditional
        pass is moved away from that of an unconditional pass: :math:`o + g_t (o - o_u)`, with
        :math:`g_t = w` (``"constant"``) or :math:`w\, t / (T - 1)` (``"linear"``, the ramp over the
        block's token order). The unconditional pass uses the null class (``-1``) and divides the
        attention logits by ``temperature``; for a block without classes it differs from the
        conditional one by the temperature only (TarFlow's unconditional guidance). ``weight = 0``
        is the plain conditional decode. Guided samples are not the inverse of :meth:`forward`.

        ``rule="product"`` (STARFlow) instead decodes each coordinate from the normalised product
        of the conditional and unconditional Gaussians, :math:`p_c^{1+g} p_u^{-g}` (the
        unconditional scale floored at the conditional one), which needs ``weight >= 0``.

        Raises:
            ValueError: for a block with a continuous context (no unconditional model), a bad
                schedule, or a non-finite weight or non-positive temperature.
        """
        who = type(self).__name__
        self.check_call(z, context, inverse=True)
        if self.context_features and not self.num_classes:
            raise ValueError(
                f"{who}: expected a class-conditional or unconditional block for guidance, got a "
                "continuous context (it has no unconditional model)"
            )
        if schedule not in ("constant", "linear"):
            raise ValueError(f"{who}: expected schedule in ['constant', 'linear'], got {schedule!r}")
        if rule not in ("tarflow", "product"):
            raise ValueError(f"{who}: expected rule in ['tarflow', 'product'], got {rule!r}")
        if rule == "product" and not weight >= 0:
            raise ValueError(f"{who}: expected weight >= 0 with rule='product', got {weight!r}")
        if not math.isfinite(weight) or not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"{who}: expected a finite weight and a temperature > 0, got {weight!r}, {temperature!r}")
        zs, batch = self._flat(z)
        c = self._net_context(context, batch)
        x, log_s = self._sequential(zs, c, cached=cached, guidance=(float(weight), schedule, float(temperature), rule))
        return self._unflat(x, log_s.sum(dim=(-2, -1)), batch)[0]

    def inverse_teacher_forced(self, z: Tensor, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""The inverse with the parameters computed from ``x`` in one parallel pass: :math:`s(x) \odot z + b(x)`.

        With ``z = forward(x)`` it returns ``x`` (to rounding) through a differentiable generative
        graph (gradients reach ``z``, ``x`` and the parameters); for any other ``z`` it is not the inverse.

        Raises:
            ValueError: when ``x`` and ``z`` differ in shape.
        """
        self.check_call(z, context, inverse=True)
        if x.shape != z.shape:
            raise ValueError(
                f"TransformerAutoregressive: expected x of the shape of z {tuple(z.shape)}, got {tuple(x.shape)}"
            )
        xs, batch = self._flat(x)
        zs, _ = self._flat(z)
        log_s, b = self._scale_shift(self.net(self._shifted(xs), self._net_context(context, batch)), slice(None))
        return self._unflat(zs * torch.exp(log_s) + b, log_s.sum(dim=(-2, -1)), batch)[0]

    def extra_repr(self) -> str:
        order = self.perm.tolist()
        name = "forward" if order == sorted(order) else "reverse" if order == sorted(order)[::-1] else order
        return (
            f"tokens={self.tokens}, features={self.features}, context_features={self.context_features}, "
            f"order={name!r}, scale={self.scale!r}, first_token={self.first_token!r}, decoding={self.decoding!r}"
        )
