r"""Orthogonal and orthogonally factored linear layers: :class:`Householder`, :class:`QRLinear`, :class:`SVDLinear`.

A Householder reflection :math:`H(v) = I - 2 v v^\top / \lVert v \rVert^2` is orthogonal and its own
inverse; a product of :math:`K` of them,

.. math:: Q = H(v_1) H(v_2) \cdots H(v_K),

reaches every orthogonal matrix (of determinant :math:`(-1)^K`) for :math:`K = D` and costs
:math:`O(K D)` per vector. Orthogonal factors give linear layers whose log-determinant is read
off a diagonal and whose inverse is a transpose and (for QR) a triangular solve, with no
:math:`O(D^3)` factorisation at any step of training.

References:
    Tomczak, Welling (2016), "Improving Variational Auto-Encoders using Householder Flow",
    arXiv:1611.09630. Householder (1958), "Unitary Triangularization of a Nonsymmetric Matrix",
    Journal of the ACM 5(4). Hoogeboom, van den Berg, Welling (2019), "Emerging Convolutions for
    Generative Normalizing Flows", ICML, arXiv:1901.11137 (QR-factored linear maps). Zhang, E, Gao
    (2018), "Stabilizing Gradients for Deep Neural Networks via Efficient SVD Parameterization",
    ICML, arXiv:1803.09327 (SVD with Householder factors).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows._validation import check_count
from flows.bijections.base import Bijection

__all__ = ["Householder", "QRLinear", "SVDLinear", "householder_matrix"]


def householder_matrix(vectors: Tensor) -> Tensor:
    r"""The orthogonal matrix :math:`Q = H(v_1) \cdots H(v_K)` of the rows of ``vectors`` (``(K, D)`` → ``(D, D)``).

    Built by applying the reflections to the identity, :math:`O(K D^2)`.

    Example:
        >>> import torch
        >>> q = householder_matrix(torch.randn(3, 4))
        >>> torch.allclose(q @ q.T, torch.eye(4), atol=1e-6)
        True
    """
    unit = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(vectors.dtype).tiny)
    q = torch.eye(vectors.shape[-1], dtype=vectors.dtype, device=vectors.device)
    for v in unit.flip(0):  # Q = H_1 (H_2 (... (H_K I)))
        q = q - 2 * torch.outer(v, v @ q)
    return q


def _features(layer: Bijection) -> int:
    """The vector size of ``layer``'s event, refusing events of more than one axis."""
    name = type(layer).__name__
    if len(layer.event_shape) != 1 or layer.event_shape[0] is None:
        raise ValueError(
            f"{name}: expected a vector event (features: int), got {tuple(layer.event_shape)}; "
            "flatten the event first (flows.Flatten)"
        )
    return layer.event_shape[0]


def _reflections(layer: Bijection, reflections: int | None, features: int) -> int:
    k = features if reflections is None else reflections
    check_count(type(layer).__name__, "reflections", k)
    return k


def _random_vectors(k: int, d: int, generator: torch.Generator | None) -> Tensor:
    return torch.randn(k, d, generator=generator)


