r"""Planar, radial and Sylvester flows: residual maps of rank one (or ``M``) with exact log-determinants.

All three are :math:`z = x + (\text{low-rank update})`, invertible under a constraint that the
parameterisation enforces, with the log-determinant from the matrix determinant lemma. None has a
closed-form inverse; each inverse reduces to **scalar monotone equations** solved by
:func:`~flows.bijections.numerical_inverse.monotone_inverse` (implicit gradients, a clear error
when it does not converge):

* planar: one equation along :math:`w` (for :math:`a = w^\top x + b`);
* radial: one equation for the radius :math:`r = \lVert x - x_0 \rVert`;
* Sylvester: ``M`` equations solved by back-substitution, because the Jacobian of the
  ``M``-dimensional core is triangular.

They were designed for variational inference (as posteriors :math:`q(z \mid x)` sampled in the
forward direction); in this library's direction convention the forward map is the closed-form
one, so use them as written for VI (``flows.Inverse`` of them for a density estimator samples in
closed form and evaluates densities through the numerical inverse).

References:
    Rezende, Mohamed (2015), "Variational Inference with Normalizing Flows", ICML,
    arXiv:1505.05770. van den Berg, Hasenclever, Tomczak, Welling (2018), "Sylvester Normalizing
    Flows for Variational Inference", UAI, arXiv:1803.05649.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection
from flows.bijections.numerical_inverse import monotone_inverse
from flows.bijections.orthogonal import _features, _reflections, householder_matrix

__all__ = ["Planar", "Radial", "Sylvester"]


_MARGIN = 1e-3  # w^T û >= -1 + _MARGIN (Planar), β >= -α + _MARGIN (Radial): non-singular Jacobians


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    return (torch.rand(shape) * 2 - 1) * bound


class Planar(Bijection):
    r"""Planar flow :math:`z = x + \hat u \tanh(w^\top x + b)` (Rezende & Mohamed 2015).

    Invertibility needs :math:`w^\top \hat u \ge -1`; it is enforced by
    :math:`\hat u = u + (m(w^\top u) - w^\top u)\, w / \lVert w \rVert^2` with
    :math:`m(s) = -1 + \epsilon + \operatorname{softplus}(s)`, so that
    :math:`w^\top \hat u = m(w^\top u) \ge -1 + \epsilon` (the paper's :math:`m` with a margin
    :math:`\epsilon = 10^{-3}`: without it a float64 softplus rounds to 0 for :math:`w^\top u < -37`,
    the Jacobian becomes singular at :math:`a = 0` and the log-determinant :math:`-\infty`).

    * forward: :math:`z = x + \hat u \tanh(a)`, :math:`a = w^\top x + b`,
      :math:`\log|\det J| = \log(1 + \tanh'(a)\, w^\top \hat u)`;
    * inverse: :math:`a` solves the increasing scalar equation
      :math:`a + (w^\top \hat u) \tanh(a) = w^\top z + b`, then :math:`x = z - \hat u \tanh(a)`.

    Args:
        features: number of features ``D``.

    Raises:
        ValueError: for a non-vector event.

    Example:
        >>> import torch
        >>> t = Planar(3).double()
        >>> x = torch.randn(4, 3, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x), ladj.shape
        (True, torch.Size([4]))
    """

    def __init__(self, features: int) -> None:
        super().__init__(features)
        d = _features(self)
        bound = 1 / math.sqrt(d)
        self.u = nn.Parameter(_uniform((d,), bound))
        self.w = nn.Parameter(_uniform((d,), bound))
        self.b = nn.Parameter(_uniform((), bound))

    def constrained(self) -> tuple[Tensor, Tensor]:
        r"""``(û, wᵀû)``: the constrained direction and its product with ``w`` (always ``> -1``)."""
        wu = self.w @ self.u
        m = F.softplus(wu) - (1 - _MARGIN)
        u_hat = self.u + (m - wu) * self.w / (self.w @ self.w).clamp_min(torch.finfo(self.w.dtype).tiny)
        return u_hat, m

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        u_hat, wu = self.constrained()
        t = torch.tanh(x @ self.w + self.b)
        return x + t.unsqueeze(-1) * u_hat, torch.log1p((1 - t * t) * wu)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        u_hat, wu = self.constrained()

        def fn(a: Tensor) -> tuple[Tensor, Tensor]:
            t = torch.tanh(a)
            return a + wu * t, 1 + wu * (1 - t * t)

        a = monotone_inverse(fn, z @ self.w + self.b, who="Planar")
        t = torch.tanh(a)
        return z - t.unsqueeze(-1) * u_hat, -torch.log1p((1 - t * t) * wu)


class Radial(Bijection):
    r"""Radial flow :math:`z = x + \beta (x - x_0)/(\alpha + r)` with :math:`r = \lVert x - x_0\rVert`.

    Invertibility needs :math:`\beta \ge -\alpha`; the parameters are :math:`\alpha =
    \operatorname{softplus}(\hat\alpha) > 0` and :math:`\beta = -\alpha + \epsilon +
    \operatorname{softplus}(\hat\beta)` with the margin :math:`\epsilon = 10^{-3}` (as for
    :class:`Planar`: the Jacobian stays non-singular at the centre in any precision).

    * forward, with :math:`D` features:
      :math:`\log|\det J| = (D - 1)\log(1 + \beta h) + \log(1 + \beta h + \beta h'(r)\, r)`,
      :math:`1 + \beta h + \beta h' r = 1 + \beta\alpha/(\alpha + r)^2`;
    * inverse: the radius solves :math:`r + \beta r/(\alpha + r) = \lVert z - x_0 \rVert` (increasing
      in :math:`r`; solved on the odd extension :math:`r \mapsto r + \beta r / (\alpha + |r|)`),
      then :math:`x = x_0 + (z - x_0)/(1 + \beta h(r))`.

    Args:
        features: number of features ``D``.

    Raises:
        ValueError: for a non-vector event.

    Example:
        >>> import torch
        >>> t = Radial(3).double()
        >>> x = torch.randn(4, 3, dtype=torch.float64)
        >>> torch.allclose(t.inverse(t(x)), x)
        True
    """

    def __init__(self, features: int) -> None:
        super().__init__(features)
        d = _features(self)
        bound = 1 / math.sqrt(d)
        self.center = nn.Parameter(_uniform((d,), bound))
        self.raw_alpha = nn.Parameter(_uniform((), bound))
        self.raw_beta = nn.Parameter(_uniform((), bound))

    def alpha_beta(self) -> tuple[Tensor, Tensor]:
        r"""``(α, β)`` with ``α > 0`` and ``β > -α``."""
        alpha = F.softplus(self.raw_alpha)
        return alpha, F.softplus(self.raw_beta) + _MARGIN - alpha

    def _log_det(self, r: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        bh = beta / (alpha + r)
        d = self.event_shape[0]
        return (d - 1) * torch.log1p(bh) + torch.log1p(bh * alpha / (alpha + r))

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        alpha, beta = self.alpha_beta()
        diff = x - self.center
        r = torch.linalg.vector_norm(diff, dim=-1)
        z = x + (beta / (alpha + r)).unsqueeze(-1) * diff
        return z, self._log_det(r, alpha, beta)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        alpha, beta = self.alpha_beta()
        diff = z - self.center

        def fn(r: Tensor) -> tuple[Tensor, Tensor]:
            s = alpha + r.abs()
            return r + beta * r / s, 1 + beta * alpha / (s * s)

        r = monotone_inverse(fn, torch.linalg.vector_norm(diff, dim=-1), who="Radial")
        x = self.center + diff / (1 + beta / (alpha + r)).unsqueeze(-1)
        return x, -self._log_det(r, alpha, beta)


class Sylvester(Bijection):
    r"""Householder–Sylvester flow :math:`z = x + Q R \tanh(\tilde R Q^\top x + b)` (van den Berg et al. 2018).

    :math:`Q` (``D × M``) is the first ``M`` columns of a product of Householder reflections
    (orthonormal columns), :math:`R, \tilde R` are ``M × M`` upper triangular with diagonals
    :math:`\tanh(\cdot) \in (-1, 1)`, so :math:`R_{ii}\tilde R_{ii} > -1 \ge -1/\sup\tanh'`: the
    invertibility condition of the paper. By Sylvester's determinant identity

    .. math:: \log|\det J| = \sum_{i=1}^{M} \log\big(1 + \tanh'(a_i)\, R_{ii}\tilde R_{ii}\big),
              \qquad a = \tilde R Q^\top x + b.

    Inverse: with :math:`v = Q^\top x` and :math:`s = Q^\top z`, the core
    :math:`s = v + R \tanh(\tilde R v + b)` is upper triangular in :math:`v`, so
    :math:`v_M, \dots, v_1` follow by back-substitution, each from the increasing scalar equation
    :math:`v_i + R_{ii}\tanh(\tilde R_{ii} v_i + c_i) = s_i - \sum_{j>i} R_{ij}\tanh(a_j)`,
    :math:`c_i = b_i + \sum_{k>i}\tilde R_{ik} v_k`; then :math:`x = z + Q(v - s)` (the complement
    of :math:`Q`'s span passes through unchanged).

    Args:
        features: number of features ``D``.
        rank: ``M`` (default ``D``), at most ``D``.
        reflections: Householder reflections building :math:`Q` (default ``D``).

    Raises:
        ValueError: for a non-vector event, ``rank`` outside ``[1, D]`` or ``reflections < 1``.

    Example:
        >>> import torch
        >>> t = Sylvester(4, rank=2).double()
        >>> x = torch.randn(3, 4, dtype=torch.float64)
        >>> torch.allclose(t.inverse(t(x)), x)
        True
    """

    def __init__(self, features: int, *, rank: int | None = None, reflections: int | None = None) -> None:
        super().__init__(features)
        d = _features(self)
        m = d if rank is None else rank
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= d:
            raise ValueError(f"Sylvester: expected rank to be an int in [1, {d}], got {rank!r}")
        k = _reflections(self, reflections, d)
        bound = 1 / math.sqrt(m)
        self.vectors = nn.Parameter(torch.randn(k, d))
        self.upper = nn.Parameter(_uniform((m, m), bound))
        self.upper_tilde = nn.Parameter(_uniform((m, m), bound))
        self.raw_diag = nn.Parameter(_uniform((m,), 1.0))
        self.raw_diag_tilde = nn.Parameter(_uniform((m,), 1.0))
        self.bias = nn.Parameter(_uniform((m,), bound))

    def factors(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(Q, R, R̃)``: ``(D, M)`` orthonormal columns and the two ``(M, M)`` upper-triangular factors."""
        m = self.bias.shape[0]
        q = householder_matrix(self.vectors)[:, :m]
        r = torch.triu(self.upper, 1) + torch.diag(torch.tanh(self.raw_diag))
        r_tilde = torch.triu(self.upper_tilde, 1) + torch.diag(torch.tanh(self.raw_diag_tilde))
        return q, r, r_tilde

    def _log_det(self, a: Tensor, r: Tensor, r_tilde: Tensor) -> Tensor:
        t = torch.tanh(a)
        return torch.log1p((1 - t * t) * (torch.diagonal(r) * torch.diagonal(r_tilde))).sum(-1)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q, r, r_tilde = self.factors()
        a = (x @ q) @ r_tilde.T + self.bias
        return x + torch.tanh(a) @ r.T @ q.T, self._log_det(a, r, r_tilde)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q, r, r_tilde = self.factors()
        s = z @ q
        m = s.shape[-1]
        v: list[Tensor] = [s[..., 0]] * m
        tanh_a: list[Tensor] = [s[..., 0]] * m
        for i in reversed(range(m)):
            later = range(i + 1, m)
            c = self.bias[i] + sum((r_tilde[i, k] * v[k] for k in later), torch.zeros_like(s[..., i]))
            target = s[..., i] - sum((r[i, j] * tanh_a[j] for j in later), torch.zeros_like(s[..., i]))
            rii, rtii = r[i, i], r_tilde[i, i]

            def fn(u: Tensor, c: Tensor = c, rii: Tensor = rii, rtii: Tensor = rtii) -> tuple[Tensor, Tensor]:
                t = torch.tanh(rtii * u + c)
                return u + rii * t, 1 + rii * rtii * (1 - t * t)

            v[i] = monotone_inverse(fn, target, x0=target, who="Sylvester")
            tanh_a[i] = torch.tanh(rtii * v[i] + c)
        v_all = torch.stack(v, -1)
        a = v_all @ r_tilde.T + self.bias
        return z + (v_all - s) @ q.T, -self._log_det(a, r, r_tilde)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.bias.shape[0]}"
