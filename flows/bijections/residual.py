r"""Invertible residual blocks :math:`z = x + g(x)` with a Lipschitz-constrained :math:`g` (i-ResNet, Residual Flows).

If :math:`\operatorname{Lip}(g) < 1` the block is invertible (Banach's fixed-point theorem):
:math:`x` is the limit of :math:`x \leftarrow z - g(x)`, computed by
:func:`~flows.bijections.numerical_inverse.fixed_point_inverse` with implicit gradients. :math:`g`
is an MLP of :class:`SpectralLinear` layers, each rescaled to spectral norm at most
``coefficient < 1``, and :class:`LipSwish` activations (Lipschitz 1), so
:math:`\operatorname{Lip}(g) \le \text{coefficient}^{L}`.

The log-determinant :math:`\log\det(I + J_g(x))` (positive: every eigenvalue of :math:`I + J_g`
has positive real part) is

* ``"exact"``: the per-sample Jacobian (``D`` vector-Jacobian products, vectorised) and ``slogdet``;
* ``"roulette"``: the unbiased Russian-roulette estimator of the power series
  :math:`\sum_{k\ge1} (-1)^{k+1} \operatorname{tr}(J^k)/k` with Hutchinson probes
  :math:`v \sim \mathcal N(0, I)` (Chen et al. 2019),

  .. math:: \widehat{\log\det} = \sum_{k=1}^{N} \frac{(-1)^{k+1}}{k}
            \frac{v^\top J^k v}{P(N \ge k)},\qquad N = n_0 + G,\ G \sim \operatorname{Geom}(p),

  whose gradient is the Neumann series :math:`\sum_{k=0}^{N} (-1)^k v^\top J^k (\partial J) v /
  P(N \ge k)` evaluated as one extra vector-Jacobian product through the graph (the
  memory-saving gradient of Chen et al.: no graph is kept for the ``N`` power terms).

The estimator is random, so it is used only while training with gradients enabled; evaluation
(``eval()`` or ``torch.no_grad()``) always uses the exact log-determinant, so that ``log_prob`` is
exact and deterministic. ``"auto"`` picks the estimator for ``D > 16``.

References:
    Behrmann, Grathwohl, Chen, Duvenaud, Jacobsen (2019), "Invertible Residual Networks", ICML,
    arXiv:1811.00995. Chen, Behrmann, Duvenaud, Jacobsen (2019), "Residual Flows for Invertible
    Generative Modeling", NeurIPS, arXiv:1906.02735. Miyato, Kataoka, Koyama, Yoshida (2018),
    "Spectral Normalization for Generative Adversarial Networks", ICLR, arXiv:1802.05957.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection
from flows.bijections.numerical_inverse import fixed_point_inverse

__all__ = ["LipSwish", "ResidualBlock", "SpectralLinear", "roulette_log_det", "structured_roulette_log_det"]

_LOG_DET_CHOICES = ("auto", "exact", "roulette")
_AUTO_EXACT_MAX = 16  # "auto": exact log-determinant up to this many features


class LipSwish(nn.Module):
    r"""LipSwish :math:`x \sigma(\beta x) / 1.1`, :math:`\beta = \operatorname{softplus}(\hat\beta) > 0`: Lipschitz 1.

    The Swish's derivative is bounded by about 1.0998 for every :math:`\beta`, hence the 1.1 (Chen
    et al. 2019, §4); unlike ELU or ReLU its second derivative is continuous, which the power-series
    log-determinant needs.

    Example:
        >>> import torch
        >>> x = torch.linspace(-5, 5, 101, requires_grad=True)
        >>> (dx,) = torch.autograd.grad(LipSwish()(x).sum(), x)
        >>> bool(dx.abs().max() <= 1)
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self.raw_beta = nn.Parameter(torch.tensor(0.5413))  # softplus(0.5413) = 1

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(F.softplus(self.raw_beta) * x) / 1.1

    def value_and_derivative(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""The activation and its derivative :math:`(s + \beta x s (1 - s)) / 1.1`, :math:`s = \sigma(\beta x)`.

        Both are differentiable (the structured log-det estimators build on the derivative).
        """
        beta = F.softplus(self.raw_beta)
        s = torch.sigmoid(beta * x)
        return x * s / 1.1, (s + beta * x * s * (1 - s)) / 1.1


class SpectralLinear(nn.Module):
    r"""Spectrally normalised linear layer :math:`W' x + b` with :math:`W' = W \min(1, c/\hat\sigma)`.

    :math:`\hat\sigma = u^\top W v` by power iteration (Miyato et al. 2018) run to convergence
    (relative change below ``1e-12`` in float64, ``1e-6`` otherwise; at most ``max_iter`` steps in
    evaluation mode, ``train_iter`` in training mode) from the vectors kept in the buffers ``u``
    and ``v``, which only warm-start the next call (they are updated in training mode only): in
    evaluation the value is the same (to the tolerance) whatever their state, so there is no stale
    cache in the log-det path.
    The gradient flows through :math:`u^\top W v` with :math:`u, v` held fixed (the exact gradient of
    :math:`\sigma_1` at the singular vectors). With ``context`` inputs, only the block acting on
    :math:`x` is normalised (Lipschitz in :math:`x` is what invertibility needs).

    Args:
        in_features: input width (the part the constraint is on).
        out_features: output width.
        coefficient: ``c``, the bound on the spectral norm.
        context: extra (unconstrained) input width.
        max_iter: most power iterations per call in evaluation mode (and at construction).
        train_iter: most power iterations per call in training mode, where the weights move a
            little per step and the warm start is close (Miyato et al. use one).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        coefficient: float = 0.97,
        context: int = 0,
        max_iter: int = 200,
        train_iter: int = 10,
    ) -> None:
        super().__init__()
        layer = nn.Linear(in_features + context, out_features)
        self.weight = nn.Parameter(layer.weight.detach()[:, :in_features].clone())
        self.context_weight = nn.Parameter(layer.weight.detach()[:, in_features:].clone()) if context else None
        self.bias = nn.Parameter(layer.bias.detach().clone())
        self.coefficient = coefficient
        self.max_iter = max_iter
        self.register_buffer("u", F.normalize(torch.randn(out_features), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(in_features), dim=0))
        self.train_iter = train_iter
        self._power_iteration(self.max_iter, store=True)  # converged at construction

    def _apply(self, fn, *args, **kwargs):
        """After a dtype change, converge the warm start again at the new precision.

        Only a change of dtype: a no-op ``.to()`` (``load_model`` moves the loaded model to its
        device) must leave the loaded buffers, and so the loaded density, exactly as saved.
        """
        dtype = self.weight.dtype
        out = super()._apply(fn, *args, **kwargs)
        if self.weight.dtype != dtype and self.weight.is_floating_point() and self.weight.device.type != "meta":
            self._power_iteration(self.max_iter, store=True)
        return out

    @torch.no_grad()
    def _power_iteration(self, limit: int | None = None, *, store: bool | None = None) -> tuple[Tensor, Tensor]:
        w = self.weight.detach()
        u, v = self.u.to(w), self.v.to(w)
        tol = 1e-12 if w.dtype == torch.float64 else 1e-6
        tiny = torch.finfo(w.dtype).tiny
        sigma = None
        if limit is None:
            limit = self.train_iter if self.training else self.max_iter
        for _ in range(limit):
            v_new = self._adjoint(w, u)
            v_norm = float(torch.linalg.vector_norm(v_new))
            if v_norm <= tiny:  # W = 0 (a zero-initialised layer): keep the unit vectors, σ̂ = 0
                break
            v = v_new / v_norm
            wv = self._operator(w, v)
            norm = torch.linalg.vector_norm(wv)
            u = wv / norm.clamp_min(tiny)
            new = float(norm)  # = uᵀ W v
            if sigma is not None and abs(new - sigma) <= tol * new:
                break
            sigma = new
        if self.training if store is None else store:  # warm start; evaluation stays a pure function of the state
            self.u.copy_(u)
            self.v.copy_(v)
        return u, v

    def normalized_weight(self) -> Tensor:
        r""":math:`W \min(1, c / \hat\sigma)`, differentiable in :math:`W`."""
        u, v = self._power_iteration()
        sigma = (u * self._operator(self.weight, v)).sum()
        return self.weight * (
            self.coefficient / torch.clamp(sigma, min=self.coefficient)
        )  # = min(1, c/σ̂), finite at σ̂ = 0

    @staticmethod
    def _operator(weight: Tensor, v: Tensor) -> Tensor:
        """The linear map whose spectral norm is bounded, applied to one vector: :math:`W v`."""
        return weight @ v

    @staticmethod
    def _adjoint(weight: Tensor, u: Tensor) -> Tensor:
        r"""Its adjoint: :math:`W^\top u`."""
        return weight.T @ u

    def apply(self, x: Tensor, weight: Tensor, context: Tensor | None = None) -> Tensor:
        """The layer with a given (normalised) weight: :math:`W x + b` (+ the context block)."""
        out = F.linear(x, weight, self.bias)
        if self.context_weight is not None and context is not None:
            out = out + F.linear(context, self.context_weight)
        return out

    @staticmethod
    def tangent(t: Tensor, weight: Tensor) -> Tensor:
        """The layer's Jacobian-vector product :math:`W t` (no bias)."""
        return F.linear(t, weight)

    @staticmethod
    def transpose(u: Tensor, weight: Tensor) -> Tensor:
        r"""The layer's vector-Jacobian product :math:`u^\top W`."""
        return u @ weight

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, coefficient={self.coefficient}"


