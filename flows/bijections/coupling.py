r"""Coupling layers: a binary mask splits the event, one part conditions an elementwise map of the other.

With a mask :math:`b` (``True`` = kept), the forward map is

.. math:: z_b = x_b, \qquad z_{\bar b} = \tau(x_{\bar b};\ \theta(x_b, c)),

so :math:`\log|\det J| = \sum_{i \in \bar b} \log \tau'(x_i; \theta_i)`, and the inverse needs one
conditioner pass. The mask acts on the first event axis: features of a vector, channels of a
``(C, H, W)`` image. The conditioner :math:`\theta` is any network mapping the kept part
``(*batch, n_kept, *rest)`` (and the context) to ``(*batch, n_transformed · P, *rest)`` raw
parameters, ``P = transformer.params_per_dim``.

References:
    Dinh, Krueger, Bengio (2015), "NICE: Non-linear Independent Components Estimation",
    arXiv:1410.8516. Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP",
    ICLR, arXiv:1605.08803.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows.bijections.base import Bijection, sum_event_dims
from flows.bijections.transformers import AdditiveTransformer, AffineTransformer, Transformer
from flows.nn import MLP

__all__ = ["AdditiveCoupling", "AffineCoupling", "Coupling", "alternating_mask", "half_mask"]


def alternating_mask(n: int, *, keep_even: bool = True) -> Tensor:
    """Mask of length ``n`` keeping the even-indexed entries (or the odd-indexed ones).

    Example:
        >>> alternating_mask(4).tolist(), alternating_mask(4, keep_even=False).tolist()
        ([True, False, True, False], [False, True, False, True])
    """
    even = torch.arange(n) % 2 == 0
    return even if keep_even else ~even


def half_mask(n: int, *, keep_first: bool = True) -> Tensor:
    """Mask of length ``n`` keeping the first ``n // 2`` entries (or the last ``n - n // 2``).

    Example:
        >>> half_mask(5).tolist(), half_mask(5, keep_first=False).tolist()
        ([True, True, False, False, False], [False, False, True, True, True])
    """
    mask = torch.zeros(n, dtype=torch.bool)
    if keep_first:
        mask[: n // 2] = True
    else:
        mask[n // 2 :] = True
    return mask


class Coupling(Bijection):
    r"""Generic coupling layer: ``mask`` (``True`` = kept) × ``transformer`` × ``conditioner``.

    Args:
        event_shape: shape of one event; the mask acts on its first axis.
        context: width of the context (0 for an unconditional layer); used by the default conditioner.
        transformer: the elementwise map applied to the masked-out part.
        mask: boolean tensor of length ``event_shape[0]``, ``True`` where the entry is kept and
            conditions the rest. Must have at least one ``True`` and one ``False``.
            Defaults to :func:`half_mask`.
        conditioner: network mapping ``(x_kept, context)`` to raw parameters of shape
            ``(*batch, P * n_transformed, *event_shape[1:])``, laid out as ``(P, n_transformed)``:
            the first ``n_transformed`` outputs are every entry's first parameter, and so on.
            Defaults to an :class:`~flows.nn.MLP` for vector events.
        hidden: hidden widths of the default conditioner.
        activation: nonlinearity of the default conditioner.

    Raises:
        ValueError: for a mask of the wrong length or a mask that keeps everything or nothing.

    Example:
        >>> import torch
        >>> from flows.bijections.transformers import AffineTransformer
        >>> t = Coupling(4, transformer=AffineTransformer(), hidden=(16,))
        >>> z, ladj = t.forward_and_log_det(torch.randn(3, 4))
        >>> z.shape, ladj.shape
        (torch.Size([3, 4]), torch.Size([3]))
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        context: int = 0,
        *,
        transformer: Transformer,
        mask: Tensor | Sequence[bool] | None = None,
        conditioner: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__(event_shape)
        n = self.event_shape[0]
        name = type(self).__name__
        mask = half_mask(n) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        if mask.shape != (n,):
            raise ValueError(f"{name}: expected a mask of shape ({n},), got {tuple(mask.shape)}")
        if bool(mask.all()) or not bool(mask.any()):
            raise ValueError(f"{name}: the mask must keep some entries and transform others, got {mask.tolist()}")
        self.transformer = transformer
        self.context_features = context
        self.register_buffer("mask", mask)
        self.register_buffer("kept", mask.nonzero().squeeze(-1))
        self.register_buffer("transformed", (~mask).nonzero().squeeze(-1))
        self.register_buffer("_merge_order", torch.argsort(torch.cat((self.kept, self.transformed))), persistent=False)
        n_kept, n_trans = len(self.kept), len(self.transformed)
        # The usual masks (halves, alternating entries) are split with views instead of gathers.
        alternate = torch.arange(n) % 2 == 0
        if bool(mask[:n_kept].all()):
            self._layout = "first"
        elif bool(mask[n_trans:].all()):
            self._layout = "last"
        elif n % 2 == 0 and torch.equal(mask, alternate):
            self._layout = "even"
        elif n % 2 == 0 and torch.equal(mask, ~alternate):
            self._layout = "odd"
        else:
            self._layout = "gather"
        if conditioner is None:
            if len(self.event_shape) != 1:
                raise ValueError(
                    f"{name}: no default conditioner for event shape {tuple(self.event_shape)}; pass conditioner=..."
                )
            conditioner = MLP(
                n_kept, n_trans * transformer.params_per_dim, hidden, context=context, activation=activation
            )
        self.conditioner = conditioner

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        axis = x.dim() - len(self.event_shape)
        n_kept, layout = len(self.kept), self._layout
        if layout == "first":  # torch.split: views, and one cat in the backward pass
            kept, trans = x.split((n_kept, x.shape[axis] - n_kept), dim=axis)
            return kept, trans
        if layout == "last":
            trans, kept = x.split((x.shape[axis] - n_kept, n_kept), dim=axis)
            return kept, trans
        if layout in ("even", "odd"):
            pairs = x.unflatten(axis, (n_kept, 2))
            first, second = pairs.select(axis + 1, 0), pairs.select(axis + 1, 1)
            return (first, second) if layout == "even" else (second, first)
        return x.index_select(axis, self.kept), x.index_select(axis, self.transformed)

    def _merge(self, kept: Tensor, transformed: Tensor) -> Tensor:
        axis = kept.dim() - len(self.event_shape)
        layout = self._layout
        if layout == "first":
            return torch.cat((kept, transformed), dim=axis)
        if layout == "last":
            return torch.cat((transformed, kept), dim=axis)
        if layout in ("even", "odd"):
            pair = (kept, transformed) if layout == "even" else (transformed, kept)
            return torch.stack(pair, dim=axis + 1).flatten(axis, axis + 1)
        out = torch.cat((kept, transformed), dim=axis)
        return out.index_select(axis, self._merge_order)

    def _raw_params(self, kept: Tensor, context: Tensor | None) -> Tensor:
        """The conditioner's output, ``(*batch, P * n_transformed, *event_shape[1:])``."""
        return self.conditioner(kept, context) if self.context_features else self.conditioner(kept)

    def _params(self, kept: Tensor, context: Tensor | None) -> Tensor:
        params = self._raw_params(kept, context)
        axis = kept.dim() - len(self.event_shape)
        # Chunked layout (P, n): each parameter kind is a contiguous block of the conditioner output,
        # so elementwise transformer arithmetic runs on dense slices instead of stride-P views.
        params = params.unflatten(axis, (self.transformer.params_per_dim, len(self.transformed)))
        return params.movedim(axis, -1)

    def _transform(self, trans: Tensor, kept: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        r""":math:`\tau` (or :math:`\tau^{-1}`) of the transformed part given the kept part, and its log-derivative."""
        params = self._params(kept, context)
        if inverse:
            return self.transformer.inverse_and_log_det(trans, params)
        return self.transformer.forward_and_log_det(trans, params)

    def _couple(self, x: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        kept, trans = self._split(x)
        trans, ladj = self._transform(trans, kept, context, inverse)
        return self._merge(kept, trans), sum_event_dims(ladj, len(self.event_shape), self.batch_shape(x))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._couple(x, context, inverse=False)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._couple(z, context, inverse=True)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mask={self.mask.int().tolist()}, context={self.context_features}"


class AffineCoupling(Coupling):
    r"""RealNVP affine coupling: :math:`z_{\bar b} = x_{\bar b} \odot e^{s(x_b, c)} + t(x_b, c)`.

    The log-scale is soft-clamped, :math:`s = \text{clamp}\cdot\tanh(\hat s/\text{clamp})`, and the
    conditioner's last layer is zero-initialised (identity at initialisation).
    :math:`\log|\det J| = \sum_{i\in\bar b} s_i`.

    Args:
        event_shape: shape of one event (the mask acts on its first axis).
        context: context width (0 for none).
        mask: ``True`` = kept; defaults to keeping the first half.
        clamp: bound on the absolute log-scale.
        conditioner, hidden, activation: see :class:`Coupling`.

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803.

    Example:
        >>> import torch
        >>> t = AffineCoupling(4, context=2, hidden=(16,))
        >>> x, c = torch.randn(3, 4), torch.randn(3, 2)
        >>> torch.allclose(t.inverse(t(x, context=c), context=c), x)
        True
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        context: int = 0,
        *,
        mask: Tensor | Sequence[bool] | None = None,
        clamp: float | None = 3.0,
        conditioner: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__(
            event_shape,
            context,
            transformer=AffineTransformer(clamp),
            mask=mask,
            conditioner=conditioner,
            hidden=hidden,
            activation=activation,
        )

    # The same map as the generic Coupling path (AffineTransformer._affine), with the conditioner output
    # split into its shift and log-scale blocks directly (the (P, n) layout makes them contiguous along
    # the mask axis) instead of viewing it as (..., n, P) and unbinding: fewer autograd nodes and no
    # stacking copy in the backward pass (measurements: docs/guide/concepts.md).
    def _shift_log_scale(self, kept: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        params = self._raw_params(kept, context)
        axis = kept.dim() - len(self.event_shape)
        n = len(self.transformed)
        if params.shape[axis] != 2 * n:
            raise ValueError(
                f"{type(self).__name__}: expected the conditioner to return {2 * n} values (shift and "
                f"log-scale of {n} entries) along axis {axis}, got shape {tuple(params.shape)}"
            )
        shift, raw = params.split(n, dim=axis)
        return shift, self.transformer.log_scale(raw)

    def _transform(self, trans: Tensor, kept: Tensor, context: Tensor | None, inverse: bool) -> tuple[Tensor, Tensor]:
        shift, log_scale = self._shift_log_scale(kept, context)
        return self.transformer._affine(trans, shift, log_scale, inverse=inverse)


class AdditiveCoupling(Coupling):
    r"""NICE additive coupling: :math:`z_{\bar b} = x_{\bar b} + t(x_b, c)`, volume preserving (log-det 0).

    Args:
        event_shape: shape of one event (the mask acts on its first axis).
        context: context width (0 for none).
        mask: ``True`` = kept; defaults to keeping the first half.
        conditioner, hidden, activation: see :class:`Coupling`.

    References:
        Dinh, Krueger, Bengio (2015), "NICE: Non-linear Independent Components Estimation",
        arXiv:1410.8516.

    Example:
        >>> import torch
        >>> t = AdditiveCoupling(4, hidden=(16,))
        >>> t.forward_and_log_det(torch.randn(3, 4))[1].tolist()
        [0.0, 0.0, 0.0]
    """

    def __init__(
        self,
        event_shape: int | Sequence[int],
        context: int = 0,
        *,
        mask: Tensor | Sequence[bool] | None = None,
        conditioner: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__(
            event_shape,
            context,
            transformer=AdditiveTransformer(),
            mask=mask,
            conditioner=conditioner,
            hidden=hidden,
            activation=activation,
        )
