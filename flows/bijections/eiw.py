r"""The EIW shuffle: feature-dependent channel weighting and an entropy-informed channel order before a split.

Chen et al. (2025) place a regularised, feature-dependent ``Shuffle`` before each split of a
multi-scale flow: channel-wise weights computed from the features, and a reordering of the channels
so that the informative ones are kept and the rest are factored out. The authors' exact operator is
not public; **this module implements our own, exactly invertible formulation** of the three ideas:

(a) *feature-dependent channel weighting* (:class:`EIWShuffle`, two couplings over channel halves):
    per sample, positive weights :math:`w_B = \exp g_1(\text{pool}(x_A))` for the channels of one
    half :math:`B` from the pooled statistics (per-channel mean and standard deviation over the
    pixels) of the other half :math:`A`, then :math:`w_A = \exp g_2(\text{pool}(y_B))` the other way
    round; :math:`\log|\det J| = H W (\sum \log w_B + \sum \log w_A)`;
(b) *entropy-informed shuffle* (:class:`EntropyPermutation`): a channel permutation driven by running
    per-channel estimates of non-Gaussianity (a negentropy approximation, :func:`negentropy`), kept in
    buffers, updated only in train mode (with hysteresis) and frozen in eval mode, so that the
    inverse recomputes nothing; the most Gaussian channels go last, where the following split
    factors them out;
(c) a *regulariser*: the negentropy of the channels that will be split off, weighted and handed to the
    trainer through :func:`flows.bijections.auxiliary.add_auxiliary_loss` (name ``"eiw_negentropy"``).

References:
    Chen, Du, Li, Zeng, Paisley (2025), "Entropy-Informed Weighting Channel Normalizing Flow for Deep
    Generative Models", Pattern Recognition, arXiv:2407.04958. Hyvärinen (1998), "New approximations
    of differential entropy for independent component analysis and projection pursuit", NeurIPS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_count
from flows.bijections.auxiliary import add_auxiliary_loss, collecting_auxiliary_losses
from flows.bijections.base import Chain
from flows.bijections.coupling import Coupling, half_mask
from flows.bijections.permutation import Permutation
from flows.bijections.transformers import AffineTransformer
from flows.nn import PooledMLP

__all__ = ["EIWShuffle", "EntropyPermutation", "negentropy"]

GAUSSIAN_LOGCOSH = 0.37456720749143807
"""``E[log cosh ν]`` for a standard normal ``ν`` (numerical quadrature)."""


def negentropy(x: Tensor, *, eps: float = 1e-8) -> Tensor:
    r"""Per-channel negentropy approximation of image batches ``(*batch, C, H, W)``: shape ``(C,)``.

    Each channel is standardised over the batch and the pixels, :math:`y = (x - \mu)/\sigma`, and
    scored with Hyvärinen's one-unit approximation

    .. math:: J(y) \approx \big(\mathbb E[\log\cosh y] - \mathbb E[\log\cosh \nu]\big)^2,
              \quad \nu \sim \mathcal N(0, 1),

    which is 0 for a Gaussian channel and grows with the distance from Gaussianity. Differentiable
    (it is also the EIW regulariser).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> gauss = torch.randn(400, 1, 10, 10, generator=g)
        >>> j = negentropy(torch.cat((gauss, gauss.pow(3)), dim=1))  # channels: Gaussian, cubed Gaussian
        >>> j.shape, bool(j[0] < 1e-4 < 1e-2 < j[1])
        (torch.Size([2]), True)
    """
    channels = x.movedim(-3, 0).reshape(x.shape[-3], -1)
    var, mean = torch.var_mean(channels, dim=1, keepdim=True, unbiased=False)
    y = (channels - mean) * torch.rsqrt(var + eps)
    # log cosh y = |y| + log1p(exp(-2|y|)) - log 2, stable for large |y|
    logcosh = y.abs() + torch.log1p(torch.exp(-2 * y.abs())) - 0.6931471805599453
    return (logcosh.mean(dim=1) - GAUSSIAN_LOGCOSH).square()


def _split_size(channels: int, split: int | None, who: str) -> int:
    """``split`` checked to lie in ``0..channels``; ``None`` gives ``C - C // 2``, what a default split factors out."""
    split = channels - channels // 2 if split is None else split
    if not isinstance(split, int) or not 0 <= split <= channels:
        raise ValueError(f"{who}: expected split in 0..{channels}, got {split!r}")
    return split


