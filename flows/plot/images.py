"""Image sample grids."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from flows.plot._figure import new_figure, save_figure

__all__ = ["plot_image_grid"]


def plot_image_grid(
    images: Tensor,
    path: str | os.PathLike | None = None,
    *,
    image_shape: Sequence[int] | None = None,
    columns: int | None = None,
    value_range: tuple[float, float] = (0.0, 1.0),
    title: str | None = None,
) -> Any:
    """Show images in a grid (grey levels for one channel, RGB for three).

    Args:
        images: ``(N, H, W)``, ``(N, C, H, W)`` or flat ``(N, D)`` with ``image_shape`` given.
        path: where to save the picture.
        image_shape: ``(H, W)`` or ``(C, H, W)`` to reshape flat images.
        columns: images per row (default: a square grid).
        value_range: values mapped to white and black (values outside are clipped).
        title: figure title.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: for tensors that are not images.

    Example:
        >>> import torch
        >>> fig = plot_image_grid(torch.rand(6, 64), image_shape=(8, 8), columns=3)
        >>> len(fig.axes)
        6
    """
    if image_shape is not None:
        images = images.reshape(len(images), *image_shape)
    if images.dim() == 4 and images.shape[1] == 1:
        images = images[:, 0]
    if images.dim() == 4 and images.shape[1] == 3:
        images = images.permute(0, 2, 3, 1)
    if images.dim() not in (3, 4) or (images.dim() == 4 and images.shape[-1] != 3):
        raise ValueError(
            f"plot_image_grid: expected images (N, H, W) or (N, C, H, W) with C in (1, 3), got {tuple(images.shape)}"
        )
    low, high = value_range
    images = ((images.detach().cpu().double() - low) / (high - low)).clamp(0, 1)
    n = len(images)
    columns = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    figure = new_figure(1.1 * columns, 1.1 * rows + (0.3 if title else 0))
    for i, image in enumerate(images):
        ax = figure.add_subplot(rows, columns, i + 1)
        ax.imshow(image.numpy(), cmap="gray_r" if image.dim() == 2 else None, vmin=0, vmax=1)
        ax.axis("off")
    if title:
        figure.suptitle(title)
    save_figure(figure, path)
    return figure
