r"""Convolutional invertible residual blocks for images (i-ResNet / Residual Flows on ``(C, H, W)``).

:class:`ConvResidualBlock` is :class:`~flows.bijections.residual.ResidualBlock` with a branch of
:class:`SpectralConv2d` layers (stride 1, "same" padding) and LipSwish activations, acting on one
``(C, H, W)`` event. The spectral norm that is bounded is that of the **convolution operator** on
the ``H × W`` grid (not of the reshaped kernel): power iteration alternates the convolution and
its adjoint, the transposed convolution (Behrmann et al. 2019, §4; Gouk et al. 2021), so
:math:`\operatorname{Lip}(g) \le c^{L} < 1` holds exactly as for the vector block. The log-det is

* exact: the per-sample Jacobian carried through the branch as ``C·H·W`` tangent images (the
  convolutions of the basis vectors, scaled by the activation slopes), then ``slogdet``, in chunks
  of samples so that memory stays bounded: for small images (the default for ``C·H·W <= 16`` and
  always in evaluation mode, so ``log_prob`` is exact);
* the Russian-roulette estimate with the Neumann gradient while training (``C·H·W > 16`` or
  ``log_det="roulette"``), with the same structured evaluation as the vector block (transposed
  convolutions for the power terms, a forward tangent for the gradient).

The inverse is the fixed point of :math:`x \leftarrow z - g(x)` with implicit gradients.

References:
    Behrmann, Grathwohl, Chen, Duvenaud, Jacobsen (2019), "Invertible Residual Networks", ICML,
    arXiv:1811.00995. Chen, Behrmann, Duvenaud, Jacobsen (2019), "Residual Flows for Invertible
    Generative Modeling", NeurIPS, arXiv:1906.02735. Gouk, Frank, Pfahringer, Cree (2021),
    "Regularisation of neural networks by enforcing Lipschitz continuity", Machine Learning,
    arXiv:1804.04368 (power iteration on the convolution operator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection
from flows.bijections.residual import _LOG_DET_CHOICES, LipSwish, ResidualBlock, SpectralLinear

__all__ = ["ConvResidualBlock", "SpectralConv2d"]

_JACOBIAN_CHUNK = 1 << 24  # most entries of the tangent images held at once by the exact log-det


def _images(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """``x`` as a batch of ``(N, C, H, W)`` images, and its batch shape."""
    return x.reshape(-1, *x.shape[-3:]), x.shape[:-3]


class SpectralConv2d(SpectralLinear):
    r"""Convolution :math:`W' * x + b` (stride 1, "same" padding) with operator norm at most ``c``.

    :math:`W' = W \min(1, c/\hat\sigma)`, :math:`\hat\sigma = \langle u, W * v\rangle` by power
    iteration on the convolution operator of the ``(H, W)`` grid and its adjoint (the transposed
    convolution), warm-started from the buffers ``u`` (``(C_out, H, W)``) and ``v`` (``(C_in, H, W)``)
    exactly as :class:`~flows.bijections.residual.SpectralLinear`.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        size: the spatial size ``(H, W)`` the operator acts on.
        kernel_size: odd kernel size.
        coefficient: ``c``, the bound on the operator norm.
        max_iter: most power iterations per call in evaluation mode.
        train_iter: most power iterations per call in training mode.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        size: tuple[int, int],
        *,
        kernel_size: int = 3,
        coefficient: float = 0.97,
        max_iter: int = 200,
        train_iter: int = 10,
    ) -> None:
        nn.Module.__init__(self)
        conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.weight = nn.Parameter(conv.weight.detach().clone())
        self.context_weight = None
        self.bias = nn.Parameter(conv.bias.detach().clone())
        self.padding = kernel_size // 2
        self.coefficient = coefficient
        self.max_iter = max_iter
        self.train_iter = train_iter
        self.register_buffer("u", F.normalize(torch.randn(out_channels * size[0] * size[1]), dim=0).view(-1, *size))
        self.register_buffer("v", F.normalize(torch.randn(in_channels * size[0] * size[1]), dim=0).view(-1, *size))
        self._power_iteration(self.max_iter, store=True)

    def _operator(self, weight: Tensor, v: Tensor) -> Tensor:
        return F.conv2d(v.unsqueeze(0), weight, padding=self.padding).squeeze(0)

    def _adjoint(self, weight: Tensor, u: Tensor) -> Tensor:
        return F.conv_transpose2d(u.unsqueeze(0), weight, padding=self.padding).squeeze(0)

    def apply(self, x: Tensor, weight: Tensor, context: Tensor | None = None) -> Tensor:
        images, batch = _images(x)
        out = F.conv2d(images, weight, self.bias, padding=self.padding)
        return out.reshape(*batch, *out.shape[1:])

    def tangent(self, t: Tensor, weight: Tensor) -> Tensor:
        images, batch = _images(t)
        out = F.conv2d(images, weight, padding=self.padding)
        return out.reshape(*batch, *out.shape[1:])

    def transpose(self, u: Tensor, weight: Tensor) -> Tensor:
        images, batch = _images(u)
        out = F.conv_transpose2d(images, weight, padding=self.padding)
        return out.reshape(*batch, *out.shape[1:])

    def extra_repr(self) -> str:
        out, inp, k, _ = self.weight.shape
        return f"in={inp}, out={out}, kernel={k}, size={tuple(self.u.shape[1:])}, coefficient={self.coefficient}"