class Householder(Bijection):
    r"""Volume-preserving orthogonal map :math:`z = Q x`, :math:`Q` a product of Householder reflections.

    * forward: :math:`z = Q x` with :math:`Q = H(v_1)\cdots H(v_K)`, :math:`\log|\det J| = 0`;
    * inverse: :math:`x = Q^\top z` (exact: each reflection is its own inverse).

    The vectors :math:`v_k` are unconstrained (normalised inside; a zero vector is guarded by the
    smallest positive float). ``K = features`` reflections can represent any orthogonal matrix
    of determinant :math:`(-1)^K`.

    References:
        Tomczak, Welling (2016), "Improving Variational Auto-Encoders using Householder Flow",
        arXiv:1611.09630.

    Args:
        features: number of features ``D``.
        reflections: number of reflections ``K`` (default ``D``).
        generator: random generator for the initial vectors (standard normal).

    Raises:
        ValueError: for a non-vector event or ``reflections < 1``.

    Example:
        >>> import torch
        >>> t = Householder(4, reflections=2)
        >>> x = torch.randn(3, 4)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x, atol=1e-6), ladj.tolist()
        (True, [0.0, 0.0, 0.0])
    """

    def __init__(
        self, features: int, reflections: int | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__(features)
        d = _features(self)
        self.vectors = nn.Parameter(_random_vectors(_reflections(self, reflections, d), d, generator))

    def matrix(self) -> Tensor:
        """The orthogonal matrix ``Q`` (``(D, D)``)."""
        return householder_matrix(self.vectors)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = x @ self.matrix().T
        return z, x.new_zeros(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return z @ self.matrix(), z.new_zeros(self.batch_shape(z))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, reflections={self.vectors.shape[0]}"


class QRLinear(Bijection):
    r"""Invertible linear layer :math:`z = Q R x + b`: Householder-orthogonal :math:`Q`, upper-triangular :math:`R`.

    :math:`R = \operatorname{triu}(U, 1) + \operatorname{diag}(e^{\ell})` has a positive diagonal, so

    * forward: :math:`z = Q R x + b`, :math:`\log|\det J| = \sum_i \ell_i` (:math:`|\det Q| = 1`);
    * inverse: :math:`x = R^{-1} Q^\top (z - b)` by one triangular solve.

    At initialisation :math:`R = I` and :math:`W = Q` is a random rotation/reflection.

    References:
        Tomczak, Welling (2016), "Improving Variational Auto-Encoders using Householder Flow",
        arXiv:1611.09630. Hoogeboom, van den Berg, Welling (2019), "Emerging Convolutions for
        Generative Normalizing Flows", ICML, arXiv:1901.11137 (the QR parameterisation).

    Args:
        features: number of features ``D``.
        reflections: number of Householder reflections in ``Q`` (default ``D``).
        bias: learn a bias ``b``.
        generator: random generator for the initial reflection vectors.

    Raises:
        ValueError: for a non-vector event or ``reflections < 1``.

    Example:
        >>> import torch
        >>> t = QRLinear(3)
        >>> x = torch.randn(5, 3)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x, atol=1e-5), ladj.shape
        (True, torch.Size([5]))
    """

    def __init__(
        self,
        features: int,
        *,
        reflections: int | None = None,
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(features)
        d = _features(self)
        self.vectors = nn.Parameter(_random_vectors(_reflections(self, reflections, d), d, generator))
        self.upper = nn.Parameter(torch.zeros(d, d))
        self.log_diag = nn.Parameter(torch.zeros(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def triangular(self) -> Tensor:
        """The upper-triangular factor ``R`` (``(D, D)``, positive diagonal)."""
        return torch.triu(self.upper, 1) + torch.diag(self.log_diag.exp())

    def weight(self) -> Tensor:
        """The matrix ``W = Q R`` (``(D, D)``)."""
        return householder_matrix(self.vectors) @ self.triangular()

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return F.linear(x, self.weight(), self.bias), self.log_diag.sum().expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows = z if self.bias is None else z - self.bias
        rows = rows @ householder_matrix(self.vectors)  # (Qᵀ r)ᵀ = rᵀ Q
        flat = rows.reshape(-1, rows.shape[-1])
        x = torch.linalg.solve_triangular(self.triangular().T, flat, upper=False, left=False)  # x Rᵀ = rows
        return x.reshape(rows.shape), (-self.log_diag.sum()).expand(self.batch_shape(z))


class SVDLinear(Bijection):
    r"""Invertible linear layer :math:`z = U \operatorname{diag}(e^{\ell}) V^\top x + b`, orthogonal :math:`U, V`.

    * forward: :math:`z = U \Sigma V^\top x + b`, :math:`\log|\det J| = \sum_i \ell_i`;
    * inverse: :math:`x = V \Sigma^{-1} U^\top (z - b)` (exact: transposes and a diagonal).

    The singular values :math:`e^{\ell}` are explicit, so the condition number
    :math:`e^{\max \ell - \min \ell}` is visible (and can be regularised) during training.

    References:
        Tomczak, Welling (2016), "Improving Variational Auto-Encoders using Householder Flow",
        arXiv:1611.09630. Zhang, E, Gao (2018), "Stabilizing Gradients for Deep Neural Networks
        via Efficient SVD Parameterization", ICML, arXiv:1803.09327.

    Args:
        features: number of features ``D``.
        reflections: number of Householder reflections in each of ``U`` and ``V`` (default ``D``).
        bias: learn a bias ``b``.
        generator: random generator for the initial reflection vectors.

    Raises:
        ValueError: for a non-vector event or ``reflections < 1``.

    Example:
        >>> import torch
        >>> t = SVDLinear(3, reflections=2)
        >>> x = torch.randn(5, 3)
        >>> torch.allclose(t.inverse(t(x)), x, atol=1e-5)
        True
    """

    def __init__(
        self,
        features: int,
        *,
        reflections: int | None = None,
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(features)
        d = _features(self)
        k = _reflections(self, reflections, d)
        self.left = nn.Parameter(_random_vectors(k, d, generator))
        self.right = nn.Parameter(_random_vectors(k, d, generator))
        self.log_singular = nn.Parameter(torch.zeros(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def weight(self) -> Tensor:
        """The matrix ``W = U Σ Vᵀ`` (``(D, D)``)."""
        u, v = householder_matrix(self.left), householder_matrix(self.right)
        return (u * self.log_singular.exp()) @ v.T

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return F.linear(x, self.weight(), self.bias), self.log_singular.sum().expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows = z if self.bias is None else z - self.bias
        u, v = householder_matrix(self.left), householder_matrix(self.right)
        inverse = (v * (-self.log_singular).exp()) @ u.T  # V Σ⁻¹ Uᵀ
        return F.linear(rows, inverse), (-self.log_singular.sum()).expand(self.batch_shape(z))
