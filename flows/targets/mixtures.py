r"""Gaussian targets: a diagonal Gaussian and mixtures of diagonal Gaussians (FAB's 40 modes, Grenioux's 4 modes).

Both are normalised densities, so :math:`\log Z = 0` and exact samplers exist; they are the
oracle targets for importance weights, stochastic blocks and MCMC kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flows.targets.base import EnergyTarget

__all__ = ["Gaussian", "GaussianMixture"]

_LOG_2PI = math.log(2 * math.pi)


def _as_float_tensor(value: float | Tensor | Sequence, name: str, who: str) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.get_default_dtype())
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{who}: expected finite {name}, got {value!r}")
    return t


class Gaussian(EnergyTarget):
    r"""Diagonal Gaussian target :math:`\mathcal N(\mu, \operatorname{diag}\sigma^2)` with normalised energy.

    :math:`u(x) = \tfrac12 \sum_i ((x_i - \mu_i)/\sigma_i)^2 + \sum_i \log\sigma_i + \tfrac d2 \log 2\pi`,
    so :math:`\log Z = 0`. With ``loc=0, scale=1`` it is the energy :math:`u_0` of a standard normal
    base distribution (up to its constant), the usual start of an interpolated SNF energy.

    Args:
        event_shape: shape of one event.
        loc: mean, broadcast to ``event_shape``.
        scale: standard deviation (positive), broadcast to ``event_shape``.

    Example:
        >>> import torch
        >>> target = Gaussian(2, loc=1.0, scale=2.0)
        >>> x = target.sample((4,))
        >>> torch.allclose(target.log_prob(x), torch.distributions.Normal(1.0, 2.0).log_prob(x).sum(-1))
        True
    """

    log_Z = 0.0

    def __init__(
        self, event_shape: int | Sequence[int], *, loc: float | Tensor = 0.0, scale: float | Tensor = 1.0
    ) -> None:
        super().__init__(event_shape)
        name = type(self).__name__
        loc = _as_float_tensor(loc, "loc", name)
        scale = _as_float_tensor(scale, "scale", name)
        if not bool((scale > 0).all()):
            raise ValueError(f"{name}: expected a positive scale, got {scale}")
        self.register_buffer("loc", loc.expand(self.event_shape).clone())
        self.register_buffer("scale", scale.expand(self.event_shape).clone())

    def energy(self, x: Tensor) -> Tensor:
        self._check_input(x)
        dims = tuple(range(x.dim() - len(self.event_shape), x.dim()))
        u = 0.5 * ((x - self.loc) / self.scale).square() + self.scale.log() + 0.5 * _LOG_2PI
        return self._overflow_to_inf(u.sum(dims), x)

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        shape = self._sample_size(sample_shape)
        return self.loc + self.scale * self._randn((*shape, *self.event_shape), generator)


class GaussianMixture(EnergyTarget):
    r"""Mixture of diagonal Gaussians :math:`\sum_k w_k \mathcal N(\mu_k, \operatorname{diag}\sigma_k^2)`.

    :math:`u(x) = -\log \sum_k w_k \mathcal N(x; \mu_k, \sigma_k^2)` (normalised, :math:`\log Z = 0`),
    exact sampler. Named configurations from the literature:

    * :meth:`fab40`: FAB's 40 modes in 2-D, means uniform in :math:`[-40, 40]^2`, scale
      :math:`\operatorname{softplus}(1) \approx 1.313`, equal weights (Midgley et al. 2023);
    * :meth:`four_modes`: Grenioux et al.'s 4 modes in ``d`` dimensions, unit covariance, means
      :math:`\pm\alpha\sqrt{2\log d}\,(s_1, \dots, s_d)` with the sign patterns
      (−…−, +…+), (+…+, +…+), (−…−, −…−), (+…+, −…−) over the two halves, :math:`\alpha = 0.591`.

    References:
        Midgley, Stimper, Simm, Schölkopf, Hernández-Lobato (2023), "Flow Annealed Importance
        Sampling Bootstrap", ICLR, arXiv:2208.01893. Grenioux, Durmus, Moulines, Gabrié (2023),
        "On Sampling with Approximate Transport Maps", ICML, arXiv:2302.04763.

    Args:
        locs: component means ``(K, *event_shape)``.
        stds: component standard deviations, broadcastable to ``locs`` (positive).
        weights: mixture weights ``(K,)`` (positive; normalised here), equal by default.

    Example:
        >>> import torch
        >>> target = GaussianMixture.four_modes(8)
        >>> x = target.sample((1000,), generator=torch.Generator().manual_seed(0))
        >>> counts = torch.bincount(target.assign(x), minlength=4)
        >>> bool((counts > 200).all())
        True
    """

    log_Z = 0.0

    def __init__(
        self,
        locs: Tensor | Sequence,
        stds: float | Tensor | Sequence = 1.0,
        weights: Tensor | Sequence | None = None,
    ) -> None:
        name = type(self).__name__
        locs = _as_float_tensor(locs, "locs", name)
        if locs.dim() < 2:
            raise ValueError(f"{name}: expected locs of shape (K, *event_shape), got {tuple(locs.shape)}")
        super().__init__(locs.shape[1:])
        stds = _as_float_tensor(stds, "stds", name)
        try:
            stds = stds.expand(locs.shape).clone()
        except RuntimeError as error:
            raise ValueError(
                f"{name}: expected stds broadcastable to {tuple(locs.shape)}, got {tuple(stds.shape)}"
            ) from error
        if not bool((stds > 0).all()):
            raise ValueError(f"{name}: expected positive stds, got {stds}")
        k = locs.shape[0]
        weights = torch.ones(k) if weights is None else _as_float_tensor(weights, "weights", name)
        if weights.shape != (k,) or not bool((weights > 0).all()):
            raise ValueError(f"{name}: expected {k} positive weights, got {weights}")
        self.register_buffer("locs", locs.clone())
        self.register_buffer("stds", stds)
        self.register_buffer("log_weights", (weights / weights.sum()).log())

    @classmethod
    def fab40(cls, *, seed: int = 0) -> GaussianMixture:
        r"""FAB's 40-mode mixture in 2-D (``GMM(dim=2, n_mixes=40, loc_scaling=40, log_var_scaling=1)``).

        Means :math:`(U - 0.5) \cdot 80` with :math:`U \sim \mathcal U[0,1)^{40\times 2}` drawn from
        ``torch.Generator().manual_seed(seed)`` (the same stream as ``torch.manual_seed(seed)``
        before FAB builds its target); scale :math:`\operatorname{softplus}(1)` in each direction.
        """
        generator = torch.Generator().manual_seed(seed)
        locs = (torch.rand((40, 2), generator=generator) - 0.5) * 2 * 40
        return cls(locs, torch.nn.functional.softplus(torch.tensor(1.0)))

    @classmethod
    def four_modes(cls, dim: int, *, alpha: float = 0.591, scale: float = 1.0) -> GaussianMixture:
        r"""Grenioux et al.'s 4-mode mixture in ``dim`` dimensions (even ``dim`` ≥ 2), equal weights.

        Means :math:`\alpha\sqrt{2\log d}` times the sign patterns listed on the class, in the order
        of the reference code; covariance ``scale² I``.
        """
        if not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"GaussianMixture.four_modes: expected an even dim >= 2, got {dim!r}")
        half = dim // 2
        signs = torch.ones(4, dim)
        signs[0, :half] = -1.0
        signs[2] = -1.0
        signs[3, half:] = -1.0
        return cls(signs * alpha * math.sqrt(2 * math.log(dim)), scale)

    @property
    def n_components(self) -> int:
        """Number of components ``K``."""
        return self.locs.shape[0]

    def component_log_probs(self, x: Tensor) -> Tensor:
        r""":math:`\log w_k + \log \mathcal N(x; \mu_k, \sigma_k^2)`, shape ``(*batch, K)``."""
        self._check_input(x)
        n = len(self.event_shape)
        z = (x.unsqueeze(-n - 1) - self.locs) / self.stds
        dims = tuple(range(-n, 0))
        return self.log_weights - (0.5 * z.square() + self.stds.log()).sum(dims) - 0.5 * self.dim * _LOG_2PI

    def energy(self, x: Tensor) -> Tensor:
        return self._overflow_to_inf(-torch.logsumexp(self.component_log_probs(x), dim=-1), x)

    def assign(self, x: Tensor) -> Tensor:
        """Index of the most probable component of each sample (the mode it belongs to), shape ``batch``."""
        return self.component_log_probs(x).argmax(-1)

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), *, generator: torch.Generator | None = None) -> Tensor:
        shape = self._sample_size(sample_shape)
        n = shape.numel()
        comp = torch.multinomial(self.log_weights.exp(), n, replacement=True, generator=generator) if n else None
        eps = self._randn((n, *self.event_shape), generator).to(self.locs)
        x = self.locs[comp] + self.stds[comp] * eps if n else eps
        return x.reshape(*shape, *self.event_shape)

    def extra_repr(self) -> str:
        return f"components={self.n_components}, event_shape={tuple(self.event_shape)}"
