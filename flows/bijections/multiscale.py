r"""Multi-scale building blocks for image flows: :class:`Squeeze`, :class:`Split` and :class:`Flatten`.

The multi-scale architecture of RealNVP and Glow repeats, at each level, *squeeze → K flow steps →
split*: the squeeze trades space for channels, and the split factors half of the channels out to
the latent, so that the other half is transformed further at a coarser scale. In this library a
:class:`Split` holds the transform of the coarser levels, so the whole architecture is one
:class:`~flows.bijections.base.Bijection` from the image to a flat latent vector. Glow's learned
conditional prior of the factored-out half given the kept half is an affine coupling placed just
before the split (see :class:`~flows.architectures.glow.Glow`).

References:
    Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
    arXiv:1605.08803 (Section 3.6, multi-scale architecture). Kingma, Dhariwal (2018), "Glow:
    Generative Flow with Invertible 1x1 Convolutions", NeurIPS, arXiv:1807.03039.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_count, format_shape, shapes_match
from flows.bijections.base import Bijection

__all__ = ["Flatten", "Split", "Squeeze"]


def _concrete_image_shape(shape: Sequence[int], who: str) -> tuple[int, int, int]:
    shape = tuple(shape)
    if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"{who}: expected a concrete image shape (C, H, W) of positive ints, got {shape}")
    return shape


class Squeeze(Bijection):
    r"""Space-to-depth: ``(C, H, W) → (C·f², H/f, W/f)``, a volume-preserving reshuffle (log-det 0).

    Each ``f×f`` block of pixels becomes ``f²`` channels at one pixel:
    :math:`z_{c f^2 + i f + j,\ h,\ w} = x_{c,\ h f + i,\ w f + j}`. The inverse (depth-to-space)
    puts them back. Height and width must be divisible by ``f``.

    Args:
        channels: number of input channels ``C``.
        factor: block size ``f``.

    Raises:
        ValueError: for an input whose height or width is not divisible by ``factor``.

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803 (the squeezing operation).

    Example:
        >>> import torch
        >>> t = Squeeze(1)
        >>> x = torch.arange(16.0).reshape(1, 1, 4, 4)
        >>> t(x).shape, t(x)[0, :, 0, 0].tolist()
        (torch.Size([1, 4, 2, 2]), [0.0, 1.0, 4.0, 5.0])
        >>> torch.equal(t.inverse(t(x)), x)
        True
    """

    def __init__(self, channels: int, *, factor: int = 2) -> None:
        check_count("Squeeze", "channels", channels)
        check_count("Squeeze", "factor", factor)
        super().__init__((channels, None, None), (channels * factor * factor, None, None))
        self.factor = factor

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        f = self.factor
        *batch, c, h, w = x.shape
        if h % f or w % f:
            raise ValueError(f"Squeeze: expected height and width divisible by {f}, got {h}×{w}")
        n = len(batch)
        z = x.reshape(*batch, c, h // f, f, w // f, f)
        z = z.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
        return z.reshape(*batch, c * f * f, h // f, w // f), x.new_zeros(batch)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        f = self.factor
        *batch, cf, h, w = z.shape
        n, c = len(batch), cf // (f * f)
        x = z.reshape(*batch, c, f, f, h, w)
        x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
        return x.reshape(*batch, c, h * f, w * f), z.new_zeros(batch)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, factor={self.factor}"


class Flatten(Bijection):
    """Reshape events of a fixed shape (e.g. ``(C, H, W)``) to vectors of ``C·H·W`` entries (log-det 0).

    Args:
        event_shape: the concrete input event shape.

    Example:
        >>> import torch
        >>> t = Flatten((2, 3, 3))
        >>> t(torch.randn(5, 2, 3, 3)).shape, t.inverse(torch.randn(18)).shape
        (torch.Size([5, 18]), torch.Size([2, 3, 3]))
    """

    def __init__(self, event_shape: Sequence[int]) -> None:
        shape = tuple(event_shape)
        if not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError(f"Flatten: expected a concrete event shape of positive ints, got {shape}")
        super().__init__(shape, (math.prod(shape),))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = self.batch_shape(x)
        return x.flatten(len(batch)), x.new_zeros(batch)  # flatten, not reshape(-1): empty batches

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = z.shape[:-1]
        return z.reshape(*batch, *self.event_shape), z.new_zeros(batch)


class Split(Bijection):
    r"""Multi-scale factor-out: the first ``keep`` channels go on through ``transform``, the rest go to the latent.

    For an image :math:`x = (x_k, x_o)` split along the channels (kept first),

    .. math:: z = \big(\operatorname{vec}(x_o),\ \operatorname{vec}(T(x_k))\big), \qquad
              \log|\det J| = \log|\det J_T(x_k)|,

    where :math:`T` (``transform``) is the rest of the flow at the coarser scales. The output is a
    flat vector of ``C·H·W`` entries: factored-out channels first, then the flattened output of
    ``transform``. Nesting ``Split`` inside ``transform`` gives the multi-scale cascade. The inverse
    splits the vector, inverts ``transform`` and concatenates the channels again.

    Args:
        event_shape: the concrete input shape ``(C, H, W)``.
        transform: maps ``(keep, H, W)`` events to events of a fixed shape with ``keep·H·W`` entries
            (end it with :class:`Flatten`, or with another ``Split``).
        keep: channels kept for ``transform`` (default ``C // 2``).

    Raises:
        ValueError: if ``keep`` is not in ``1..C-1`` or ``transform`` does not fit ``(keep, H, W)``.

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803 (Section 3.6).

    Example:
        >>> import torch
        >>> from flows import ActNorm2d, Chain
        >>> t = Split((4, 2, 2), Chain(ActNorm2d(2), Flatten((2, 2, 2))))
        >>> z, ladj = t.forward_and_log_det(torch.randn(3, 4, 2, 2))
        >>> z.shape, ladj.shape
        (torch.Size([3, 16]), torch.Size([3]))
    """

    def __init__(self, event_shape: Sequence[int], transform: Bijection, *, keep: int | None = None) -> None:
        c, h, w = _concrete_image_shape(event_shape, "Split")
        keep = c // 2 if keep is None else keep
        if not isinstance(keep, int) or not 1 <= keep < c:
            raise ValueError(f"Split: expected keep in 1..{c - 1} (channels kept of {c}), got {keep!r}")
        if not isinstance(transform, Bijection):
            raise TypeError(f"Split: expected a Bijection as transform, got {type(transform).__name__}")
        if not shapes_match(transform.event_shape, (keep, h, w)):
            raise ValueError(
                f"Split: the transform expects events of shape {format_shape(transform.event_shape)}, "
                f"but the kept part has shape {format_shape((keep, h, w))}"
            )
        inner_shape = tuple(transform.event_shape_out)
        if any(s is None for s in inner_shape) or math.prod(inner_shape) != keep * h * w:
            raise ValueError(
                f"Split: expected the transform to output a fixed shape with {keep * h * w} entries "
                f"(end it with Flatten or another Split), got {format_shape(inner_shape)}"
            )
        super().__init__((c, h, w), (c * h * w,))
        self.keep = keep
        self.transform = transform
        self._inner_shape = inner_shape
        self._n_out = (c - keep) * h * w

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = self.batch_shape(x)
        kept, out = x[..., : self.keep, :, :], x[..., self.keep :, :, :]
        inner, ladj = self.transform.forward_and_log_det(kept, context)
        z = torch.cat((out.flatten(len(batch)), inner.flatten(len(batch))), dim=-1)
        return z, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = z.shape[:-1]
        c, h, w = self.event_shape
        out = z[..., : self._n_out].reshape(*batch, c - self.keep, h, w)
        inner = z[..., self._n_out :].reshape(*batch, *self._inner_shape)
        kept, ladj = self.transform.inverse_and_log_det(inner, context)
        return torch.cat((kept, out), dim=-3), ladj

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, keep={self.keep}"
