"""Test-only targets and transports with exact answers for the MCMC tests (library targets: flows.targets)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flows import Affine, Flow, LULinear, StandardNormal
from flows.bijections.base import Bijection
from flows.distributions import Distribution
from flows.targets import EnergyTarget


class Gaussian(EnergyTarget):
    """N(mean, cov), full covariance (flows.targets.Gaussian is diagonal); energy ½ (x-μ)ᵀ Σ⁻¹ (x-μ), exact sampler."""

    def __init__(self, mean: Tensor, cov: Tensor) -> None:
        super().__init__(mean.shape[-1])
        self.register_buffer("mean", mean)
        self.register_buffer("cov", cov)
        self.register_buffer("scale_tril", torch.linalg.cholesky(cov))
        self.log_Z = 0.5 * mean.shape[-1] * math.log(2 * math.pi) + float(self.scale_tril.diagonal().log().sum())

    def energy(self, x: Tensor) -> Tensor:
        diff = (x - self.mean).unsqueeze(-1)
        white = torch.linalg.solve_triangular(self.scale_tril, diff, upper=False).squeeze(-1)
        return 0.5 * white.square().sum(-1)

    def sample(self, sample_shape=()) -> Tensor:
        shape = (sample_shape,) if isinstance(sample_shape, int) else tuple(sample_shape)
        eps = torch.randn(*shape, self.mean.shape[-1], dtype=self.mean.dtype)
        return self.mean + eps @ self.scale_tril.T


def correlated_gaussian(dtype=torch.float64) -> Gaussian:
    """A 3-D Gaussian with unequal scales and correlations."""
    mean = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    a = torch.tensor([[1.2, 0.0, 0.0], [0.6, 0.8, 0.0], [-0.3, 0.4, 0.5]], dtype=dtype)
    return Gaussian(mean, a @ a.T)


def perfect_flow(target: Gaussian) -> Flow:
    """The exact flow of a Gaussian: z = L⁻¹ (x − μ), as an LULinear layer (P = I, U = 0)."""
    d = target.mean.shape[-1]
    layer = LULinear(d).to(target.mean.dtype)
    w = torch.linalg.inv(target.scale_tril)
    diag = w.diagonal()
    with torch.no_grad():
        layer.lower.copy_(torch.tril(w / diag[None, :], -1))
        layer.upper.zero_()
        layer.log_diag.copy_(diag.abs().log())
        layer.sign.copy_(diag.sign())
        layer.bias.copy_(-(w @ target.mean))
    return Flow(layer, StandardNormal(d)).to(target.mean.dtype)


def imperfect_flow(target: Gaussian, *, log_scale: float = -0.25, shift: float = 0.3) -> Flow:
    """The exact flow followed by a wrong elementwise affine map (a wider, shifted proposal)."""
    flow = perfect_flow(target)
    d = target.mean.shape[-1]
    from flows import Chain

    wrong = Affine(d, shift=shift, log_scale=log_scale).to(target.mean.dtype)
    return Flow(Chain(flow.transform, wrong), StandardNormal(d)).to(target.mean.dtype)


class FunnelTransport(Bijection):
    """Data → latent map of a funnel: z_0 = v / a, z_i = x_i e^{−b v / 2} (exact for a = 3, b = 1)."""

    def __init__(self, dim: int, a: float = 3.0, b: float = 1.0) -> None:
        super().__init__(dim)
        self.a, self.b = a, b

    def forward_and_log_det(self, y: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        v, x = y[..., :1], y[..., 1:]
        z = torch.cat([v / self.a, x * torch.exp(-self.b * v / 2)], -1)
        ladj = -math.log(self.a) - self.b * v[..., 0] / 2 * x.shape[-1]
        return z, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        v = self.a * z[..., :1]
        x = z[..., 1:] * torch.exp(self.b * v / 2)
        ladj = math.log(self.a) + self.b * v[..., 0] / 2 * x.shape[-1]
        return torch.cat([v, x], -1), ladj


class ThreeStates(EnergyTarget):
    """A target on the three points {0, 1, 2} of the line with probabilities ``probs``."""

    def __init__(self, probs: Tensor) -> None:
        super().__init__(1)
        self.register_buffer("log_probs", probs.log())

    def energy(self, x: Tensor) -> Tensor:
        return -self.log_probs[x[..., 0].round().long()]


class Categorical3(Distribution):
    """A proposal on {0, 1, 2} (event shape (1,)) as a flow base; with an identity transform, a 'flow'."""

    def __init__(self, probs: Tensor) -> None:
        super().__init__(1)
        self.register_buffer("probs", probs)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self.probs.log()[x[..., 0].round().long()]

    def rsample(self, sample_shape=(), context: Tensor | None = None) -> Tensor:
        shape = torch.Size((sample_shape,) if isinstance(sample_shape, int) else sample_shape)
        draws = torch.multinomial(self.probs, shape.numel(), replacement=True)
        return draws.reshape(*shape, 1).to(self.probs.dtype)


def discrete_flow(probs: Tensor) -> Flow:
    """A Flow whose samples and densities are those of a categorical proposal on {0, 1, 2}."""
    return Flow(Affine(1), Categorical3(probs)).to(probs.dtype)
