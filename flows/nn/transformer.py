r"""Causal transformer conditioner: :class:`CausalTransformer` and its explicit :class:`KVCache`.

The network of a transformer autoregressive flow (TarFlow): tokens ``(N, S, in_features)`` are
embedded, get a learned positional embedding and optionally a class or context embedding added
to every token, pass ``layers`` pre-LN blocks

.. math:: h \leftarrow h + \operatorname{Attn}(\operatorname{LN}(h)), \qquad
          h \leftarrow h + \operatorname{MLP}(\operatorname{LN}(h)),

with causal multi-head self-attention (token ``s`` attends to tokens ``≤ s``; softmax scale
``1 / (sqrt(head_dim) · temperature)``), and pass a final LayerNorm (GPT-2's ``ln_f``) before the
projection to ``out_features``. The final norm bounds the outputs whatever the input's size: without
it the residual stream carries ``W_in x`` straight to the output, so in a stack of flow blocks an
unusual input that one block sends far out gets a shift proportional to its size in the next, and
the growth compounds (a TarFlow trained an hour on MNIST scored a few test images at 10⁸ bits/dim
that way).

Decoding one token at a time keeps the keys and values of the tokens seen so far in a
:class:`KVCache`, an immutable object that :meth:`CausalTransformer.decode` takes and returns:
the module holds no decoding state, so two decodes can interleave (re-entrant) and the graph is
plain tensor code.

References:
    Vaswani et al. (2017), "Attention Is All You Need", NeurIPS, arXiv:1706.03762. Xiong et al.
    (2020), "On Layer Normalization in the Transformer Architecture", ICML, arXiv:2002.04745
    (pre-LN). Zhai et al. (2024), "Normalizing Flows are Capable Generative Models",
    arXiv:2412.06329 (the TarFlow conditioner).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CausalTransformer", "KVCache"]


@dataclass(frozen=True)
class KVCache:
    """Keys and values of the tokens decoded so far, one ``(N, heads, S, head_dim)`` pair per layer.

    Immutable: :meth:`CausalTransformer.decode` returns a new cache with the new tokens appended.
    Start from :meth:`CausalTransformer.empty_cache` (``S = 0``).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def length(self) -> int:
        """Number of cached tokens ``S`` (the position of the next token)."""
        return self.keys[0].shape[-2] if self.keys else 0


