r"""One transform shared by equal blocks of a vector: the flow of a target that factorises into identical factors."""

from __future__ import annotations

from torch import Tensor

from flows._validation import check_context_like, check_count
from flows.bijections.base import Bijection

__all__ = ["SharedBlocks"]


class SharedBlocks(Bijection):
    r"""Apply one transform to each of ``blocks`` consecutive equal blocks of a vector, with shared parameters.

    An event :math:`x \in \mathbb R^{k m}` is viewed as ``k`` blocks
    :math:`x_{(j)} = (x_{jm}, \dots, x_{jm+m-1})` and mapped blockwise,

    .. math:: z_{(j)} = f(x_{(j)}), \qquad \log|\det J| = \sum_{j=0}^{k-1} \log|\det J_f(x_{(j)})|,

    inverse :math:`x_{(j)} = f^{-1}(z_{(j)})`. The Jacobian is block diagonal, so the layer is a
    bijection whenever ``f`` is. With a standard normal base this is the exact model class of a
    target that factorises into ``k`` identical ``m``-dimensional factors, such as the many-well
    (``k = d/2`` double wells on coordinate pairs): each factor is learnt once, from ``k`` times as
    many samples per batch.

    Args:
        transform: the shared transform, with vector event shape ``(m,)``.
        blocks: the number ``k`` of blocks.

    Raises:
        ValueError: for a transform whose event is not a vector (of the same size on both sides).

    Example:
        >>> import torch
        >>> from flows import Affine
        >>> t = SharedBlocks(Affine(2, shift=torch.tensor([1.0, 0.0])), blocks=3)
        >>> t(torch.zeros(1, 6)).tolist()
        [[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]]
    """

    def __init__(self, transform: Bijection, *, blocks: int) -> None:
        if not isinstance(transform, Bijection):
            raise TypeError(f"SharedBlocks: expected a Bijection, got {type(transform).__name__}")
        shape_in, shape_out = transform.event_shape, transform.event_shape_out
        if len(shape_in) != 1 or shape_in != shape_out or shape_in[0] is None:
            raise ValueError(
                f"SharedBlocks: expected a transform of vector events (m,) -> (m,), got {shape_in} -> {shape_out}"
            )
        check_count("SharedBlocks", "blocks", blocks)
        self.block_size = shape_in[0]
        super().__init__(blocks * self.block_size)
        self.transform, self.blocks = transform, blocks

    def _run(self, x: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        blocks = x.unflatten(-1, (self.blocks, self.block_size))
        if context is not None:
            # a vector context (its width is the inner transform's to check) whose batch fits x's
            check_context_like(context, x, 1, "SharedBlocks", context.shape[-1] if context.dim() else 1)
            context = context.unsqueeze(-2).expand(*blocks.shape[:-1], context.shape[-1])
        run = self.transform.inverse_and_log_det if inverse else self.transform.forward_and_log_det
        y, ladj = run(blocks, context)
        return y.flatten(-2), ladj.sum(-1)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(x, context, inverse=False)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._run(z, context, inverse=True)

    def extra_repr(self) -> str:
        return f"blocks={self.blocks}, block_size={self.block_size}"
