r"""Elementwise monotone maps ("transformers") driven by raw parameters from a conditioner.

A transformer maps each scalar :math:`x_i` to :math:`z_i = \tau(x_i; \theta_i)` with a strictly
increasing :math:`\tau`, given unconstrained raw parameters :math:`\theta_i`. It knows nothing of
where :math:`\theta` comes from: a coupling mask, a MADE, or free parameters
(:class:`~flows.bijections.elementwise.Elementwise`). This is the transformer × conditioner split of
Papamakarios et al. (2021), "Normalizing Flows for Probabilistic Modeling and Inference", JMLR,
arXiv:1912.02762.

Shape contract: ``x`` has any shape ``S``; ``params`` has shape ``(*S, params_per_dim)``; both
methods return ``(y, ladj)`` where ``ladj`` has shape ``S`` (elementwise, **not** summed): the
caller sums over its event dimensions. Raw parameters equal to :meth:`identity_params` give the
identity map, so a conditioner whose last layer is zero-initialised starts at the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flows._validation import check_number

__all__ = ["MAX_CLAMP", "AdditiveTransformer", "AffineTransformer", "Transformer"]

MAX_CLAMP = 1e3
"""The largest log-scale bound of :class:`AffineTransformer` (``None`` is no bound)."""


class Transformer(nn.Module):
    """Base class of elementwise monotone maps ``z = τ(x; θ)`` with elementwise log-derivatives."""

    params_per_dim: int = 0

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(τ(x; θ), log τ'(x; θ))``, both of the shape of ``x``."""
        raise NotImplementedError

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(τ⁻¹(z; θ), log (τ⁻¹)'(z; θ))``, both of the shape of ``z``."""
        raise NotImplementedError

    def identity_params(self) -> Tensor:
        """Raw parameters (shape ``(params_per_dim,)``) for which the map is the identity."""
        return torch.zeros(self.params_per_dim)


class AffineTransformer(Transformer):
    r"""Affine map :math:`z = x\,e^{s} + t` with a soft-clamped log-scale.

    Raw parameters ``(t, ŝ)`` (last axis, in this order); the log-scale is
    :math:`s = c \tanh(\hat s / c)` with ``c = clamp`` so that :math:`|s| < c` and the map stays
    well conditioned (Dinh et al. 2017 use a tanh-scaled log-scale for the same reason);
    ``clamp=None`` uses :math:`s = \hat s`.

    * forward: :math:`z = x e^{s} + t`, :math:`\log|dz/dx| = s`;
    * inverse: :math:`x = (z - t) e^{-s}`, :math:`\log|dx/dz| = -s`.

    References:
        Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP", ICLR,
        arXiv:1605.08803.

    Args:
        clamp: bound on the absolute log-scale, a number in ``(0, MAX_CLAMP]`` (``1e3``; ``None``
            for no bound).

    Example:
        >>> import torch
        >>> tau = AffineTransformer()
        >>> x, params = torch.randn(4, 3), torch.randn(4, 3, 2)
        >>> z, ladj = tau.forward_and_log_det(x, params)
        >>> torch.allclose(tau.inverse_and_log_det(z, params)[0], x, atol=1e-6)
        True
    """

    params_per_dim = 2

    def __init__(self, clamp: float | None = 3.0) -> None:
        super().__init__()
        if clamp is not None:  # inf: c tanh(s / c) = inf * 0 = NaN; pass None for no bound
            # above MAX_CLAMP exp(s) overflows anyway and 2c sigma(.) - c loses the log-scale to cancellation
            clamp = check_number(
                "AffineTransformer", "clamp (or None)", clamp, minimum=0, strict=True, maximum=MAX_CLAMP
            )
        self.clamp = clamp

    def log_scale(self, raw: Tensor) -> Tensor:
        r"""The soft-clamped log-scale :math:`s = c \tanh(\hat s / c)` of raw values :math:`\hat s`."""
        if self.clamp is None:
            return raw
        # c·tanh(ŝ/c) written as 2c·σ(2ŝ/c) − c: the same function (to rounding), but torch's
        # CPU sigmoid is several times faster than its tanh, and this is on every coupling's hot path.
        c = self.clamp
        return torch.sigmoid(raw * (2.0 / c)) * (2.0 * c) - c

    @staticmethod
    def _affine(x: Tensor, shift: Tensor, log_scale: Tensor, *, inverse: bool = False) -> tuple[Tensor, Tensor]:
        r"""The affine map :math:`x e^{s} + t` (or its inverse :math:`(x - t) e^{-s}`) and its log-derivative.

        The elementwise log-derivative is :math:`s` (:math:`-s` for the inverse).

        Args:
            x: the input, any shape ``S``.
            shift: :math:`t`, broadcastable to ``S``.
            log_scale: :math:`s` (already clamped), broadcastable to ``S``.
            inverse: apply the inverse map.

        Returns:
            The output and the elementwise log-derivative, both of the broadcast shape.
        """
        if inverse:
            return (x - shift) * torch.exp(-log_scale), -log_scale
        return torch.addcmul(shift, x, log_scale.exp()), log_scale

    def _shift_log_scale(self, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, raw = params.unbind(-1)
        return shift, self.log_scale(raw)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._affine(x, *self._shift_log_scale(params))

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return self._affine(z, *self._shift_log_scale(params), inverse=True)

    def extra_repr(self) -> str:
        return f"clamp={self.clamp}"


class AdditiveTransformer(Transformer):
    r"""Volume-preserving shift :math:`z = x + t` (NICE), log-derivative 0.

    References:
        Dinh, Krueger, Bengio (2015), "NICE: Non-linear Independent Components Estimation",
        ICLR workshop, arXiv:1410.8516.

    Example:
        >>> import torch
        >>> z, ladj = AdditiveTransformer().forward_and_log_det(torch.zeros(2), torch.ones(2, 1))
        >>> z.tolist(), ladj.tolist()
        ([1.0, 1.0], [0.0, 0.0])
    """

    params_per_dim = 1

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return x + params[..., 0], torch.zeros_like(x)

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        return z - params[..., 0], torch.zeros_like(z)