class ConvResidualBlock(ResidualBlock):
    r"""Invertible convolutional residual block :math:`z = x + g(x)` on images, :math:`\operatorname{Lip}(g) < 1`.

    :math:`g` is :class:`SpectralConv2d` → LipSwish → … → :class:`SpectralConv2d` through the
    ``hidden`` channel counts, with ``kernel_sizes`` (default: ``3`` first and last, ``1`` between,
    as the i-ResNet / Residual Flow image blocks). Forward, log-det and inverse as
    :class:`~flows.bijections.residual.ResidualBlock` (see the module docstring); no context.

    Args:
        shape: the concrete event shape ``(C, H, W)``.
        hidden: hidden channel counts of :math:`g` (at least one).
        kernel_sizes: one odd kernel size per convolution (``len(hidden) + 1``), or ``None``.
        coefficient: operator-norm bound of every convolution (in ``(0, 1)``).
        log_det: ``"auto"`` (exact for ``C·H·W <= 16``, else the estimator in training), ``"exact"``
            or ``"roulette"``.
        exact_terms: power-series terms always computed by the estimator.
        train_iter: most power iterations per call in training mode (the operator's top singular
            values cluster, so from a cold warm start convergence takes tens of iterations; in
            training the weights move little per step and the warm start stays close).
        max_iter: most power iterations per call in evaluation mode and after a dtype change.

    Raises:
        ValueError: for a shape that is not three positive ints, bad ``hidden`` or ``kernel_sizes``,
            a coefficient outside ``(0, 1)`` or an unknown ``log_det``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> t = ConvResidualBlock((1, 4, 4), hidden=(8,)).double()
        >>> x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x), ladj.shape
        (True, torch.Size([2]))
    """

    def __init__(
        self,
        shape: Sequence[int],
        *,
        hidden: Sequence[int] = (32,),
        kernel_sizes: Sequence[int] | None = None,
        coefficient: float = 0.97,
        log_det: str = "auto",
        exact_terms: int = 2,
        train_iter: int = 10,
        max_iter: int = 200,
    ) -> None:
        shape = tuple(shape) if isinstance(shape, Sequence) and not isinstance(shape, str) else shape
        if not isinstance(shape, tuple) or len(shape) != 3 or not all(_positive_int(s) for s in shape):
            raise ValueError(f"ConvResidualBlock: expected an image shape (C, H, W) of positive ints, got {shape!r}")
        hidden = _check_hidden(hidden)
        kernels = _check_kernels(kernel_sizes, len(hidden) + 1)
        if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or not 0 < coefficient < 1:
            raise ValueError(f"ConvResidualBlock: expected 0 < coefficient < 1 (a contraction), got {coefficient!r}")
        if log_det not in _LOG_DET_CHOICES:
            raise ValueError(f"ConvResidualBlock: expected log_det to be one of {_LOG_DET_CHOICES}, got {log_det!r}")
        Bijection.__init__(self, shape)
        channels, size = [shape[0], *hidden, shape[0]], shape[1:]
        self.layers = nn.ModuleList(
            SpectralConv2d(
                channels[i],
                channels[i + 1],
                size,
                kernel_size=kernels[i],
                coefficient=coefficient,
                train_iter=train_iter,
            )
            for i in range(len(channels) - 1)
        )
        self.activations = nn.ModuleList(LipSwish() for _ in hidden)
        self.context_features = 0
        self.log_det = log_det
        self.exact_terms = exact_terms

    def _branch_and_jacobian(self, x: Tensor, context: Tensor | None, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        r""":math:`g(x)` and the transposed per-sample Jacobian (``(*batch, D, D)``, row ``j`` = :math:`J e_j`).

        The ``D = C·H·W`` basis images are pushed through the branch as tangents (each convolution,
        then the activation slopes of the sample), in chunks of samples; ``det(I + Jᵀ) = det(I + J)``.
        """
        images, batch = _images(x)
        d = self._dimension
        rows = max(1, _JACOBIAN_CHUNK // (d * max(layer.weight.shape[0] for layer in self.layers) * d))
        outs, jacs = [], []
        for part in images.split(rows) if len(images) else [images]:
            h = part
            t = torch.eye(d, dtype=x.dtype, device=x.device).reshape(d, *self.event_shape)
            for i, (layer, w) in enumerate(zip(self.layers, weights, strict=True)):
                h, t = layer.apply(h, w), layer.tangent(t, w)  # t: (D, C', H, W), then (n, D, C', H, W)
                if i < len(self.activations):
                    h, slope = self.activations[i].value_and_derivative(h)
                    t = t * slope.unsqueeze(1)
            outs.append(h)
            jacs.append(t.expand(len(part), *t.shape[-4:]).reshape(len(part), d, d))
        return torch.cat(outs).reshape(*batch, *self.event_shape), torch.cat(jacs).reshape(*batch, d, d)

    def extra_repr(self) -> str:
        lip = math.prod(layer.coefficient for layer in self.layers)
        return f"shape={tuple(self.event_shape)}, log_det={self.log_det!r}, lipschitz<={lip:.3g}"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_hidden(hidden: object) -> tuple[int, ...]:
    if (
        isinstance(hidden, (str, bytes))
        or not isinstance(hidden, Sequence)
        or not hidden
        or not all(_positive_int(h) for h in hidden)
    ):
        raise ValueError(
            "ConvResidualBlock: expected hidden to be a non-empty sequence of positive int channel counts, "
            f"got {hidden!r}"
        )
    return tuple(hidden)


def _check_kernels(kernel_sizes: object, count: int) -> tuple[int, ...]:
    if kernel_sizes is None:
        return (3, *([1] * (count - 2)), 3)
    if (
        isinstance(kernel_sizes, (str, bytes))
        or not isinstance(kernel_sizes, Sequence)
        or len(kernel_sizes) != count
        or not all(_positive_int(k) and k % 2 == 1 for k in kernel_sizes)
    ):
        raise ValueError(
            f"ConvResidualBlock: expected kernel_sizes to be {count} odd positive ints (one per convolution), "
            f"got {kernel_sizes!r}"
        )
    return tuple(kernel_sizes)
