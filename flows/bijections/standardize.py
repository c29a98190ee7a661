r"""Fixed standardisation :math:`z = (x - \mu)/\sigma` as a transform, so that densities stay in data units.

Fitting a flow to standardised data and forgetting the standardisation reports densities of the
*standardised* variable: off by :math:`\sum_i \log \sigma_i` nats. Putting the map inside the flow
(first layer of the chain, data side) makes ``log_prob`` of raw data correct, log-determinant
included, and saves the statistics with the model (they are buffers, not parameters: training
never changes them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flows._validation import check_event
from flows.bijections.base import Bijection

__all__ = ["Standardize"]


class Standardize(Bijection):
    r"""Fixed elementwise standardisation with statistics stored as buffers.

    * forward: :math:`z = (x - \mu) / \sigma`, :math:`\log|\det J| = -\sum_i \log\sigma_i`;
    * inverse: :math:`x = \mu + \sigma z`, :math:`\log|\det J^{-1}| = \sum_i \log\sigma_i`.

    :math:`\mu` and :math:`\sigma` have the event shape and are buffers: they move with
    ``.to()``, are saved in ``state_dict()`` and are never trained. :meth:`fit` sets them from data.

    References:
        Papamakarios, Pavlakou, Murray (2017), "Masked Autoregressive Flow for Density Estimation",
        NeurIPS, arXiv:1705.07057 (data preprocessing, Appendix D).

    Args:
        event_shape: shape of one event.
        loc: :math:`\mu`, broadcastable to ``event_shape`` (default 0).
        scale: :math:`\sigma > 0`, broadcastable to ``event_shape`` (default 1).

    Raises:
        ValueError: for a non-positive or non-finite scale, or a non-finite location.

    Example:
        >>> import torch
        >>> x = torch.tensor([[1.0, 10.0], [3.0, 30.0]])
        >>> t = Standardize.fit(x)
        >>> t(x)
        tensor([[-1., -1.],
                [ 1.,  1.]])
        >>> round(t.forward_and_log_det(x)[1][0].item(), 4)  # -log 1 - log 10
        -2.3026
    """

    def __init__(
        self, event_shape: int | Sequence[int], *, loc: float | Tensor = 0.0, scale: float | Tensor = 1.0
    ) -> None:
        super().__init__(event_shape)
        if any(s is None for s in self.event_shape):
            raise ValueError(f"Standardize: expected a fully specified event shape, got {self.event_shape}")
        dtype = torch.get_default_dtype()
        loc = torch.as_tensor(loc, dtype=dtype).expand(self.event_shape).clone()
        scale = torch.as_tensor(scale, dtype=dtype).expand(self.event_shape).clone()
        if not bool(torch.isfinite(loc).all()):
            raise ValueError("Standardize: expected a finite loc, got NaN/Inf values")
        if not bool((scale > 0).all()) or not bool(torch.isfinite(scale).all()):
            raise ValueError(
                f"Standardize: expected a positive finite scale, got values in [{scale.min()}, {scale.max()}]"
            )
        self.register_buffer("loc", loc)
        self.register_buffer("scale", scale)

    @classmethod
    def fit(cls, data: Tensor, *, eps: float = 1e-8) -> Standardize:
        """Statistics from ``data`` of shape ``(N, *event_shape)``: mean and (population) standard deviation per entry.

        Entries whose standard deviation is below ``eps`` (constant features) get scale 1 and are
        only centred.

        Raises:
            ValueError: for fewer than two samples or non-finite data.
        """
        if not isinstance(data, Tensor) or data.dim() < 1 or data.shape[0] < 2:
            raise ValueError(f"Standardize.fit: expected a tensor (N, *event_shape) with N >= 2, got {data!r:.80}")
        if not bool(torch.isfinite(data).all()):
            raise ValueError("Standardize.fit: expected finite data, got NaN/Inf values")
        data = data.to(torch.float64)
        std = data.std(0, correction=0)
        std = torch.where(std > eps, std, torch.ones_like(std))
        dtype = torch.get_default_dtype()
        return cls(tuple(data.shape[1:]), loc=data.mean(0).to(dtype), scale=std.to(dtype))

    def _ladj(self, x: Tensor) -> Tensor:
        return self.scale.log().sum().expand(self.batch_shape(x))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(x, self.event_shape, type(self).__name__)
        return (x - self.loc) / self.scale, -self._ladj(x)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_event(z, self.event_shape, type(self).__name__, "latent input")
        return self.loc + self.scale * z, self._ladj(z)