class EntropyPermutation(Permutation):
    r"""Channel permutation that puts the ``split`` most Gaussian channels last (where a split factors them out).

    :math:`z_{:,i} = x_{:,\pi(i)}`, :math:`\log|\det J| = 0`. The order is driven by
    :math:`\hat J`, an exponential moving average of :func:`negentropy` per input channel: the
    ``split`` channels with the smallest :math:`\hat J` go last, the others first, each group in
    increasing channel index. Only the *membership* of the groups is entropy-informed: reordering
    within a group would change nothing about what is factored out, yet would scramble the inputs
    of the layers that follow.

    In train mode, each forward pass (for the first ``update_steps`` passes, or always when
    ``None``) first folds the batch's estimate into :math:`\hat J` (first pass: taken as it is;
    then :math:`\hat J \leftarrow (1-m)\hat J + m J_\text{batch}`) and updates :math:`\pi`, then
    permutes. With hysteresis: the split-off group changes only when the best group's summed
    :math:`\hat J` is below ``(1 - margin)`` times that of the current group, so channels of
    similar scores do not swap back and forth (each swap disturbs the training of the layers that
    follow). The output of a train-mode call can depend on the batch through :math:`\pi`; in eval
    mode (and after ``update_steps``) :math:`\pi` is frozen and the layer is a fixed permutation.
    The inverse always uses the stored :math:`\pi` and never updates anything, so it inverts the
    latest forward pass exactly. Estimates, permutation and step count are buffers (in ``state_dict``).

    Args:
        channels: number of channels ``C``.
        split: number of channels placed last (default ``C - C // 2``, what
            :class:`~flows.bijections.multiscale.Split` factors out by default).
        momentum: weight ``m`` of the newest batch in the moving average.
        margin: relative hysteresis of a change of the split-off group (0 = always the best group).
        update_steps: number of train-mode forward passes during which the order is re-estimated
            (``None`` = throughout training).

    References:
        Chen, Du, Li, Zeng, Paisley (2025), "Entropy-Informed Weighting Channel Normalizing Flow for
        Deep Generative Models", Pattern Recognition, arXiv:2407.04958 (the idea; this formulation
        is ours, see the module docstring).

    Example:
        >>> import torch
        >>> t = EntropyPermutation(3, split=1)
        >>> x = torch.stack((torch.randn(64, 4, 4), torch.rand(64, 4, 4), torch.randn(64, 4, 4) ** 3), dim=1)
        >>> z = t(x)  # train mode: estimates updated, the Gaussian channel 0 goes last
        >>> t.permutation.tolist(), torch.equal(t.inverse(z), x)
        ([1, 2, 0], True)
    """

    def __init__(
        self,
        channels: int,
        *,
        split: int | None = None,
        momentum: float = 0.05,
        margin: float = 0.1,
        update_steps: int | None = None,
    ) -> None:
        check_count("EntropyPermutation", "channels", channels)
        split = _split_size(channels, split, "EntropyPermutation")
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"EntropyPermutation: expected 0 < momentum <= 1, got {momentum}")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"EntropyPermutation: expected 0 <= margin < 1, got {margin}")
        if update_steps is not None and (not isinstance(update_steps, int) or update_steps < 0):
            raise ValueError(f"EntropyPermutation: expected update_steps >= 0 or None, got {update_steps!r}")
        super().__init__((channels, None, None), torch.arange(channels))
        self.split, self.momentum, self.margin = split, float(momentum), float(margin)
        self.update_steps = update_steps
        self.register_buffer("running_negentropy", torch.zeros(channels))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold the negentropy of the batch ``x`` into the running estimates and update the permutation."""
        estimate = negentropy(x.detach()).to(self.running_negentropy.dtype)
        if not bool(torch.isfinite(estimate).all()):  # a batch with NaN/Inf: keep the estimates finite
            return
        if int(self.steps) == 0:
            self.running_negentropy.copy_(estimate)
        else:
            self.running_negentropy.lerp_(estimate, self.momentum)
        self.steps.add_(1)
        channels, split = len(self.permutation), self.split
        if split in (0, channels):
            return
        scores = self.running_negentropy
        current = self.permutation[channels - split :]
        best = torch.argsort(scores, stable=True)[:split]
        if not bool(scores[best].sum() < (1 - self.margin) * scores[current].sum()):
            return
        last = torch.zeros(channels, dtype=torch.bool, device=scores.device)
        last[best] = True
        order = torch.cat((torch.nonzero(~last).squeeze(-1), torch.nonzero(last).squeeze(-1)))
        self.permutation.copy_(order)
        self.inverse_permutation.copy_(torch.argsort(order))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.training and (self.update_steps is None or int(self.steps) < self.update_steps):
            self.update(x)
        return super().forward_and_log_det(x, context)

    def extra_repr(self) -> str:
        return (
            f"channels={self.event_shape[0]}, split={self.split}, momentum={self.momentum}, "
            f"margin={self.margin}, update_steps={self.update_steps}"
        )


class _LogWeights(nn.Module):
    """Turn per-channel log-weights ``(*, n, H, W)`` from a network into affine raw parameters (shift 0)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        log_w = self.net(x) if context is None else self.net(x, context)
        return torch.cat((torch.zeros_like(log_w), log_w), dim=-3)  # Coupling's layout: all shifts, then log-scales