class _Block(nn.Module):
    """One pre-LN transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, width: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(
        self, h: Tensor, past: tuple[Tensor, Tensor] | None, temperature: float
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        n, s, width = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(n, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if past is not None and past[0].shape[-2]:
            k, v = torch.cat((past[0], k), dim=-2), torch.cat((past[1], v), dim=-2)
        scale = 1.0 / (math.sqrt(self.head_dim) * temperature)
        offset = k.shape[-2] - s
        if offset == 0:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:  # new token i sits at position offset + i and sees every cached token and new ones <= i
            mask = torch.ones(s, offset + s, dtype=torch.bool, device=h.device).tril(offset)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        h = h + self.out(a.transpose(1, 2).reshape(n, s, width))
        return h + self.mlp(self.norm2(h)), (k, v)


class CausalTransformer(nn.Module):
    r"""Causal (decoder-only) transformer ``(N, S, in_features) → (N, S, out_features)``.

    Output token ``s`` depends on input tokens ``0..s`` only. The embedding of input token ``s``
    is ``W_in x_s + P_s (+ E_y) (+ W_c c)``: a learned positional embedding ``P`` (``tokens`` rows,
    initialised ``N(0, 0.01²)``), and optionally a class embedding ``E_y`` (``num_classes`` rows)
    or a linear embedding of a continuous context ``c``, both added to every token. Class index
    ``-1`` is the *null class* of label dropout and classifier-free guidance: the mean of the
    class embeddings (``null_class="mean"``, as TarFlow) or a learned row (``"learned"``).

    The output layer is zero-initialised (``zero_init``), so a flow built on this network starts
    at the identity. Everything runs in the parameters' dtype (float64 included).

    Args:
        in_features: width of an input token.
        out_features: width of an output token.
        tokens: the most positions a sequence may have (rows of ``P``).
        width: the model width (divisible by ``heads``).
        layers: number of transformer blocks.
        heads: attention heads (``head_dim = width / heads``).
        mlp_ratio: the MLP's hidden width is ``mlp_ratio · width``.
        num_classes: size of the class table (0 for none).
        context_features: width of a continuous context (0 for none; not with ``num_classes``).
        null_class: ``"mean"`` or ``"learned"``, the embedding of class ``-1``.
        zero_init: zero the output layer's weight and bias.

    Raises:
        ValueError: for a width not divisible by ``heads``, non-positive sizes, both classes and a
            context, or an unknown ``null_class``.

    Example:
        >>> import torch
        >>> net = CausalTransformer(3, 6, tokens=5, width=16, layers=1, heads=2)
        >>> x = torch.randn(4, 5, 3)
        >>> y, cache = net.decode(x[:, :2], net.empty_cache(x))
        >>> y2, cache = net.decode(x[:, 2:], cache)
        >>> torch.allclose(torch.cat((y, y2), dim=1), net(x), atol=1e-6)
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tokens: int,
        width: int = 64,
        layers: int = 2,
        heads: int = 1,
        mlp_ratio: int = 4,
        num_classes: int = 0,
        context_features: int = 0,
        null_class: str = "mean",
        zero_init: bool = True,
    ) -> None:
        super().__init__()
        sizes = {"in_features": in_features, "out_features": out_features, "tokens": tokens, "width": width}
        sizes.update(layers=layers, heads=heads, mlp_ratio=mlp_ratio)
        bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if bad or not isinstance(num_classes, int) or num_classes < 0 or context_features < 0:
            raise ValueError(
                f"CausalTransformer: expected positive int sizes and num_classes, context_features >= 0, got "
                f"{bad or {'num_classes': num_classes, 'context_features': context_features}}"
            )
        if width % heads:
            raise ValueError(f"CausalTransformer: expected width divisible by heads, got width={width}, heads={heads}")
        if num_classes and context_features:
            raise ValueError("CausalTransformer: expected num_classes or context_features, got both")
        if null_class not in ("mean", "learned"):
            raise ValueError(f"CausalTransformer: expected null_class in ['mean', 'learned'], got {null_class!r}")
        self.in_features, self.out_features, self.tokens = in_features, out_features, tokens
        self.width, self.heads, self.num_classes = width, heads, num_classes
        self.context_features, self.null_class = context_features, null_class
        self.proj_in = nn.Linear(in_features, width)
        self.position = nn.Parameter(0.01 * torch.randn(tokens, width))
        if num_classes:
            self.classes = nn.Parameter(0.01 * torch.randn(num_classes, width))
            if null_class == "learned":
                self.null = nn.Parameter(0.01 * torch.randn(width))
        if context_features:
            self.context_in = nn.Linear(context_features, width)
        self.blocks = nn.ModuleList(_Block(width, heads, mlp_ratio) for _ in range(layers))
        self.norm_out = nn.LayerNorm(width)
        self.proj_out = nn.Linear(width, out_features)
        if zero_init:
            nn.init.zeros_(self.proj_out.weight)
            nn.init.zeros_(self.proj_out.bias)

    def empty_cache(self, like: Tensor) -> KVCache:
        """A cache with no tokens for a batch of ``like.shape[0]`` sequences in ``like``'s dtype and device."""
        empty = like.new_zeros(like.shape[0], self.heads, 0, self.width // self.heads)
        return KVCache((empty,) * len(self.blocks), (empty,) * len(self.blocks))

    def condition(self, context: Tensor | None) -> Tensor | None:
        r"""The per-sequence embedding ``(N, 1, width)`` added to every token, or ``None``.

        ``context``: class indices ``(N,)`` (an integer tensor, ``-1`` for the null class) or class
        weights ``w`` ``(N, num_classes)`` (a float tensor; the embedding is the mixture
        :math:`w^\top E` of the class rows, so a one-hot ``w`` is the index path and, with
        ``null_class="mean"``, the uniform ``w = 1/K`` is the null class) when the network has a
        class table; a float tensor ``(N, context_features)`` for a continuous context.

        Raises:
            ValueError: for a missing context, or class indices outside ``-1..num_classes-1``.
        """
        if self.num_classes:
            if context is None:
                raise ValueError(f"CausalTransformer: expected class indices in -1..{self.num_classes - 1}, got None")
            if context.is_floating_point() and context.dim() == 2 and context.shape[1] == self.num_classes:
                return (context @ self.classes)[:, None]  # soft labels: a mixture w^T E of the class rows
            if context.is_floating_point() or context.dim() != 1:
                raise ValueError(
                    "CausalTransformer: expected class indices as an integer tensor (N,), or class weights as a "
                    f"float tensor (N, {self.num_classes}), got {context.dtype} of shape {tuple(context.shape)}"
                )
            if context.numel() and (context.min() < -1 or context.max() >= self.num_classes):
                raise ValueError(
                    f"CausalTransformer: expected class indices in -1..{self.num_classes - 1} (-1: null class), "
                    f"got values in {int(context.min())}..{int(context.max())}"
                )
            null = self.classes.mean(0) if self.null_class == "mean" else self.null
            table = torch.cat((self.classes, null[None]))  # row -1 is the null class
            return table[context][:, None]
        if self.context_features:
            if context is None:
                raise ValueError(f"CausalTransformer: expected a context of width {self.context_features}, got None")
            return self.context_in(context)[:, None]
        return None

    def decode(
        self, x: Tensor, cache: KVCache, context: Tensor | None = None, *, temperature: float = 1.0
    ) -> tuple[Tensor, KVCache]:
        """Outputs for new tokens ``x`` ``(N, s, in_features)`` at the positions after ``cache``, and the grown cache.

        Equal to the matching rows of ``self(full_sequence)`` (causality); ``cache`` is not changed.

        Raises:
            ValueError: when the sequence would outgrow ``tokens`` positions.
        """
        start = cache.length
        if start + x.shape[1] > self.tokens:
            raise ValueError(
                f"CausalTransformer: expected at most {self.tokens} positions, got {start} cached + {x.shape[1]} new"
            )
        h = self.proj_in(x) + self.position[start : start + x.shape[1]]
        extra = self.condition(context)
        if extra is not None:
            h = h + extra
        keys, values = [], []
        for block, k, v in zip(self.blocks, cache.keys, cache.values, strict=True):
            h, (k, v) = block(h, (k, v), temperature)
            keys.append(k)
            values.append(v)
        return self.proj_out(self.norm_out(h)), KVCache(tuple(keys), tuple(values))

    def hidden_states(self, x: Tensor, context: Tensor | None = None, *, layers: Sequence[int]) -> list[Tensor]:
        """The hidden states ``(N, S, width)`` after each transformer block in ``layers`` (0-based), one pass.

        Row ``s`` depends on input tokens ``0..s`` only, as the output does; the pass stops at the
        deepest layer asked for (what representation alignment reads, and nothing more).

        Raises:
            ValueError: for a layer outside ``0..layers-1`` or too many positions.
        """
        return self._run(x, context, layers, output=False)[1]

    def forward_with_states(
        self, x: Tensor, context: Tensor | None = None, *, layers: Sequence[int]
    ) -> tuple[Tensor, list[Tensor]]:
        """``(self(x, context), self.hidden_states(x, context, layers=layers))`` from one pass.

        The states are the ones the output is computed through (one graph), so a loss on both
        costs one forward and one backward, not two.

        Raises:
            ValueError: for a layer outside ``0..layers-1`` or too many positions.
        """
        return self._run(x, context, layers, output=True)

    def _run(
        self, x: Tensor, context: Tensor | None, layers: Sequence[int], *, output: bool
    ) -> tuple[Tensor | None, list[Tensor]]:
        """One whole-sequence pass keeping the states after ``layers``; to the output or the deepest layer."""
        wanted = sorted(set(layers))
        if not wanted or wanted[0] < 0 or wanted[-1] >= len(self.blocks):
            raise ValueError(f"CausalTransformer: expected layers in 0..{len(self.blocks) - 1}, got {list(layers)}")
        if x.shape[1] > self.tokens:
            raise ValueError(f"CausalTransformer: expected at most {self.tokens} positions, got {x.shape[1]}")
        h = self.proj_in(x) + self.position[: x.shape[1]]
        extra = self.condition(context)
        if extra is not None:
            h = h + extra
        states = {}
        for index, block in enumerate(self.blocks if output else self.blocks[: wanted[-1] + 1]):
            h, _ = block(h, None, 1.0)
            states[index] = h
        out = self.proj_out(self.norm_out(h)) if output else None
        return out, [states[layer] for layer in layers]

    def forward(self, x: Tensor, context: Tensor | None = None, *, temperature: float = 1.0) -> Tensor:
        """All outputs ``(N, S, out_features)`` of a whole sequence ``x`` ``(N, S, in_features)`` in one pass."""
        return self.decode(x, self.empty_cache(x), context, temperature=temperature)[0]
