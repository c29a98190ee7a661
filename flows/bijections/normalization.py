r"""Activation normalisation (Glow's ActNorm) for vectors and images, with data-dependent initialisation.

Per feature (vectors) or per channel (images), :math:`z = x\,e^{s} + b`. On the first forward
pass in training mode the layer sets :math:`s = -\log \sigma`, :math:`b = -\mu/\sigma` from the
batch statistics, so that its outputs have zero mean and unit variance; afterwards it is an
ordinary learnable affine layer with no batch dependence. The ``initialized`` flag is a
**registered buffer**, so a model restored with ``load_state_dict`` never re-initialises (nflows
keeps it as a Python attribute and destroys trained weights on reload; METHODS.md §7).

References:
    Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS,
    arXiv:1807.03039.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from flows.bijections.base import Bijection

__all__ = ["ActNorm", "ActNorm2d"]


class ActNorm(Bijection):
    r"""Per-feature affine normalisation with data-dependent initialisation, for vector events.

    * forward: :math:`z = x \odot e^{s} + b`, :math:`\log|\det J| = \sum_i s_i`;
    * inverse: :math:`x = (z - b) \odot e^{-s}`.

    Initialisation (first training-mode forward pass, once): :math:`s = -\log\sigma`,
    :math:`b = -\mu e^{s}` with the batch mean :math:`\mu` and standard deviation :math:`\sigma`
    (all-reduced across processes when ``torch.distributed`` is initialised). Features whose batch
    spread is below ``eps`` (constant features, or a batch of one) keep unit scale and are only
    centred, instead of being blown up by ``1/σ``.

    Args:
        features: number of features.
        eps: smallest spread treated as non-zero.

    Example:
        >>> import torch
        >>> t = ActNorm(2)
        >>> z = t(3 + 2 * torch.randn(1000, 2))
        >>> bool(t.initialized), z.mean(0).abs().max() < 1e-5, (z.std(0, unbiased=False) - 1).abs().max() < 1e-5
        (True, tensor(True), tensor(True))
    """

    _spatial = 0  # number of trailing event dims the statistics are shared over

    def __init__(self, features: int | Sequence[int | None], *, eps: float = 1e-6) -> None:
        super().__init__(features)
        channels = self.event_shape[0]
        if channels is None:
            raise ValueError(f"{type(self).__name__}: the number of features/channels must be given")
        param_shape = (channels,) + (1,) * self._spatial
        self.shift = nn.Parameter(torch.zeros(param_shape))
        self.log_scale = nn.Parameter(torch.zeros(param_shape))
        self.register_buffer("initialized", torch.tensor(False))
        self.eps = eps

    def _multiplicity(self, x: Tensor) -> int:
        return math.prod(x.shape[x.dim() - self._spatial :]) if self._spatial else 1

    @torch.no_grad()
    def _initialize(self, x: Tensor) -> None:
        channel_axis = x.dim() - len(self.event_shape)
        flat = x.movedim(channel_axis, 0).reshape(self.event_shape[0], -1)
        stats = torch.stack((flat.sum(1), flat.square().sum(1), torch.full_like(flat[:, 0], flat.shape[1])))
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        count = stats[2]
        mean = stats[0] / count
        std = (stats[1] / count - mean.square()).clamp_min(0).sqrt()
        std = torch.where(std > self.eps, std, torch.ones_like(std))
        self.log_scale.copy_((-std.log()).view_as(self.log_scale))
        self.shift.copy_((-mean / std).view_as(self.shift))
        self.initialized.fill_(True)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.training and not self.initialized:
            self._initialize(x)
        z = torch.addcmul(self.shift, x, self.log_scale.exp())
        ladj = self.log_scale.sum() * self._multiplicity(x)
        return z, ladj.expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = (z - self.shift) * torch.exp(-self.log_scale)
        ladj = -self.log_scale.sum() * self._multiplicity(z)
        return x, ladj.expand(self.batch_shape(z))


class ActNorm2d(ActNorm):
    r"""Per-channel ActNorm for ``(C, H, W)`` image events, any height and width.

    Same maps as :class:`ActNorm` with one scale and shift per channel shared over pixels, so
    :math:`\log|\det J| = H W \sum_c s_c`. Statistics for the initialisation are taken over the
    batch and all pixels.

    Args:
        channels: number of channels ``C``.
        eps: smallest spread treated as non-zero.

    Example:
        >>> import torch
        >>> t = ActNorm2d(3)
        >>> z, ladj = t.forward_and_log_det(torch.randn(2, 3, 4, 4))
        >>> z.shape, ladj.shape
        (torch.Size([2, 3, 4, 4]), torch.Size([2]))
    """

    _spatial = 2

    def __init__(self, channels: int, *, eps: float = 1e-6) -> None:
        super().__init__((channels, None, None), eps=eps)