class EIWShuffle(Chain):
    r"""Our EIW shuffle: feature-dependent channel weighting, then the entropy-informed permutation.

    A :class:`~flows.bijections.base.Chain` of three members on ``(C, H, W)`` images, with
    :math:`A` the first ``C // 2`` channels and :math:`B` the rest:

    1. :math:`y_B = x_B \odot w_B(\text{pool}(x_A))`, :math:`y_A = x_A`;
    2. :math:`y'_A = y_A \odot w_A(\text{pool}(y_B))`, :math:`y'_B = y_B`;
    3. :class:`EntropyPermutation`: channels sorted from most to least non-Gaussian.

    Weights are per sample and per channel, constant over the pixels:
    :math:`w = \exp(c \tanh(g(\cdot)/c))` with ``c = clamp`` and :math:`g` a
    :class:`~flows.nn.PooledMLP` of the per-channel mean and standard deviation of the other half
    (zero-initialised, so the layer starts as a pure permutation).
    :math:`\log|\det J| = H W \big(\sum_{c \in B} \log w_c + \sum_{c \in A} \log w_c\big)`; the
    inverse divides by the same weights in the reverse order (exact).

    The regulariser (train mode only, and only while an :class:`~flows.bijections.auxiliary.AuxiliaryLosses`
    collector is open): ``regularization · Σ_c negentropy(z_c)`` over the last ``split`` output
    channels (those the next split factors out), added as ``"eiw_negentropy"``. It is
    differentiable, so it pushes every earlier layer to make the factored-out channels Gaussian.
    The default weight 0.01 is small next to a negative log-likelihood of hundreds of nats per
    image; set ``regularization=0`` to turn it off.

    Args:
        channels: number of channels ``C`` (at least 2).
        context: width of a vector context for the weight networks (0 for none).
        hidden: hidden widths of the two weight networks.
        clamp: bound on the absolute log-weights.
        split: number of trailing channels (the most Gaussian) that the following split factors
            out, and that the regulariser acts on (default ``C - C // 2``, what
            :class:`~flows.bijections.multiscale.Split` factors out by default).
        regularization: weight of the regulariser.
        momentum, margin, update_steps: see :class:`EntropyPermutation`.

    References:
        Chen, Du, Li, Zeng, Paisley (2025), "Entropy-Informed Weighting Channel Normalizing Flow for
        Deep Generative Models", Pattern Recognition, arXiv:2407.04958 (the idea; this formulation
        is ours, see the module docstring).

    Example:
        >>> import torch
        >>> from flows.bijections.auxiliary import AuxiliaryLosses
        >>> t = EIWShuffle(4, hidden=(8,))
        >>> x = torch.randn(16, 4, 3, 3)
        >>> with AuxiliaryLosses() as aux:
        ...     z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x, atol=1e-6), list(aux.by_name())
        (True, ['eiw_negentropy'])
    """

    def __init__(
        self,
        channels: int,
        context: int = 0,
        *,
        hidden: Sequence[int] = (32,),
        clamp: float = 2.0,
        split: int | None = None,
        regularization: float = 0.01,
        momentum: float = 0.05,
        margin: float = 0.1,
        update_steps: int | None = None,
    ) -> None:
        check_count("EIWShuffle", "channels", channels, minimum=2)
        split = _split_size(channels, split, "EIWShuffle")
        if regularization < 0:
            raise ValueError(f"EIWShuffle: expected regularization >= 0, got {regularization}")
        n_a = channels // 2
        event = (channels, None, None)
        members = []
        for keep_first in (True, False):
            n_kept = n_a if keep_first else channels - n_a
            net = PooledMLP(n_kept, channels - n_kept, hidden, context=context)
            members.append(
                Coupling(
                    event,
                    context,
                    transformer=AffineTransformer(clamp),
                    mask=half_mask(channels, keep_first=keep_first),
                    conditioner=_LogWeights(net),
                )
            )
        members.append(
            EntropyPermutation(channels, split=split, momentum=momentum, margin=margin, update_steps=update_steps)
        )
        super().__init__(*members)
        self.split = split
        self.regularization = float(regularization)

    @property
    def entropy_permutation(self) -> EntropyPermutation:
        """The entropy-informed permutation (last member)."""
        return self.transforms[-1]

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z, ladj = super().forward_and_log_det(x, context)
        if self.training and self.regularization and self.split and collecting_auxiliary_losses():
            penalty = negentropy(z[..., z.shape[-3] - self.split :, :, :]).sum()
            add_auxiliary_loss("eiw_negentropy", self.regularization * penalty)
        return z, ladj

    def extra_repr(self) -> str:
        return f"split={self.split}, regularization={self.regularization}"
