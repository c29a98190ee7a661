r"""Flows for dependent (non-i.i.d.) data: a matrix-normal base over the whole training set.

When samples are related (repeated measures of one individual, relatives, paired stocks), the
latents :math:`Z = [f(x_1), \dots, f(x_n)]^\top \in \mathbb R^{n \times p}` are not independent.
Kirchler et al. model them with a matrix normal base, row covariance
:math:`\Sigma = \lambda I + (1-\lambda) K` for a known relationship matrix :math:`K` (PSD, unit
diagonal) and column covariance :math:`I`:

.. math::
    \log p(X) = -\tfrac{np}{2}\log 2\pi - \tfrac p2 \log\det\Sigma - \tfrac12 \operatorname{tr}(Z^\top \Sigma^{-1} Z)
                + \sum_i \log|\det J_f(x_i)|.

With :math:`K = Q \Lambda Q^\top`, :math:`\log\det\Sigma = \sum_k \log(\lambda + (1-\lambda)\Lambda_k)`
and the trace is computed on :math:`Q^\top Z`. For mini-batches :math:`B` (:math:`|B| = b \ge 2`,
drawn uniformly without replacement) with :math:`A = \Sigma^{-1}`, the per-sample terms

.. math::
    \ell_i = -\tfrac12\Big[A_{ii}\|z_i\|^2 + \tfrac{n-1}{b-1}\sum_{j\in B, j\ne i} A_{ij} z_i^\top z_j\Big]
             - \tfrac p2 \log 2\pi - \tfrac{p}{2n}\log\det\Sigma + \log|\det J_f(x_i)|

have a batch mean whose expectation is exactly :math:`\log p(X)/n` (so their gradient is unbiased).
This needs the **global index** of each sample: data loaders yield ``(x, index)``. :math:`\lambda`
is learned jointly (it is a parameter) and/or set by the full-batch update :meth:`MatrixNormal.update_lambda`.
With :math:`K = I` everything reduces exactly to the i.i.d. flow.

References:
    Kirchler, Lippert, Kloft (2023), "Training Normalizing Flows from Dependent Data", ICML,
    arXiv:2209.14933.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from flows._validation import check_event
from flows.architectures.registry import register
from flows.flow import Flow

__all__ = ["DependentFlow", "MatrixNormal"]


def _eigh_relationship(relationship: Tensor, who: str) -> tuple[Tensor, Tensor]:
    if (
        not isinstance(relationship, Tensor)
        or relationship.dim() != 2
        or relationship.shape[0] != relationship.shape[1]
    ):
        shape = tuple(relationship.shape) if isinstance(relationship, Tensor) else type(relationship).__name__
        raise ValueError(f"{who}: expected a square (n, n) relationship matrix, got {shape}")
    k = relationship.to(torch.float64)
    if not torch.allclose(k, k.T, atol=1e-10):
        raise ValueError(f"{who}: expected a symmetric relationship matrix")
    eigenvalues, eigenvectors = torch.linalg.eigh(k)
    if float(eigenvalues.min()) < -1e-8 * max(1.0, float(eigenvalues.abs().max())):
        smallest = float(eigenvalues.min())
        raise ValueError(f"{who}: expected a positive semi-definite relationship matrix, got eigenvalue {smallest:.3g}")
    return eigenvalues.clamp_min(0), eigenvectors


class MatrixNormal(nn.Module):
    r"""Matrix-normal base over a set of ``n`` latents, row covariance :math:`\lambda I + (1-\lambda)K`.

    Args:
        features: latent dimension ``p``.
        relationship: the training set's relationship matrix ``K`` (``(n, n)``, PSD, usually unit
            diagonal), rows in the order of the global sample indices.
        lam: initial :math:`\lambda \in (0, 1)`.
        learn_lambda: make :math:`\lambda` a parameter (through a logit) rather than a buffer.

    Raises:
        ValueError: for a non-square, asymmetric or indefinite ``relationship``, or ``lam`` outside (0, 1).

    Example:
        >>> import torch
        >>> base = MatrixNormal(2, torch.eye(4))
        >>> z = torch.randn(4, 2)
        >>> iid = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum()
        >>> torch.allclose(base.log_prob_full(z), iid.double())
        True
    """

    def __init__(self, features: int, relationship: Tensor, *, lam: float = 0.5, learn_lambda: bool = True) -> None:
        super().__init__()
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 < lam < 1.0:
            raise ValueError(f"MatrixNormal: expected 0 < lam < 1, got {lam!r}")
        self.features = features
        eigenvalues, eigenvectors = _eigh_relationship(relationship, "MatrixNormal")
        self.register_buffer("eigenvalues", eigenvalues)
        self.register_buffer("eigenvectors", eigenvectors)
        logit = torch.tensor(math.log(lam / (1 - lam)), dtype=torch.float64)
        if learn_lambda:
            self.lam_logit = nn.Parameter(logit)
        else:
            self.register_buffer("lam_logit", logit)

    @property
    def n(self) -> int:
        """Number of samples in the training set."""
        return self.eigenvalues.shape[0]

    @property
    def lam(self) -> Tensor:
        r""":math:`\lambda = \sigma(\text{logit})` (0-d tensor)."""
        return torch.sigmoid(self.lam_logit)

    def _spectrum(self, eigenvalues: Tensor) -> Tensor:
        lam = self.lam
        return lam + (1 - lam) * eigenvalues

    def log_prob_full(self, z: Tensor, relationship: Tensor | None = None) -> Tensor:
        """Joint log-density of all ``n`` latents ``z`` (``(n, p)``, rows in index order), a scalar.

        Args:
            z: latents of the whole set.
            relationship: another set's ``K`` (e.g. a test set); default: the training ``K``.
        """
        if relationship is None:
            eigenvalues, eigenvectors = self.eigenvalues, self.eigenvectors
        else:
            eigenvalues, eigenvectors = _eigh_relationship(relationship, "MatrixNormal")
            eigenvalues, eigenvectors = eigenvalues.to(self.eigenvalues), eigenvectors.to(self.eigenvectors)
        n, p = eigenvalues.shape[0], self.features
        if z.shape != (n, p):
            raise ValueError(f"MatrixNormal: expected latents of shape ({n}, {p}), got {tuple(z.shape)}")
        spectrum = self._spectrum(eigenvalues)
        rotated = eigenvectors.T @ z.to(eigenvectors.dtype)
        quad = (rotated.square().sum(-1) / spectrum).sum()
        return -0.5 * n * p * math.log(2 * math.pi) - 0.5 * p * spectrum.log().sum() - 0.5 * quad

    def log_prob_batch(self, z: Tensor, index: Tensor) -> Tensor:
        """Per-sample terms ``(b,)`` of the unbiased mini-batch estimator (see the module docstring).

        Args:
            z: latents of a batch, ``(b, p)`` with ``b >= 2``.
            index: global indices of the batch's samples, ``(b,)``, distinct.

        Raises:
            ValueError: for a batch of fewer than two samples or indices out of range.
        """
        b = z.shape[0]
        if z.dim() != 2 or z.shape[1] != self.features:
            raise ValueError(f"MatrixNormal: expected latents of shape (b, {self.features}), got {tuple(z.shape)}")
        if index.shape != (b,):
            raise ValueError(f"MatrixNormal: expected {b} indices, got shape {tuple(index.shape)}")
        if b < 2:
            raise ValueError("MatrixNormal: the mini-batch estimator needs at least 2 samples per batch")
        if int(index.min()) < 0 or int(index.max()) >= self.n:
            raise ValueError(
                f"MatrixNormal: expected indices in [0, {self.n}), got [{int(index.min())}, {int(index.max())}]"
            )
        n, p = self.n, self.features
        spectrum = self._spectrum(self.eigenvalues)
        rows = self.eigenvectors[index]  # (b, n)
        precision = (rows / spectrum) @ rows.T  # A restricted to the batch, (b, b)
        gram = z.to(rows.dtype) @ z.to(rows.dtype).T
        products = precision * gram
        diagonal = products.diagonal()
        off = products.sum(-1) - diagonal
        quad = diagonal + (n - 1) / (b - 1) * off
        const = -0.5 * p * math.log(2 * math.pi) - 0.5 * p / n * spectrum.log().sum()
        return (-0.5 * quad + const).to(z.dtype)

    @torch.no_grad()
    def update_lambda(self, z: Tensor, *, tol: float = 1e-8) -> float:
        r"""Set :math:`\lambda` to its full-batch maximum-likelihood value given all latents ``z`` (``(n, p)``).

        A bounded scalar optimisation of :math:`\tfrac p2\sum_k\log d_k + \tfrac12\sum_k r_k/d_k`,
        :math:`d_k = \lambda + (1-\lambda)\Lambda_k`, :math:`r_k = \|(Q^\top Z)_k\|^2`. Returns the new value.
        """
        from scipy.optimize import minimize_scalar

        if z.shape != (self.n, self.features):
            raise ValueError(
                f"MatrixNormal: expected latents of shape ({self.n}, {self.features}), got {tuple(z.shape)}"
            )
        r = (self.eigenvectors.T @ z.to(self.eigenvectors.dtype)).square().sum(-1).cpu().numpy()
        eig = self.eigenvalues.cpu().numpy()
        p = self.features

        def objective(lam: float) -> float:
            d = lam + (1 - lam) * eig
            return float(0.5 * p * (torch.from_numpy(d).log().sum()) + 0.5 * (r / d).sum())

        result = minimize_scalar(objective, bounds=(1e-6, 1 - 1e-6), method="bounded", options={"xatol": tol})
        lam = float(result.x)
        self.lam_logit.fill_(math.log(lam / (1 - lam)))
        return lam


@register
class DependentFlow(nn.Module):
    r"""A flow's transform with a :class:`MatrixNormal` base over the training set.

    Args:
        flow: a flow whose transform maps data to ``p``-dimensional latents (its own base is not used).
        relationship: the training set's relationship matrix ``K`` (``(n, n)``).
        lam: initial :math:`\lambda`.
        learn_lambda: learn :math:`\lambda` by gradient (it can also be set by :meth:`update_lambda`).

    Example:
        >>> import torch
        >>> from flows import RealNVP
        >>> model = DependentFlow(RealNVP(2, transforms=2, hidden=(8,)), torch.eye(6))
        >>> x, index = torch.randn(3, 2), torch.tensor([0, 4, 5])
        >>> model.log_prob_batch(x, index).shape
        torch.Size([3])
    """

    #: Tensor arguments whose content the weights hold (``K``'s eigendecomposition is a buffer): a model
    #: file records only their shape, and a rebuild passes zeros of that shape before loading the weights.
    rebuilt_from_weights = ("relationship",)

    def __init__(self, flow: Flow, relationship: Tensor, *, lam: float = 0.5, learn_lambda: bool = True) -> None:
        super().__init__()
        # what flows.save_model writes (a Flow records its arguments itself; this model is a plain Module)
        object.__setattr__(self, "_arguments", ((flow, relationship), {"lam": lam, "learn_lambda": learn_lambda}))
        if len(flow.transform.event_shape_out) != 1:
            raise ValueError("DependentFlow: expected a flow over vectors (event shape (p,))")
        self.flow = flow
        self.base = MatrixNormal(flow.transform.event_shape_out[0], relationship, lam=lam, learn_lambda=learn_lambda)

    def _latent(self, x: Tensor) -> tuple[Tensor, Tensor]:
        check_event(x, self.flow.transform.event_shape, "DependentFlow")
        return self.flow.transform.forward_and_log_det(x)

    def log_prob_batch(self, x: Tensor, index: Tensor) -> Tensor:
        """Per-sample unbiased terms for a batch ``x`` (``(b, p)``) with global indices ``index``; loss = −mean."""
        z, ladj = self._latent(x)
        return self.base.log_prob_batch(z, index) + ladj

    def log_prob_full(self, x: Tensor, relationship: Tensor | None = None) -> Tensor:
        """Joint log-density of a whole set (the training set, or another set with its own ``relationship``)."""
        z, ladj = self._latent(x)
        return self.base.log_prob_full(z, relationship) + ladj.sum().to(torch.float64)

    @torch.no_grad()
    def update_lambda(self, x: Tensor, *, chunk: int = 4096) -> float:
        r"""Full-batch :math:`\lambda` update from the latents of the whole training set ``x`` (index order)."""
        z = torch.cat([self.flow.transform(part) for part in x.split(chunk)])
        return self.base.update_lambda(z)
