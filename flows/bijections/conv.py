r"""Glow's invertible 1×1 convolution: a learned channel-mixing matrix applied at every pixel.

References:
    Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS,
    arXiv:1807.03039.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from flows._validation import check_count
from flows.bijections.linear import LULinear

__all__ = ["Invertible1x1Conv"]


class Invertible1x1Conv(LULinear):
    r"""Invertible 1×1 convolution :math:`z_{:,h,w} = W x_{:,h,w}` on ``(C, H, W)`` images.

    The same :math:`C \times C` matrix mixes the channels of every pixel, so

    * forward: :math:`z_{:,h,w} = W x_{:,h,w}`, :math:`\log|\det J| = H W \log|\det W|`;
    * inverse: :math:`x_{:,h,w} = W^{-1} z_{:,h,w}`, :math:`\log|\det J^{-1}| = -H W \log|\det W|`.

    :math:`W` starts as a random rotation (the QR factor of a Gaussian matrix, :math:`\log|\det W| = 0`).
    Two parameterisations:

    * ``lu=False`` (dense, Glow's default): :math:`W` is a free matrix; :math:`\log|\det W|` comes
      from ``slogdet`` (:math:`O(C^3)`) and the inverse from a linear solve;
    * ``lu=True``: :math:`W = P L (U + \operatorname{diag}(s))` exactly as in
      :class:`~flows.bijections.linear.LULinear` (whose parameterisation this class inherits),
      :math:`\log|\det W| = \sum_i \log|s_i|` in :math:`O(C)`, inverse by triangular solves.

    Both start from the same matrix for the same random generator state. The matrix is applied as
    single matrix product over all pixels.

    Args:
        channels: number of channels ``C``.
        lu: use the LU parameterisation.
        generator: random generator for the rotation.

    References:
        Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions",
        NeurIPS, arXiv:1807.03039.

    Example:
        >>> import torch
        >>> conv = Invertible1x1Conv(4, lu=True)
        >>> x = torch.randn(2, 4, 3, 3)
        >>> z, ladj = conv.forward_and_log_det(x)
        >>> torch.allclose(conv.inverse(z), x, atol=1e-5), torch.allclose(ladj, torch.zeros(2), atol=1e-4)
        (True, True)
    """

    _spatial = 2  # one matrix, shared over the height and width axes

    def __init__(self, channels: int, *, lu: bool = False, generator: torch.Generator | None = None) -> None:
        check_count("Invertible1x1Conv", "channels", channels)
        super().__init__((channels, None, None), init="orthogonal", bias=False, generator=generator)
        self.lu = bool(lu)
        if not self.lu:
            with torch.no_grad():
                dense = super().weight().clone()
            del self.lower, self.upper, self.log_diag, self.permutation, self.sign
            self.dense = nn.Parameter(dense)

    def weight(self) -> Tensor:
        """The matrix ``W`` (``(C, C)``) from the current parameters."""
        return self.dense if not self.lu else super().weight()

    def log_abs_det(self) -> Tensor:
        """``log|det W|`` (a scalar): ``slogdet`` when dense, ``Σ log|s|`` with LU."""
        return torch.linalg.slogdet(self.dense).logabsdet if not self.lu else super().log_abs_det()

    def inverse_weight(self) -> Tensor:
        """The matrix ``W⁻¹`` (``(C, C)``): a linear solve when dense, two triangular solves with LU."""
        if not self.lu:
            return torch.linalg.inv(self.dense)
        lower, upper = self._factors()
        # W = P L U, so W⁻¹ = U⁻¹ L⁻¹ P⁻¹; P⁻¹ is the identity with its rows reordered.
        eye = torch.eye(len(self.permutation), dtype=lower.dtype, device=lower.device)
        y = eye.index_select(0, torch.argsort(self.permutation))
        y = torch.linalg.solve_triangular(lower, y, upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, y, upper=True)

    @staticmethod
    def _mix(matrix: Tensor, x: Tensor) -> Tensor:
        """``matrix`` applied to the channels of every pixel of ``x`` (``(*batch, C, H, W)``)."""
        flat = x.flatten(-2)  # not reshape(..., -1): an empty batch has no size to infer
        return torch.einsum("ij,...jk->...ik", matrix, flat).reshape(x.shape)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        pixels = math.prod(x.shape[-2:])
        return self._mix(self.weight(), x), (self.log_abs_det() * pixels).expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        pixels = math.prod(z.shape[-2:])
        return self._mix(self.inverse_weight(), z), (-self.log_abs_det() * pixels).expand(self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"channels={self.event_shape[0]}, lu={self.lu}"
