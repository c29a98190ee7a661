r"""Dequantization of discrete data into the unit cube: uniform and variational.

Uniform dequantization maps integer levels :math:`v \in \{0, \dots, K-1\}^D` to
:math:`x = (v + u)/K` with :math:`u \sim \mathcal U[0, 1)^D`. For any density :math:`p` on
:math:`[0, 1]^D`, Jensen's inequality gives a lower bound on the discrete log-likelihood,

.. math:: \log P(v) \ge \mathbb E_u[\log p((v + u)/K)] - D \log K,

which :func:`flows.metrics.bits_per_dim` turns into bits per dimension.

References:
    Theis, van den Oord, Bethge (2016), "A note on the evaluation of generative models", ICLR,
    arXiv:1511.01844.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flows._lazy import compiler_disable
from flows._validation import check_count, check_event, check_hidden
from flows.bijections import AffineCoupling, Chain, Invertible1x1Conv, Logit, Squeeze, half_mask
from flows.distributions import StandardNormal
from flows.nn import ConvNet

__all__ = ["VariationalDequantizer", "uniform_dequantize"]


@compiler_disable  # data preparation: a range check and a draw, kept out of compiled graphs
def uniform_dequantize(
    levels_data: Tensor, levels: int, *, generator: torch.Generator | None = None, dtype: torch.dtype | None = None
) -> Tensor:
    """Map integer data in ``0..levels-1`` to ``(v + u) / levels`` in ``[0, 1)`` with uniform noise ``u``.

    Args:
        levels_data: integer-valued tensor (any integer or float dtype holding integers).
        levels: number of discrete levels ``K``.
        generator: random generator for the noise.
        dtype: floating dtype of the result (default: the default dtype).

    Raises:
        ValueError: if values fall outside ``0..levels-1``.

    Example:
        >>> import torch
        >>> x = uniform_dequantize(torch.tensor([0, 16]), 17)
        >>> bool((x >= 0).all() and (x < 1).all())
        True
    """
    dtype = dtype or torch.get_default_dtype()
    v = levels_data.to(dtype)
    if v.numel() and (float(v.min()) < 0 or float(v.max()) > levels - 1):
        raise ValueError(
            f"uniform_dequantize: expected values in 0..{levels - 1}, got values in "
            f"[{float(v.min()):g}, {float(v.max()):g}]"
        )
    u = torch.rand(v.shape, generator=generator, dtype=dtype, device=v.device)
    return (v + u) / levels


class VariationalDequantizer(nn.Module):
    r"""Learned dequantization noise :math:`q(u \mid v)` for images (variational dequantization, Flow++).

    Integer images :math:`v \in \{0..K-1\}^{C \times H \times W}` are mapped to
    :math:`x = (v + u)/K` with noise :math:`u \in (0, 1)^D` drawn from a conditional flow instead of
    the uniform distribution:

    .. math:: u = \sigma\big(g^{-1}(\varepsilon;\ v)\big), \quad \varepsilon \sim \mathcal N(0, I),
              \qquad \log q(u \mid v) = \log \mathcal N(\varepsilon) + \log|\det \partial \varepsilon / \partial u|,

    where :math:`g` (``self.transform``, data → latent like every transform of the library) is a
    logit, a squeeze and ``steps`` affine couplings with :class:`~flows.nn.ConvNet` conditioners that
    also see the image :math:`v` (interleaved with invertible 1×1 convolutions). Training the flow
    :math:`p` and the dequantizer jointly maximises the variational bound

    .. math:: \log P(v) \ge \mathbb E_{q}\big[\log p((v+u)/K) - \log q(u \mid v)\big] - D \log K,

    which is at least as tight as the uniform bound (:func:`uniform_dequantize` is :math:`q = 1`).
    Bits/dim: ``flows.metrics.bits_per_dim(log_p - log_q, D, K)``.

    Args:
        shape: the image shape ``(C, H, W)`` (``H`` and ``W`` even).
        levels: number of discrete levels ``K``.
        steps: number of affine couplings of the noise flow.
        hidden: hidden channels of the coupling networks, one entry per hidden layer.

    References:
        Ho, Chen, Srinivas, Duan, Abbeel (2019), "Flow++: Improving Flow-Based Generative Models
        with Variational Dequantization and Architecture Design", ICML, arXiv:1902.00275.

    Example:
        >>> import torch
        >>> deq = VariationalDequantizer((1, 4, 4), levels=17, steps=2, hidden=(8, 8))
        >>> v = torch.randint(0, 17, (3, 1, 4, 4))
        >>> x, log_q = deq(v)
        >>> bool(((x * 17 - v > 0) & (x * 17 - v < 1)).all()), log_q.shape
        (True, torch.Size([3]))
        >>> torch.allclose(deq.log_prob(v, x), log_q, atol=1e-4)
        True
    """

    def __init__(self, shape: Sequence[int], levels: int, *, steps: int = 4, hidden: Sequence[int] = (32, 32)) -> None:
        super().__init__()
        hidden = check_hidden("VariationalDequantizer", hidden, minimum_layers=1)
        shape = tuple(shape)
        if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape) or shape[1] % 2 or shape[2] % 2:
            raise ValueError(
                f"VariationalDequantizer: expected an image shape (C, H, W) with even H and W, got {shape}"
            )
        check_count("VariationalDequantizer", "levels", levels, minimum=2)
        check_count("VariationalDequantizer", "steps", steps)
        c, h, w = shape
        self.shape, self.levels = shape, levels
        channels = 4 * c
        layers = [Logit((c, None, None), check_domain=False), Squeeze(c)]
        for i in range(steps):
            mask = half_mask(channels, keep_first=i % 2 == 0)
            n_kept = int(mask.sum())
            net = ConvNet(n_kept, 2 * (channels - n_kept), tuple(hidden), context=channels)
            layers += [AffineCoupling((channels, None, None), channels, mask=mask, conditioner=net)]
            if i < steps - 1:
                layers.append(Invertible1x1Conv(channels))
        self.squeeze = Squeeze(c)
        self.transform = Chain(*layers)
        self.base = StandardNormal((channels, h // 2, w // 2))

    def _context(self, v: Tensor, dtype: torch.dtype) -> Tensor:
        """The conditioning image, scaled to ``[-0.5, 0.5]`` and squeezed like the noise."""
        check_event(v, self.shape, "VariationalDequantizer", "levels_data")
        return self.squeeze(v.to(dtype) / (self.levels - 1) - 0.5)

    def forward(self, levels_data: Tensor, *, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Dequantize ``v``: returns ``x = (v + u)/K`` and ``log q(u | v)`` (shape ``batch``), reparameterised."""
        anchor = next(self.parameters())
        context = self._context(levels_data, anchor.dtype)
        eps = torch.randn(context.shape, generator=generator, dtype=anchor.dtype, device=anchor.device)
        u, ladj = self.transform.inverse_and_log_det(eps, context)
        log_q = self.base.log_prob(eps) - ladj
        return (levels_data.to(u.dtype) + u) / self.levels, log_q

    def log_prob(self, levels_data: Tensor, x: Tensor) -> Tensor:
        """``log q(u | v)`` of the noise ``u = K x - v`` that gives ``x`` (shape ``batch``).

        Raises:
            ValueError: if ``u`` is not in ``(0, 1)``.
        """
        context = self._context(levels_data, x.dtype)
        u = x * self.levels - levels_data.to(x.dtype)
        if u.numel() and not bool(((u > 0) & (u < 1)).all()):
            raise ValueError("VariationalDequantizer: expected x in ((v + 0)/K, (v + 1)/K) for every entry")
        eps, ladj = self.transform.forward_and_log_det(u, context)
        return self.base.log_prob(eps) + ladj