def roulette_log_det(
    g: Callable[[Tensor], Tensor], x: Tensor, event_ndim: int, *, exact_terms: int = 2, p: float = 0.5
) -> tuple[Tensor, Tensor]:
    r"""The Russian-roulette power-series estimate of :math:`\log\det(I + J_g(x))` and its Neumann-gradient surrogate.

    Args:
        g: the residual branch (evaluated once here, with a graph).
        x: the input ``(*batch, *event)`` (requires grad).
        event_ndim: number of event dimensions.
        exact_terms: :math:`n_0`, terms always included.
        p: the geometric parameter (stopping probability per further term).

    Returns:
        ``(gx, estimate)``: :math:`g(x)` and the estimate (shape ``batch``), whose value is the
        power-series estimate and whose gradient is the Neumann-series estimate of
        :math:`\partial \log\det / \partial (x, \theta)`.
    """
    gx = g(x)
    dims = tuple(range(-event_ndim, 0))
    n = exact_terms + int(torch.distributions.Geometric(probs=torch.tensor(p)).sample())
    v = torch.randn_like(x)

    def survival(k: int) -> float:
        return 1.0 if k <= exact_terms else (1 - p) ** (k - exact_terms)

    power = v
    value = torch.zeros(gx.shape[: gx.dim() - event_ndim], dtype=x.dtype, device=x.device)
    neumann = v.clone()
    for k in range(1, n + 1):
        (power,) = torch.autograd.grad(gx, x, power, retain_graph=True)  # vᵀJᵏ
        power = power.detach()
        value = value + (-1) ** (k + 1) / k * (power * v).sum(dims) / survival(k)
        neumann = neumann + (-1) ** k * power / survival(k)
    (vjp,) = torch.autograd.grad(gx, x, neumann, create_graph=True)  # wᵀJ, differentiable in x and θ
    surrogate = (vjp * v).sum(dims)
    return gx, value + surrogate - surrogate.detach()


