r"""Activation normalisation (Glow's ActNorm) for vectors and images, with data-dependent initialisation.

Per feature (vectors) or per channel (images), :math:`z = x\,e^{s} + b`. On the first forward
pass in training mode the layer sets :math:`s = -\log \sigma`, :math:`b = -\mu/\sigma` from the
batch statistics, so that its outputs have zero mean and unit variance; afterwards it is an
ordinary learnable affine layer with no batch dependence. The ``initialized`` flag is a
**registered buffer**, so a model restored with ``load_state_dict`` never re-initialises (nflows
keeps it as a Python attribute and destroys trained weights on reload; see ``docs/tabular.md``).

Also :class:`BatchNorm`, batch normalisation as a bijection (batch statistics in train mode,
running statistics in eval mode).

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

from flows.bijections.base import Bijection, InverseNotAvailable

__all__ = ["ActNorm", "ActNorm2d", "BatchNorm"]


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
        if len(self.event_shape) != 1 + self._spatial:
            expected = "(features,)" if not self._spatial else "(channels, H, W)"
            raise ValueError(
                f"{type(self).__name__}: expected an event of shape {expected}, got {tuple(self.event_shape)}"
            )
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
        r"""Set ``s, b`` from the statistics of ``x`` (all processes' batches together).

        Corrected two-pass algorithm (Chan, Golub, LeVeque 1983): a first pass for the mean
        :math:`\bar x`, a second for the deviations :math:`d = x - \bar x`, whose mean corrects
        :math:`\bar x` and whose second moment gives the variance
        :math:`\sigma^2 = \overline{d^2} - \bar d^{\,2}`. Unlike :math:`E[x^2] - \mu^2`, this
        does not cancel catastrophically for data far from zero (float32 data of mean 1e4 and unit
        spread get their exact statistics, not a spread of 0 or 8). An empty batch leaves the layer
        uninitialised.
        """
        channel_axis = x.dim() - len(self.event_shape)
        flat = x.movedim(channel_axis, 0).reshape(self.event_shape[0], -1)
        distributed = dist.is_available() and dist.is_initialized()
        first = torch.stack((flat.sum(1), flat.new_full((flat.shape[0],), flat.shape[1])))
        if distributed:
            dist.all_reduce(first)
        count = first[1]
        if not bool((count > 0).all()):
            return
        mean = first[0] / count
        deviation = flat - mean[:, None]
        second = torch.stack((deviation.sum(1), deviation.square().sum(1)))
        if distributed:
            dist.all_reduce(second)
        correction = second[0] / count
        mean = mean + correction
        std = (second[1] / count - correction.square()).clamp_min(0).sqrt()
        if not bool(torch.isfinite(mean).all() and torch.isfinite(std).all()):
            raise ValueError(
                f"{type(self).__name__}: expected finite data for the data-dependent initialisation, got a first "
                "batch with NaN/Inf values (or values whose spread overflows); the layer stays uninitialised"
            )
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


class BatchNorm(Bijection):
    r"""Batch normalisation as a bijection (RealNVP, MAF), for vector events.

    * forward: :math:`z = e^{\gamma} \odot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta`,
      :math:`\log|\det J| = \sum_i [\gamma_i - \tfrac12 \log(\sigma_i^2 + \epsilon)]`;
    * inverse (eval mode only): :math:`x = \mu + \sqrt{\sigma^2 + \epsilon} \odot (z - \beta) e^{-\gamma}`.

    **Train mode**: :math:`\mu, \sigma^2` are the statistics of the current batch (over every batch
    dimension; biased variance, as :class:`torch.nn.BatchNorm1d`), gradients flow through them,
    and the running averages are updated, ``running ← (1 - m) running + m · batch`` (the running
    variance with the unbiased batch variance, as PyTorch does). The output then depends on the
    whole batch, so it is not a per-sample density (the log-det ignores that dependence) and there
    is no inverse: :meth:`inverse_and_log_det` raises :class:`InverseNotAvailable`.

    **Eval mode**: :math:`\mu, \sigma^2` are the running averages: a fixed affine map, a proper
    per-sample bijection (``log_prob`` is the same for a sample alone or in a batch of 256), and
    evaluation never touches the running statistics. Evaluate with :func:`flows.evaluating`, which
    switches to eval mode and restores the previous modes; scoring test data in train mode would
    overwrite the running statistics with test statistics and make the score depend on the batch
    (the pitfall of ``docs/tabular.md``). ``running_var`` starts at **ones** (nflows starts it at zeros, so a model
    evaluated before any training step gets a log-det of :math:`-\tfrac12 \log\epsilon` per feature).

    References:
        Ioffe, Szegedy (2015), "Batch Normalization: Accelerating Deep Network Training by Reducing
        Internal Covariate Shift", ICML, arXiv:1502.03167. Dinh, Sohl-Dickstein, Bengio (2017),
        "Density estimation using Real NVP", ICLR, arXiv:1605.08803 (Appendix E).
        Papamakarios, Pavlakou, Murray (2017), "Masked Autoregressive Flow for Density
        Estimation", NeurIPS, arXiv:1705.07057 (Section 3.4).

    Args:
        features: number of features.
        momentum: weight ``m`` of the current batch in the running averages.
        eps: added to the variance.

    Raises:
        ValueError: in train mode, for a batch of fewer than two samples.

    Example:
        >>> import torch
        >>> t = BatchNorm(2)
        >>> z = t(3 + 2 * torch.randn(500, 2))  # train mode: batch statistics
        >>> bool(z.mean(0).abs().max() < 1e-5)
        True
        >>> _ = t.eval()
        >>> x = torch.randn(4, 2)
        >>> torch.allclose(t.inverse(t(x)), x, atol=1e-6)
        True
    """

    def __init__(self, features: int, *, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__(features)
        if len(self.event_shape) != 1 or self.event_shape[0] is None:
            raise ValueError(f"BatchNorm: expected a vector event (features: int), got {features!r}")
        if not 0 <= momentum <= 1:
            raise ValueError(f"BatchNorm: expected 0 <= momentum <= 1, got {momentum}")
        if not eps > 0:
            raise ValueError(f"BatchNorm: expected eps > 0, got {eps}")
        n = self.event_shape[0]
        self.momentum, self.eps = float(momentum), float(eps)
        self.log_gamma = nn.Parameter(torch.zeros(n))
        self.beta = nn.Parameter(torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def _statistics(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if not self.training:
            return self.running_mean, self.running_var
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] < 2:
            raise ValueError(
                f"BatchNorm: expected at least 2 samples in train mode (batch statistics), got input of shape "
                f"{tuple(x.shape)}; evaluate single samples in eval mode (flows.evaluating)"
            )
        var, mean = torch.var_mean(flat, dim=0, correction=0)
        with torch.no_grad():
            count = flat.shape[0]
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach() * (count / (count - 1)), self.momentum)
        return mean, var

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        mean, var = self._statistics(x)
        log_scale = self.log_gamma - 0.5 * torch.log(var + self.eps)
        z = torch.addcmul(self.beta, x - mean, log_scale.exp())
        return z, log_scale.sum().expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.training:
            raise InverseNotAvailable(
                "BatchNorm: the inverse is only available in eval mode; in train mode the forward map "
                "normalises with the statistics of the whole batch, which an inverse cannot recover. "
                "Call .eval() (or sample inside flows.evaluating(model))"
            )
        log_scale = self.log_gamma - 0.5 * torch.log(self.running_var + self.eps)
        x = torch.addcmul(self.running_mean, z - self.beta, torch.exp(-log_scale))
        return x, (-log_scale.sum()).expand(self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, momentum={self.momentum}, eps={self.eps}"
