r"""An energy target seen through a bijection: the Boltzmann density in other coordinates (e.g. internal ones).

For a target :math:`\pi(x) \propto e^{-u(x)}` and a bijection :math:`z = f(x)` (forward direction
data → latent, as every :class:`~flows.bijections.Bijection`), the density of :math:`z` is

.. math::

    \pi_z(z) \propto e^{-u_z(z)}, \qquad
    u_z(z) = u(f^{-1}(z)) - \log\left|\det \frac{\partial f^{-1}}{\partial z}\right|,

with the same normalising constant :math:`Z`. A flow trained on :math:`u_z` (reverse KL) has the
same importance weights as the flow composed with :math:`f^{-1}` has against :math:`u`:
:math:`\log w = -u_z(z) - \log q_z(z) = -u(x) - \log q_x(x)`. For molecules :math:`f` is
:class:`~flows.bijections.InternalCoordinates`, whose log-det is exact (frame factor included).
"""

from __future__ import annotations

import torch
from torch import Tensor

from flows.bijections.base import Bijection
from flows.targets.base import EnergyTarget

__all__ = ["TransformedTarget"]


class TransformedTarget(EnergyTarget):
    r"""The target pulled back through a bijection :math:`f`: :math:`u_z(z) = u(f^{-1}(z)) - \log|\det J_{f^{-1}}(z)|`.

    Energies are computed in ``dtype`` (float64 for a bijection without parameters: the inverse of
    a Z-matrix chains 19 placements, and OpenMM computes in float64 anyway) and returned in the caller's dtype, with
    gradients through both the bijection and the target (the OpenMM bridge gives forces).
    NaN in gives NaN out; a latent point the bijection maps to a non-finite configuration, or to
    one whose energy is not finite, gets :math:`u_z = +\infty`.

    Args:
        target: the energy target on the data side (e.g. :class:`~flows.targets.AlanineDipeptide`).
        bijection: :math:`f`, from the target's configurations to the new coordinates (e.g.
            ``target.internal_coordinates(reference=frames)``).
        dtype: the dtype the pull-back is computed in (``None``: that of the bijection's
            parameters, float64 for one without parameters such as ``InternalCoordinates``).

    Raises:
        TypeError: for a target that is not an :class:`~flows.targets.EnergyTarget` or a
            bijection that is not a :class:`~flows.bijections.Bijection`.
        ValueError: when the bijection's input size is not the target's event size.

    Example:
        >>> import torch
        >>> from flows import Affine
        >>> from flows.targets import Gaussian
        >>> t = TransformedTarget(Gaussian(2), Affine(2))  # the identity at initialisation
        >>> torch.allclose(t.energy(torch.ones(3, 2)), Gaussian(2).energy(torch.ones(3, 2)))
        True
    """

    def __init__(self, target: EnergyTarget, bijection: Bijection, *, dtype: torch.dtype | None = None) -> None:
        if not isinstance(target, EnergyTarget):
            raise TypeError(f"TransformedTarget: expected an EnergyTarget, got {type(target).__name__}")
        if not isinstance(bijection, Bijection):
            raise TypeError(f"TransformedTarget: expected a Bijection, got {type(bijection).__name__}")
        size_in, size_out = tuple(bijection.event_shape or ()), tuple(bijection.event_shape_out or ())
        if size_in != tuple(target.event_shape):
            raise ValueError(
                f"TransformedTarget: expected a bijection of the target's event shape {tuple(target.event_shape)}, "
                f"got one of {size_in}"
            )
        super().__init__(size_out)
        self.target, self.bijection, self._dtype = target, bijection, dtype

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the bijection runs in: as given, else its parameters' (it follows ``.double()``), else float64."""
        if self._dtype is not None:
            return self._dtype
        return next((p.dtype for p in self.bijection.parameters() if p.is_floating_point()), torch.float64)

    def energy(self, z: Tensor) -> Tensor:
        self._check_input(z)
        zc = z.to(self.dtype)
        x, ladj = self.bijection.inverse_and_log_det(zc)
        finite = torch.isfinite(x).all(-1)
        safe = torch.where(finite[..., None], x, torch.zeros((), dtype=x.dtype))
        u = torch.where(finite, self.target.energy(safe) - ladj, torch.inf)
        u = torch.where(torch.isnan(z).any(-1), torch.nan, u)
        return self._overflow_to_inf(u, z).to(z.dtype)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, dtype={self.dtype}"