def _geometric(p: float) -> int:
    """One draw of :class:`torch.distributions.Geometric` ``(p)`` (failures before the first success).

    The same draw from the same generator state as ``Geometric(probs=torch.tensor(p)).sample()``
    (one uniform on ``[tiny, 1)``, then ``floor(log u / log(1 - p))`` in float32), without building a
    distribution object per call (which costs more than a block's power terms at small sizes).
    """
    u = torch.empty((), dtype=torch.float32).uniform_(torch.finfo(torch.float32).tiny, 1)
    return int((u.log() / torch.tensor(-p, dtype=torch.float32).log1p()).floor())


def _survival(k: int, exact_terms: int, p: float) -> float:
    r""":math:`P(N \ge k)` for :math:`N = n_0 + \operatorname{Geom}(p)`."""
    return 1.0 if k <= exact_terms else (1 - p) ** (k - exact_terms)


def structured_roulette_log_det(
    layers: Sequence[SpectralLinear],
    activations: Sequence[LipSwish],
    weights: Sequence[Tensor],
    x: Tensor,
    context: Tensor | None,
    event_ndim: int,
    *,
    exact_terms: int = 2,
    p: float = 0.5,
) -> tuple[Tensor, Tensor]:
    r""":func:`roulette_log_det` for a branch of known layers, without autograd loops.

    The branch is :math:`g = W_L \circ \phi \circ \dots \circ \phi \circ W_1` (affine layers, LipSwish).

    The same estimator (same draws of :math:`N` and :math:`v`, in the same order, so the same value
    to rounding), evaluated from the structure :math:`J_g = W_L D_{L-1} W_{L-1} \cdots D_1 W_1`,
    :math:`D_l = \operatorname{diag}\phi'(a_l)`: the :math:`N` power terms :math:`v^\top J^k` are
    products with the detached :math:`W_l` and :math:`D_l` (no graph, no autograd engine), and the
    Neumann surrogate :math:`w^\top (J v)` uses the forward tangent :math:`J v` built alongside
    :math:`g(x)` with a graph, so its gradient is **one ordinary backward pass** (no double backward
    through a vector-Jacobian product, as in Chen et al.'s implementation and normflows').

    Returns:
        ``(gx, estimate)`` as :func:`roulette_log_det`.
    """
    dims = tuple(range(-event_ndim, 0))
    n = exact_terms + _geometric(p)
    v = torch.randn_like(x)
    h, t, derivatives = x, v, []
    last = len(layers) - 1
    for i, (layer, w) in enumerate(zip(layers, weights, strict=True)):
        h, t = layer.apply(h, w, context), layer.tangent(t, w)
        if i < last:
            h, d = activations[i].value_and_derivative(h)
            t = t * d
            derivatives.append(d.detach())
    detached = [w.detach() for w in weights]
    power = v
    value = torch.zeros(h.shape[: h.dim() - event_ndim], dtype=x.dtype, device=x.device)
    neumann = v.clone()
    with torch.no_grad():
        for k in range(1, n + 1):
            for i in range(last, -1, -1):  # vᵀJᵏ = ((vᵀJᵏ⁻¹ W_L) D_{L-1}) W_{L-1} ⋯
                power = layers[i].transpose(power, detached[i])
                if i > 0:
                    power = power * derivatives[i - 1]
            value = value + (-1) ** (k + 1) / k * (power * v).sum(dims) / _survival(k, exact_terms, p)
            neumann = neumann + (-1) ** k * power / _survival(k, exact_terms, p)
    surrogate = (neumann * t).sum(dims)  # wᵀ J v, differentiable in x and θ through the tangent
    return h, value + surrogate - surrogate.detach()


