r"""Transformer autoregressive flow builder: :class:`TarFlow`, for images (patches) and vectors (feature groups).

A stack of :class:`~flows.bijections.TransformerAutoregressive` blocks over a token sequence,
consecutive blocks in opposite token orders (raster, then reverse raster), with a standard
normal base. The tokens are an image's ``p × p`` patches (:class:`~flows.bijections.Patchify`) or
a vector's consecutive groups of ``token_features`` features; the latent has the data's shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flows._validation import (
    as_sample_shape,
    check_builder,
    check_count,
    check_event,
    check_finite,
    check_hidden,
    check_like,
    check_nonnegative,
)
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain, Inverse
from flows.bijections.multiscale import Flatten
from flows.bijections.patchify import Patchify
from flows.bijections.standardize import Standardize
from flows.bijections.transformer_autoregressive import TransformerAutoregressive
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["TarFlow", "TarFlowPass"]


def _tokenizer(who: str, features: int | Sequence[int], patch: int | None, token_features: int) -> Bijection:
    """The map from one data event to its ``(T, C)`` tokens (checked), a volume-preserving reshuffle."""
    if isinstance(features, Sequence) and not isinstance(features, (str, bytes)):
        shape = tuple(features)
        if len(shape) != 3:
            raise ValueError(f"{who}: expected features to be an int or an image shape (C, H, W), got {shape}")
        return Patchify(shape, 4 if patch is None else check_count(who, "patch", patch))
    check_builder(who, features, 0)
    if patch is not None:  # a vector that is a flattened square one-channel image
        side = math.isqrt(features)
        if side * side != features:
            raise ValueError(
                f"{who}: expected a square number of features with patch={patch} (a flattened one-channel "
                f"square image), got {features}"
            )
        return Chain(Inverse(Flatten((1, side, side))), Patchify((1, side, side), check_count(who, "patch", patch)))
    token_features = check_count(who, "token_features", token_features)
    if features % token_features:
        raise ValueError(
            f"{who}: expected token_features to divide features, got {token_features} for {features} features"
        )
    return Inverse(Flatten((features // token_features, token_features)))


@register
class TarFlow(Flow):
    r"""Transformer autoregressive flow: ``transforms`` TarFlow blocks in alternating token orders.

    Each block maps the tokens :math:`\tilde z_t = (\tilde x_t - b_t) / s_t` with
    :math:`(\log s_t, b_t)` from a causal transformer of the tokens before :math:`t` (see
    :class:`~flows.bijections.TransformerAutoregressive`); block :math:`i` reads the tokens in
    raster order when :math:`i` is even and in reverse order when it is odd. ``log_prob`` is one
    parallel pass per block; ``sample`` decodes ``T`` tokens one at a time per block (KV-cached).

    Tokens:

    * ``features = (C, H, W)``: the image's ``patch × patch`` patches (default patch 4), ``C·p²``
      features each;
    * ``features = D`` with ``patch``: the vector is a flattened ``1 × √D × √D`` image (digits,
      MNIST from ``flows fit``), cut into patches;
    * ``features = D``: consecutive groups of ``token_features`` features (1: each feature is a
      token, a MAF whose conditioner is a causal transformer).

    Conditioning: ``num_classes = K`` makes the context a class index ``(*batch, 1)`` (a float
    holding ``0..K-1``, or ``-1`` for the null class); ``context = c`` a continuous context.

    References:
        Zhai et al. (2024), "Normalizing Flows are Capable Generative Models", arXiv:2412.06329.
        Gu et al. (2025), "STARFlow", arXiv:2506.06276 (softplus scale, soft clip, SOS token).

    Args:
        features: ``D`` or an image shape ``(C, H, W)``.
        context: continuous context width (0 for none).
        transforms: number of TarFlow blocks.
        hidden: the transformer of every block, one entry per layer, all equal: ``(width,) * layers``.
        heads: attention heads (default: ``width // 64`` when 64 divides the width, else 1).
        mlp_ratio: MLP expansion in the transformer blocks.
        num_classes: number of classes for class conditioning (0 for none).
        null_class: ``"mean"`` or ``"learned"``: the embedding of class ``-1``.
        patch: patch side for images.
        token_features: features per token for vectors without ``patch``.
        scale: ``"exp"`` (TarFlow), ``"softplus"`` (STARFlow) or ``"sigmoid"`` (Jet-style, bounded).
        soft_clip: soft clip bound of the raw log-scale (``None`` for none).
        first_token: ``"identity"`` (TarFlow) or ``"transform"`` (STARFlow's SOS token).
        decoding: how sampling inverts a block: ``"cached"``, ``"uncached"`` or ``"jacobi"``.
        label_dropout: in train mode, :meth:`log_prob` replaces each class label by the null class
            with this probability (TarFlow trains guidance so, with 0.1), once for all blocks.
        noise_std: the Gaussian noise augmentation :math:`y = x + \sigma\varepsilon` the flow is
            trained with (``None`` for none), recorded on the model: :class:`~flows.train.MaximumLikelihood`
            adds it to every training batch, ``sample(denoise=True)`` removes it by a Tweedie step and
            :func:`~flows.classify.bayes_classifier` can score inputs noised alike (``noise_std="model"``).
        standardize: data or a fitted :class:`~flows.bijections.Standardize` layer (see :class:`~flows.flow.Flow`).

    Raises:
        ValueError, TypeError: for a bad argument (naming what was expected and what came).

    Example:
        >>> import torch
        >>> flow = TarFlow((1, 4, 4), patch=2, transforms=2, hidden=(16,), num_classes=3)
        >>> y = flow.class_context([0, 2])  # one sample of class 0, one of class 2
        >>> x = flow.sample(context=y)
        >>> x.shape, flow.log_prob(x, context=y).shape
        (torch.Size([2, 1, 4, 4]), torch.Size([2]))
    """

    def __init__(
        self,
        features: int | Sequence[int],
        context: int = 0,
        *,
        transforms: int = 4,
        hidden: Sequence[int] = (64, 64),
        heads: int | None = None,
        mlp_ratio: int = 4,
        num_classes: int = 0,
        null_class: str = "mean",
        patch: int | None = None,
        token_features: int = 1,
        scale: str = "exp",
        soft_clip: float | None = None,
        first_token: str = "identity",
        decoding: str = "cached",
        label_dropout: float = 0.0,
        noise_std: float | None = None,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        who = type(self).__name__
        noise_std = None if noise_std is None else check_nonnegative(who, "noise_std", noise_std) or None
        label_dropout = check_nonnegative(who, "label_dropout", label_dropout)
        if label_dropout > 1 or (label_dropout and not num_classes):
            raise ValueError(f"{who}: expected label_dropout in [0, 1] with num_classes > 0, got {label_dropout}")
        tokenizer = _tokenizer(who, features, patch, token_features)
        context = check_count(who, "context", context, minimum=0)
        transforms = check_count(who, "transforms", transforms)
        widths = check_hidden(who, hidden, minimum_layers=1)
        if len(set(widths)) != 1:
            raise ValueError(f"{who}: expected hidden to be equal widths, one per transformer layer, got {widths}")
        width = widths[0]
        heads = (width // 64 if width % 64 == 0 else 1) if heads is None else check_count(who, "heads", heads)
        num_classes = check_count(who, "num_classes", num_classes, minimum=0)
        if num_classes and context:
            raise ValueError(f"{who}: expected num_classes or context, got both ({num_classes} and {context})")
        tokens, token_size = tokenizer.event_shape_out
        blocks = [
            TransformerAutoregressive(
                tokens,
                token_size,
                context,
                width=width,
                layers=len(widths),
                heads=heads,
                mlp_ratio=check_count(who, "mlp_ratio", mlp_ratio),
                num_classes=num_classes,
                null_class=null_class,
                order="forward" if i % 2 == 0 else "reverse",
                scale=scale,
                soft_clip=soft_clip,
                first_token=first_token,
                decoding=decoding,
            )
            for i in range(transforms)
        ]
        transform = Chain(tokenizer, *blocks, Inverse(tokenizer))
        super().__init__(
            transform,
            StandardNormal(transform.event_shape_out),
            context=1 if num_classes else context,
            standardize=standardize,
        )
        self.tokens, self.num_classes, self.label_dropout = tokens, num_classes, label_dropout
        self.noise_std = noise_std

    @property
    def blocks(self) -> list[TransformerAutoregressive]:
        """The TarFlow blocks, data side first."""
        return [m for m in self.core if isinstance(m, TransformerAutoregressive)]

    def class_context(self, labels: Tensor | Sequence[int]) -> Tensor:
        """The context ``(N, 1)`` for class indices ``labels`` (``-1``: the null class), in the flow's dtype.

        Raises:
            ValueError: for a flow without classes or an index outside ``-1..num_classes-1``.
        """
        if not self.num_classes:
            raise ValueError("TarFlow: expected a class-conditional flow (num_classes > 0) for class labels")
        labels = torch.as_tensor(labels)
        if labels.is_floating_point() or labels.dim() != 1:
            raise ValueError(f"TarFlow: expected integer class labels (N,), got {labels.dtype} {tuple(labels.shape)}")
        if labels.numel() and (labels.min() < -1 or labels.max() >= self.num_classes):
            raise ValueError(
                f"TarFlow: expected class labels in -1..{self.num_classes - 1}, got values in "
                f"{int(labels.min())}..{int(labels.max())}"
            )
        return labels.to(self._anchor)[:, None]

    def _dropped(self, x: Tensor, context: Tensor | None) -> Tensor | None:
        """The context with labels dropped to the null class (train mode with ``label_dropout`` only)."""
        if self.training and self.label_dropout and context is not None:
            self._check_context(context, x)
            drop = torch.rand(context.shape, device=context.device) < self.label_dropout
            context = torch.where(drop, torch.full_like(context, -1.0), context)
        return context

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log-density of ``x``; in train mode with ``label_dropout``, labels are first dropped to the null class."""
        return super().log_prob(x, self._dropped(x, context))

    def _checked(self, x: Tensor, context: Tensor | None, *, has_context: bool = True) -> None:
        name = type(self).__name__
        check_event(x, self.transform.event_shape, name)
        check_like(x, self._anchor, name)
        if self.check_finite:
            check_finite(x, name)
        if has_context:
            self._check_context(context, x)

    def log_prob_class_weights(self, x: Tensor, weights: Tensor) -> Tensor:
        r"""Log-density of ``x`` given the class mixture :math:`w^\top E` in every block (soft labels).

        ``weights`` ``(*batch, K)``, real: a one-hot row gives ``log_prob`` of that class, the
        uniform row ``1/K`` the mean-embedding null class (``null_class="mean"``). Differentiable in
        ``weights``: :func:`flows.classify.gradient_classifier` reads :math:`\partial \log p / \partial w`.

        Raises:
            ValueError: for a flow without classes, or bad data or weights.
        """
        if not self.num_classes:
            raise ValueError("TarFlow: expected a class-conditional flow (num_classes > 0) for class weights")
        self._checked(x, None, has_context=False)
        ladj = None
        for layer in _members(self.transform):
            if isinstance(layer, TransformerAutoregressive):
                x, term = layer.forward_with_class_weights(x, weights)
            else:
                x, term = layer.forward_and_log_det(x, None)
            ladj = term if ladj is None else ladj + term
        return self.base.log_prob(x) + ladj

    def forward_pass(
        self, x: Tensor, context: Tensor | None = None, *, states: Sequence[tuple[int, int]] = ()
    ) -> TarFlowPass:
        """``log_prob`` that also keeps every block's input and the context it used (label dropout applied).

        ``states``: ``(block, layer)`` pairs (blocks ``0..n-1`` as in :attr:`blocks`, data side
        first) whose transformer hidden states to keep, taken from the same pass
        (:meth:`~flows.bijections.TransformerAutoregressive.forward_with_states`). What
        :class:`flows.train.RepresentationAlignment` builds the aligned features from, in the
        same pass as the maximum-likelihood loss.
        """
        context = self._dropped(x, context)
        self._checked(x, context)
        keep: dict[int, list[int]] = {}
        for pair in states:
            ints = isinstance(pair, Sequence) and len(pair) == 2
            if not ints or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
                raise ValueError(f"TarFlow: expected states as (block, layer) pairs of ints, got {pair!r}")
            if not 0 <= pair[0] < len(self.blocks):
                raise ValueError(f"TarFlow: expected state blocks in 0..{len(self.blocks) - 1}, got {pair[0]}")
            keep.setdefault(pair[0], []).append(pair[1])
        inputs, kept, ladj = [], {}, None
        for layer in _members(self.transform):
            if isinstance(layer, TransformerAutoregressive):
                b = len(inputs)
                inputs.append(x)
                if b in keep:
                    x, term, hs = layer.forward_with_states(x, context, layers=keep[b])
                    kept.update(zip(((b, lay) for lay in keep[b]), hs, strict=True))
                else:
                    x, term = layer.forward_and_log_det(x, context)
                outputs = x
            else:
                x, term = layer.forward_and_log_det(x, context)
            ladj = term if ladj is None else ladj + term
        return TarFlowPass(self.base.log_prob(x, context) + ladj, inputs, outputs, context, kept)

    @torch.no_grad()
    def sample(
        self,
        sample_shape: Sequence[int] | int = (),
        context: Tensor | None = None,
        *,
        guidance: float | None = None,
        schedule: str = "constant",
        temperature: float = 1.0,
        rule: str = "tarflow",
        denoise: float | bool | None = None,
    ) -> Tensor:
        r"""Samples ``(*sample_shape, *context_batch, *event_shape)``, with classifier-free guidance when asked.

        ``guidance = w`` decodes every block with
        :meth:`~flows.bijections.TransformerAutoregressive.inverse_guided` (``schedule``:
        ``"constant"`` or ``"linear"`` over each block's token order; ``temperature``: the
        unconditional pass's attention temperature; ``rule``: ``"tarflow"`` or STARFlow's
        ``"product"``); ``None`` is plain sampling. ``w = 0`` gives
        the same samples as plain sampling from the same noise.

        ``denoise = σ`` (or ``True``: the flow's recorded ``noise_std``) ends with one Tweedie step
        with the flow's own score, :math:`x + \sigma^2 \nabla_x \log p(x \mid c)`
        (:func:`~flows.tweedie_denoise`, conditional on ``context``): the posterior mean of clean
        data for a flow trained on data noised with σ.

        Raises:
            ValueError: for ``denoise=True`` on a flow trained without noise, or a bad σ.
        """
        sigma = self._denoise_sigma(denoise)
        x = self._sample(sample_shape, context, guidance, schedule, temperature, rule)
        if sigma is None:
            return x
        c = None if context is None else self._latent_context(as_sample_shape(sample_shape), context)
        y = x.detach().requires_grad_(True)
        with torch.enable_grad():  # the score of the summed log-density (what flows.tweedie_denoise computes)
            (score,) = torch.autograd.grad(self.log_prob(y, c).sum(), y)
        return (y + sigma**2 * score).detach()

    def _denoise_sigma(self, denoise: float | bool | None) -> float | None:
        if denoise is None or denoise is False:
            return None
        if denoise is True:
            if self.noise_std is None:
                raise ValueError("TarFlow: expected a flow trained with noise_std for denoise=True, got noise_std=None")
            return self.noise_std
        if isinstance(denoise, (int, float)) and 0 <= denoise < math.inf:
            return float(denoise)
        raise ValueError(f"TarFlow: expected denoise to be None, True or a finite sigma >= 0, got {denoise!r}")

    def _sample(
        self, sample_shape: Sequence[int] | int, context: Tensor | None, guidance, schedule, temperature, rule
    ) -> Tensor:
        if guidance is None:
            return super().sample(sample_shape, context)
        self._check_context(context)
        shape = as_sample_shape(sample_shape)
        x = self.base.sample(shape, context)
        c = self._latent_context(shape, context)
        for layer in reversed(_members(self.transform)):
            if isinstance(layer, TransformerAutoregressive):
                x = layer.inverse_guided(x, c, weight=guidance, schedule=schedule, temperature=temperature, rule=rule)
            else:
                x = layer.inverse(x, c)
        return x


@dataclass(frozen=True)
class TarFlowPass:
    """What :meth:`TarFlow.forward_pass` returns.

    Attributes:
        log_prob: ``log p(x | context)`` ``(*batch,)``.
        inputs: each TarFlow block's input tokens ``(*batch, T, C)``, data side first.
        output: the last block's output tokens (the latent, as tokens).
        context: the context the blocks saw (labels after dropout).
        states: the hidden states asked for, ``{(block, layer): (*batch, T, width)}``.
    """

    log_prob: Tensor
    inputs: list[Tensor]
    output: Tensor
    context: Tensor | None
    states: dict[tuple[int, int], Tensor] = field(default_factory=dict)


def _members(transform: Bijection) -> list[Bijection]:
    """The layers of nested chains, data side first."""
    if isinstance(transform, Chain):
        return [m for member in transform for m in _members(member)]
    return [transform]
