r"""Images to token sequences: :class:`Patchify`, ``(C, H, W) ↔ (T, C·p²)`` with ``T = (H/p)(W/p)``.

The image is cut into non-overlapping ``p × p`` patches in raster order (row of patches, then
column); a token holds its patch's entries channel-major, then row, then column (the order of
:func:`torch.nn.functional.unfold`, as in TarFlow). A permutation of coordinates: log-det 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from flows._validation import check_count
from flows.bijections.base import Bijection

__all__ = ["Patchify"]


class Patchify(Bijection):
    """Cut ``(C, H, W)`` images into ``T = (H/p)·(W/p)`` tokens of ``C·p²`` features (log-det 0).

    Token ``i·(W/p) + j`` is the patch at patch-row ``i`` and patch-column ``j``; within it the
    entries are ordered channel, row, column. The inverse puts the patches back.

    Args:
        event_shape: the image shape ``(C, H, W)``.
        patch: the patch side ``p`` (divides ``H`` and ``W``).

    Raises:
        ValueError: for a shape that is not a concrete ``(C, H, W)`` or a patch that does not divide it.

    References:
        Dosovitskiy et al. (2021), "An Image is Worth 16x16 Words", ICLR, arXiv:2010.11929.
        Zhai et al. (2024), "Normalizing Flows are Capable Generative Models", arXiv:2412.06329.

    Example:
        >>> import torch
        >>> t = Patchify((1, 4, 6), 2)
        >>> x = torch.randn(5, 1, 4, 6)
        >>> t(x).shape, torch.equal(t.inverse(t(x)), x)
        (torch.Size([5, 6, 4]), True)
    """

    def __init__(self, event_shape: Sequence[int], patch: int) -> None:
        shape = tuple(event_shape)
        if len(shape) != 3 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
            raise ValueError(f"Patchify: expected a concrete image shape (C, H, W) of positive ints, got {shape}")
        check_count("Patchify", "patch", patch)
        c, h, w = shape
        if h % patch or w % patch:
            raise ValueError(f"Patchify: expected a patch that divides H and W, got patch {patch} for {h}x{w} images")
        self.patch = patch
        super().__init__(shape, ((h // patch) * (w // patch), c * patch * patch))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = self.batch_shape(x)
        c, h, w = self.event_shape
        p = self.patch
        tokens = x.reshape(*batch, c, h // p, p, w // p, p)
        n = len(batch)
        # (c, i, r, j, s) -> (i, j, c, r, s): patch position first, then channel, row, column
        tokens = tokens.permute(*range(n), n + 1, n + 3, n, n + 2, n + 4)
        return tokens.reshape(*batch, *self.event_shape_out), x.new_zeros(batch)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = z.shape[:-2]
        c, h, w = self.event_shape
        p = self.patch
        n = len(batch)
        x = z.reshape(*batch, h // p, w // p, c, p, p).permute(*range(n), n + 2, n, n + 3, n + 1, n + 4)
        return x.reshape(*batch, c, h, w), z.new_zeros(batch)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, patch={self.patch}"