class ResidualBlock(Bijection):
    r"""Invertible residual block :math:`z = x + g(x, c)` with :math:`\operatorname{Lip}_x(g) \le c^{L} < 1`.

    :math:`g` is :class:`SpectralLinear` → :class:`LipSwish` → … → :class:`SpectralLinear`
    through the ``hidden`` widths; the context (if any) enters every layer unconstrained.

    * forward: :math:`z = x + g(x)`, :math:`\log|\det J| = \log\det(I + J_g(x))` (exact, or the
      Russian-roulette estimate while training: see the module docstring);
    * inverse: the fixed point of :math:`x \leftarrow z - g(x)` (implicit gradients), and minus the
      log-determinant at the solution.

    References:
        Behrmann et al. (2019), "Invertible Residual Networks", arXiv:1811.00995. Chen et al.
        (2019), "Residual Flows for Invertible Generative Modeling", arXiv:1906.02735.

    Args:
        features: number of features ``D``.
        context: context width (0 for none).
        hidden: hidden widths of :math:`g`.
        coefficient: spectral-norm bound of every layer (in ``(0, 1)``).
        log_det: ``"auto"`` (exact for ``D <= 16``, else the estimator in training), ``"exact"``
            or ``"roulette"``.
        exact_terms: power-series terms always computed by the estimator.

    Raises:
        ValueError: for a non-vector event, a coefficient outside ``(0, 1)`` or an unknown ``log_det``.

    Example:
        >>> import torch
        >>> t = ResidualBlock(3, hidden=(16,)).double()
        >>> x = torch.randn(4, 3, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x), ladj.shape
        (True, torch.Size([4]))
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        hidden: Sequence[int] = (64, 64),
        coefficient: float = 0.97,
        log_det: str = "auto",
        exact_terms: int = 2,
    ) -> None:
        super().__init__(features)
        if len(self.event_shape) != 1 or self.event_shape[0] is None:
            raise ValueError(f"ResidualBlock: expected a vector event (features: int), got {features!r}")
        if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or not 0 < coefficient < 1:
            raise ValueError(f"ResidualBlock: expected 0 < coefficient < 1 (a contraction), got {coefficient!r}")
        if log_det not in _LOG_DET_CHOICES:
            raise ValueError(f"ResidualBlock: expected log_det to be one of {_LOG_DET_CHOICES}, got {log_det!r}")
        if (
            isinstance(hidden, (str, bytes))
            or not isinstance(hidden, Sequence)
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)
        ):
            raise ValueError(f"ResidualBlock: expected hidden to be a sequence of positive ints, got {hidden!r}")
        d = self.event_shape[0]
        widths = [d, *hidden, d]
        self.layers = nn.ModuleList(
            SpectralLinear(widths[i], widths[i + 1], coefficient=coefficient, context=context)
            for i in range(len(widths) - 1)
        )
        self.activations = nn.ModuleList(LipSwish() for _ in hidden)
        self.context_features = context
        self.log_det = log_det
        self.exact_terms = exact_terms

    @property
    def _event_ndim(self) -> int:
        return len(self.event_shape)

    @property
    def _dimension(self) -> int:
        return math.prod(self.event_shape)

    def _branch(self, x: Tensor, context: Tensor | None, weights: list[Tensor]) -> Tensor:
        """:math:`g(x, c)` with given normalised weights (a pure function of ``x``: vmap- and solver-safe)."""
        for i, (layer, w) in enumerate(zip(self.layers, weights, strict=True)):
            out = layer.apply(x, w, context)
            x = self.activations[i](out) if i < len(self.activations) else out
        return x

    def _use_estimator(self) -> bool:
        wanted = self.log_det == "roulette" or (self.log_det == "auto" and self._dimension > _AUTO_EXACT_MAX)
        return wanted and self.training and torch.is_grad_enabled()

    def _branch_and_jacobian(self, x: Tensor, context: Tensor | None, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        r""":math:`g(x)` and the per-sample Jacobian :math:`W_L D_{L-1} W_{L-1} \cdots D_1 W_1` (``(*batch, D, D)``).

        One pass that carries the Jacobian as a batch of matrices (differentiable), instead of
        ``D`` vector-Jacobian products.
        """
        h, jac = x, None
        last = len(self.layers) - 1
        for i, (layer, w) in enumerate(zip(self.layers, weights, strict=True)):
            h = layer.apply(h, w, context)
            jac = w if jac is None else w @ jac
            if i < last:
                h, d = self.activations[i].value_and_derivative(h)
                jac = d.unsqueeze(-1) * jac
        return h, jac.expand(*h.shape, h.shape[-1])

    def _exact_log_det(self, gx_and_jac: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        r"""``(g(x), \log\det(I + J_g(x)))`` from :meth:`_branch_and_jacobian`."""
        gx, jac = gx_and_jac
        eye = torch.eye(jac.shape[-1], dtype=jac.dtype, device=jac.device)
        return gx, torch.linalg.slogdet(eye + jac).logabsdet

    def _log_det(self, x: Tensor, context: Tensor | None, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        """``(g(x), log det(I + J_g(x)))``, exact or estimated (see :meth:`_use_estimator`)."""
        if self._use_estimator():
            return structured_roulette_log_det(
                self.layers, self.activations, weights, x, context, self._event_ndim, exact_terms=self.exact_terms
            )
        return self._exact_log_det(self._branch_and_jacobian(x, context, weights))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        weights = [layer.normalized_weight() for layer in self.layers]
        gx, ladj = self._log_det(x, context, weights)
        return x + gx, ladj

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        weights = [layer.normalized_weight() for layer in self.layers]
        x = fixed_point_inverse(
            lambda v: self._branch(v, context, weights), z, event_ndim=self._event_ndim, who=type(self).__name__
        )
        return x, -self._log_det(x, context, weights)[1]

    def extra_repr(self) -> str:
        lip = math.prod(layer.coefficient for layer in self.layers)
        return (
            f"{super().extra_repr()}, context={self.context_features}, log_det={self.log_det!r}, lipschitz<={lip:.3g}"
        )
