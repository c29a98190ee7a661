r"""Learnable invertible linear maps with cheap log-determinants: :class:`LULinear`.

References:
    Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS,
    arXiv:1807.03039 (the LU parameterisation). Durkan, Bekasov, Murray, Papamakarios (2019),
    "Neural Spline Flows", NeurIPS, arXiv:1906.04032 (LU linear layers between couplings).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection

__all__ = ["LULinear"]


class LULinear(Bijection):
    r"""Invertible linear layer :math:`z = W x + b` with :math:`W = P L (U + \operatorname{diag}(s))`.

    :math:`P` is a fixed permutation, :math:`L` unit lower-triangular, :math:`U` strictly
    upper-triangular and :math:`s = \operatorname{sign} \cdot e^{\ell}` a diagonal with a fixed
    sign and learnable log-magnitude :math:`\ell`, so :math:`W` is invertible by construction and

    * forward: :math:`z = W x + b`, :math:`\log|\det J| = \sum_i \ell_i` (O(D), no determinant);
    * inverse: :math:`x = W^{-1}(z - b)` by two triangular solves (O(D²) per sample).

    Args:
        features: number of features ``D`` (the axis the matrix acts on); the event is the vector
            ``(D,)``, and an event with more axes is refused (``ValueError``).
        init: ``"identity"`` (``W = I``) or ``"orthogonal"`` (the LU factors of a random rotation,
            as in Glow).
        bias: learn a bias ``b``.
        generator: random generator for the orthogonal initialisation.

    Example:
        >>> import torch
        >>> t = LULinear(3, init="orthogonal")
        >>> x = torch.randn(4, 3)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(t.inverse(z), x, atol=1e-5), torch.allclose(ladj, torch.zeros(4), atol=1e-5)
        (True, True)
    """

    _spatial = 0  # trailing event dims the same matrix is applied over (1x1 convolutions)

    def __init__(
        self,
        features: int | Sequence[int | None],
        *,
        init: str = "identity",
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(features)
        name = type(self).__name__
        if len(self.event_shape) != 1 + self._spatial:
            # The matrix acts on one axis (and is shared over `_spatial` trailing ones): applying it
            # to an event with more axes would mix memory chunks of the flattened event instead.
            expected = "(features,)" if not self._spatial else f"(channels{', *' * self._spatial})"
            raise ValueError(
                f"{name}: expected an event of shape {expected} ({1 + self._spatial} axis/axes), got "
                f"{tuple(self.event_shape)}; flatten the event first (flows.Flatten) or use a layer for that shape"
            )
        n = self.event_shape[0]
        if n is None:
            raise ValueError(f"{name}: the number of features/channels must be given")
        if init == "identity":
            perm, lower, upper = torch.arange(n), torch.eye(n), torch.eye(n)
        elif init == "orthogonal":
            q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
            p, lower, upper = torch.linalg.lu(q)
            perm = p.argmax(dim=1)
            lower, upper = lower.float(), upper.float()
        else:
            raise ValueError(f"{type(self).__name__}: expected init 'identity' or 'orthogonal', got {init!r}")
        diag = torch.diagonal(upper)
        self.register_buffer("permutation", perm)
        self.register_buffer("sign", torch.sign(diag))
        self.lower = nn.Parameter(torch.tril(lower, -1))
        self.upper = nn.Parameter(torch.triu(upper, 1))
        self.log_diag = nn.Parameter(diag.abs().log())
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def _factors(self) -> tuple[Tensor, Tensor]:
        eye = torch.eye(self.lower.shape[0], dtype=self.lower.dtype, device=self.lower.device)
        lower = torch.tril(self.lower, -1) + eye
        upper = torch.triu(self.upper, 1) + torch.diag(self.sign * self.log_diag.exp())
        return lower, upper

    def weight(self) -> Tensor:
        """The matrix ``W = P L U`` (``(D, D)``), rebuilt from the current parameters."""
        lower, upper = self._factors()
        return (lower @ upper)[self.permutation]

    def log_abs_det(self) -> Tensor:
        """``log|det W| = Σ ℓ_i`` (a scalar)."""
        return self.log_diag.sum()

    def _to_rows(self, x: Tensor) -> tuple[Tensor, torch.Size]:
        """Move the matrix axis last and flatten the rest: ``(*, D)`` rows."""
        if not self._spatial:
            return x, x.shape
        moved = x.movedim(x.dim() - len(self.event_shape), -1)
        return moved.reshape(-1, moved.shape[-1]), moved.shape

    def _from_rows(self, rows: Tensor, moved_shape: torch.Size) -> Tensor:
        if not self._spatial:
            return rows
        return rows.reshape(moved_shape).movedim(-1, len(moved_shape) - 1 - self._spatial)

    def _multiplicity(self, x: Tensor) -> int:
        return math.prod(x.shape[x.dim() - self._spatial :]) if self._spatial else 1

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows, shape = self._to_rows(x)
        n = self.lower.shape[0]
        flat = rows.reshape(-1, n)
        if flat.shape[0] < n:
            # Fewer rows than features: applying U, L and P in turn (O(B n²)) beats forming W (O(n³)).
            lower, upper = self._factors()
            out = (flat @ upper.T @ lower.T)[:, self.permutation]
            out = out if self.bias is None else out + self.bias
        else:
            out = F.linear(flat, self.weight(), self.bias)
        z = self._from_rows(out.reshape(rows.shape), shape)
        ladj = self.log_abs_det() * self._multiplicity(x)
        return z, ladj.expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows, shape = self._to_rows(z)
        if self.bias is not None:
            rows = rows - self.bias
        lower, upper = self._factors()
        # Rows r = W x, i.e. x^T (P L U)^T = r^T. Undo P, then L, then U (right-side triangular solves).
        flat = rows.reshape(-1, rows.shape[-1])
        flat = flat[:, torch.argsort(self.permutation)]
        flat = torch.linalg.solve_triangular(lower.T, flat, upper=True, left=False, unitriangular=True)
        flat = torch.linalg.solve_triangular(upper.T, flat, upper=False, left=False)
        x = self._from_rows(flat.reshape(rows.shape), shape)
        ladj = -self.log_abs_det() * self._multiplicity(z)
        return x, ladj.expand(self.batch_shape(z))
