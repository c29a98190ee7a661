r"""Base distributions as modules.

Parameters and constants live in buffers/parameters, so ``.to(device)``, ``.double()`` and ``state_dict()`` just work.

Every distribution has an ``event_shape`` and the methods ``log_prob(x, context=None)`` (shape
``batch``), ``rsample(sample_shape, context=None)``, ``sample`` (no gradient) and
``rsample_and_log_prob``. With a context of shape ``(*c, context_features)`` the samples have shape
``(*sample_shape, *c, *event_shape)``.

:class:`TorchDistribution` makes any :class:`torch.distributions.Distribution` (a Student-t, a
Laplace, a full-covariance Gaussian, ...) such a module, so it can be a flow's base.

One concept a file: the contract (``base.py``), the Gaussians (``normal.py``), the torch
wrapper (``torch_distribution.py``) and :class:`Mixture` of flows, an exact-density mixture
for stratified importance sampling (``mixture.py``). The particle systems' mean-free Gaussian lives with them in
:mod:`flows.particles.mean_free`; the matrix normal over a batch of dependent rows in
:mod:`flows.architectures.dependent`.
"""

from flows.distributions.base import Distribution
from flows.distributions.mixture import Mixture
from flows.distributions.normal import DiagNormal, StandardNormal
from flows.distributions.torch_distribution import TorchDistribution

__all__ = ["DiagNormal", "Distribution", "Mixture", "StandardNormal", "TorchDistribution"]
