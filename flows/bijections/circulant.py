r"""Circulant–diagonal invertible linear layers (CDFlow): exact, O(n log n), for vectors and image channels.

The weight is an alternating product of :math:`m` diagonal and :math:`m - 1` circulant matrices,

.. math:: W = D_1 C_1 D_2 C_2 \cdots C_{m-1} D_m,
          \qquad D_j = \operatorname{diag}(d_j), \quad C_j = \operatorname{circ}(c_j),

with real :math:`d_j, c_j \in \mathbb R^n` and :math:`\operatorname{circ}(c)_{ik} = c_{(i-k) \bmod n}`.
A circulant is diagonalised by the DFT, :math:`C = F^{-1} \operatorname{diag}(\hat c) F` with
:math:`\hat c = F c`: forward and inverse cost :math:`O(m\, n \log n)`, and
:math:`\log|\det W| = \sum_{j,i} \log|d_{j,i}| + \sum_j \sum_{k} \log|\hat c_{j,k}|` costs :math:`O(m n)`.

Real parameters and the real FFT. A real :math:`c` has a Hermitian spectrum
(:math:`\hat c_{n-k} = \overline{\hat c_k}`, :math:`\hat c_0` and, for even :math:`n`,
:math:`\hat c_{n/2}` real), so only the half spectrum ``rfft(c)`` (:math:`\lfloor n/2 \rfloor + 1`
bins) is stored or computed and every product runs through ``torch.fft.rfft``/``irfft``; the full
log-determinant is the half-spectrum sum with weight 2 on the bins that stand for a conjugate pair,

.. math:: \sum_{k=0}^{n-1} \log|\hat c_k| = \log|\hat c_0| + 2 \sum_{0<k<n/2} \log|\hat c_k|
          + [n \text{ even}] \log|\hat c_{n/2}|.

A free complex spectrum followed by ``.real`` is **not** a circulant with that spectrum, and
:math:`\sum \log|\hat c|` is then not its log-determinant (``docs/circulant.md``): this module never does that.

References:
    Feng, Liao (2025), "CDFlow: Building Invertible Layers with Circulant and Diagonal Matrices",
    NeurIPS, arXiv:2510.25323. Huhtanen, Perämäki (2015), "Factoring matrices into the product of
    circulant and diagonal matrices", J. Fourier Anal. Appl. 21 (generic matrices are such products).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.bijections.base import Bijection

__all__ = ["CirculantDiagonal", "CirculantDiagonal2d"]

_PARAMETERIZATIONS = ("kernel", "spectrum")
_INITS = ("identity", "orthogonal")
_METHOD_CHOICES = ("auto", "fft", "dense")
_AUTO_DENSE_MAX = 512  # "auto" materialises W for n up to this ...
_AUTO_DENSE_ROWS = 8  # ... when there are at least this many rows (vectors or pixels) per feature


def _pair_weights(n: int) -> Tensor:
    """Weights of the ``n // 2 + 1`` half-spectrum bins in the full-spectrum sum (1 for self-conjugate bins, else 2)."""
    weights = torch.full((n // 2 + 1,), 2.0)
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0
    return weights


class CirculantDiagonal(Bijection):
    r"""Invertible linear layer :math:`z = W x + b`, :math:`W = D_1 C_1 D_2 \cdots C_{m-1} D_m` (CDFlow).

    The :math:`m` diagonals are :math:`d_j = \sigma_j \odot e^{\ell_j}` with a fixed sign
    :math:`\sigma_j \in \{\pm 1\}^n` (buffer) and a learnable log-magnitude :math:`\ell_j`. The
    :math:`m-1` circulants are real matrices given either by

    * ``parameterization="kernel"`` (default, as in the paper): a learnable real first column
      :math:`c_j \in \mathbb R^n`, with :math:`\hat c_j` = ``rfft(c_j)``; or
    * ``parameterization="spectrum"``: the half spectrum in polar form, a learnable log-modulus for
      each of the :math:`\lfloor n/2\rfloor + 1` bins and a phase for each complex bin (again
      :math:`n` real numbers), with a fixed sign on the real bins; :math:`c_j` = ``irfft`` of it.
      Every :math:`|\hat c_{j,k}| > 0`, so :math:`W` is invertible for any parameter values and the
      log-determinant needs no FFT.

    Maps (with :math:`\mathcal F` = ``rfft`` and :math:`\mathcal F^{-1}` = ``irfft`` along the feature axis):

    * forward: :math:`u \leftarrow d_m \odot x`, then for :math:`j = m-1, \dots, 1`:
      :math:`u \leftarrow d_j \odot \mathcal F^{-1}(\hat c_j \odot \mathcal F u)`; :math:`z = u + b`;
    * inverse: the same steps undone in reverse order with :math:`1/d_j` and :math:`1/\hat c_j`;
    * :math:`\log|\det J| = \sum_{j,i} \ell_{j,i} + \sum_j \sum_k w_k \log|\hat c_{j,k}|`, with
      :math:`w_k = 1` for the real bins and 2 otherwise (the conjugate pair).

    Costs per vector: :math:`O(m\, n \log n)` both ways, :math:`O(m n)` for the log-determinant
    given the spectra; :math:`(2m - 1) n` parameters (plus ``n`` for the bias).

    ``method`` chooses how the map is applied (the log-determinant is always the :math:`O(mn)` sum):

    * ``"fft"``: the steps above, :math:`O(m\, n \log n)` per row;
    * ``"dense"``: materialise :math:`W` (or :math:`W^{-1}`) by running those steps on the identity
      (:math:`O(m\, n^2 \log n)` once per call, never an :math:`O(n^3)` inversion or determinant),
      then one matrix product (a :math:`1\times 1` convolution for images) per call. With many rows
      per feature and moderate ``n`` this is faster on CPU, where FFTs of short rows (and along the
      strided channel axis of images) are slow;
    * ``"auto"`` (default): ``"dense"`` when ``n <= 512`` and there are at least ``8 n`` rows
      (batch × pixels), else ``"fft"``.

    ``init="identity"`` starts at :math:`W = I` (:math:`c_j = e_0`, :math:`d_j = 1`);
    ``init="orthogonal"`` starts at a random orthogonal :math:`W` that mixes all features
    (random signs on the diagonals, unit-modulus spectra with random phases).

    With ``cache=True`` the derived quantities (signed diagonals, spectra and their inverses, the
    log-determinant) are reused between calls in eval mode when no gradient with respect to the
    parameters is being recorded. The cache is keyed on every parameter's and buffer's storage,
    dtype, device and in-place version counter, and dropped on ``.to()``/``.double()``/
    ``load_state_dict`` and mode changes, so an optimizer step or a state-dict load can never leave
    it stale. Writing through ``param.data`` bypasses PyTorch's version counters: call
    :meth:`clear_cache` after doing that.

    Args:
        features: number of features ``n`` (any ``n >= 1``, odd or even).
        factors: number of diagonal factors ``m >= 2`` (there are ``m - 1`` circulants).
        parameterization: ``"kernel"`` or ``"spectrum"`` (see above).
        init: ``"identity"`` or ``"orthogonal"``.
        bias: learn a bias ``b``.
        method: ``"auto"``, ``"fft"`` or ``"dense"`` (see above).
        cache: reuse derived quantities in eval mode (see above).
        generator: random generator for ``init="orthogonal"``.

    Raises:
        TypeError: if ``features`` or ``factors`` is not an int.
        ValueError: for ``features < 1``, ``factors < 2`` or an unknown option.

    References:
        Feng, Liao (2025), "CDFlow: Building Invertible Layers with Circulant and Diagonal
        Matrices", NeurIPS, arXiv:2510.25323.

    Example:
        >>> import torch
        >>> t = CirculantDiagonal(6, factors=3, init="orthogonal").double()
        >>> x = torch.randn(4, 6, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> torch.allclose(z, x @ t.weight().T + t.bias), torch.allclose(t.inverse(z), x)
        (True, True)
        >>> torch.allclose(ladj, torch.linalg.slogdet(t.weight()).logabsdet.expand(4))
        True
    """

    _spatial = 0  # trailing event dims the same matrix is applied over (1x1 convolutions)

    def __init__(
        self,
        features: int,
        *,
        factors: int = 2,
        parameterization: str = "kernel",
        init: str = "identity",
        bias: bool = True,
        method: str = "auto",
        cache: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        name = type(self).__name__
        what = "channels" if self._spatial else "features"
        if isinstance(features, bool) or not isinstance(features, int):
            raise TypeError(f"{name}: expected {what} to be an int >= 1, got {features!r}")
        if features < 1:
            raise ValueError(f"{name}: expected {what} >= 1, got {features}")
        if isinstance(factors, bool) or not isinstance(factors, int):
            raise TypeError(f"{name}: expected factors to be an int >= 2, got {factors!r}")
        if factors < 2:
            raise ValueError(
                f"{name}: expected factors >= 2 (m diagonals and m - 1 circulants; m = 1 is a diagonal, "
                f"use Affine), got {factors}"
            )
        if parameterization not in _PARAMETERIZATIONS:
            raise ValueError(f"{name}: expected parameterization 'kernel' or 'spectrum', got {parameterization!r}")
        if init not in _INITS:
            raise ValueError(f"{name}: expected init 'identity' or 'orthogonal', got {init!r}")
        if method not in _METHOD_CHOICES:
            raise ValueError(f"{name}: expected method 'auto', 'fft' or 'dense', got {method!r}")
        super().__init__((features,) + (None,) * self._spatial)
        n, m = features, factors
        bins = n // 2 + 1
        self.features, self.factors, self.parameterization = n, m, parameterization
        self.method, self.cache = method, cache
        self._cache: dict[str, Tensor] = {}
        self._cache_key: tuple | None = None

        real = _pair_weights(n) == 1  # the real bins of a real signal: DC and, for even n, Nyquist
        if init == "identity":
            diag_sign = torch.ones(m, n)
            phases = torch.zeros(m - 1, bins, dtype=torch.float64)
            spectrum_sign = torch.ones(m - 1, bins)
        else:
            diag_sign = torch.randint(0, 2, (m, n), generator=generator).mul(2).sub(1).float()
            phases = (2 * torch.rand(m - 1, bins, generator=generator, dtype=torch.float64) - 1) * math.pi
            phases[:, real] = 0.0
            spectrum_sign = torch.randint(0, 2, (m - 1, bins), generator=generator).mul(2).sub(1).float()
            spectrum_sign[:, ~real] = 1.0
        self.register_buffer("diag_sign", diag_sign)
        self.log_diag = nn.Parameter(torch.zeros(m, n))
        if parameterization == "kernel":  # c = irfft of the unit-modulus spectrum (exactly e_0 for the identity)
            spectrum = torch.polar(torch.ones_like(phases), phases) * spectrum_sign.double()
            kernel = torch.fft.irfft(spectrum, n=n) if init == "orthogonal" else torch.eye(1, n).expand(m - 1, n)
            self.kernel = nn.Parameter(kernel.float().clone())
        else:
            self.register_buffer("spectrum_sign", spectrum_sign)
            self.log_modulus = nn.Parameter(torch.zeros(m - 1, bins))
            self.phase = nn.Parameter(phases[:, ~real].float())
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.register_buffer("pair_weights", _pair_weights(n), persistent=False)

    # -- factors ------------------------------------------------------------------------------
    def diagonals(self) -> Tensor:
        r"""The signed diagonals :math:`d_j = \sigma_j e^{\ell_j}`, shape ``(m, n)`` (row ``j - 1`` is :math:`d_j`)."""
        return self._cached("diagonals", lambda: self.diag_sign * self.log_diag.exp())

    def spectra(self) -> Tensor:
        r"""The half spectra :math:`\hat c_j` = ``rfft(c_j)``, complex, shape ``(m - 1, n // 2 + 1)``."""
        return self._cached("spectra", self._compute_spectra)

    def kernels(self) -> Tensor:
        r"""The real first columns :math:`c_j` of the circulants, shape ``(m - 1, n)``."""
        if self.parameterization == "kernel":
            return self.kernel
        return torch.fft.irfft(self.spectra(), n=self.features)

    def log_abs_det(self) -> Tensor:
        r""":math:`\log|\det W|` (a scalar; per pixel for the channel form), in :math:`O(m n)` from the spectra."""
        return self._cached("log_abs_det", self._compute_log_abs_det)

    def weight(self) -> Tensor:
        """The dense matrix ``W`` (``(n, n)``), built from the factors in ``O(m n² log n)``."""
        return self._cached("weight", lambda: self._materialise(inverse=False))

    def inverse_weight(self) -> Tensor:
        """The dense matrix ``W⁻¹`` (``(n, n)``), built from the factors in ``O(m n² log n)`` (no inversion)."""
        return self._cached("inverse_weight", lambda: self._materialise(inverse=True))

    def _materialise(self, inverse: bool) -> Tensor:
        eye = torch.eye(self.features, dtype=self.log_diag.dtype, device=self.log_diag.device)
        return self._mix(eye, spatial=0, inverse=inverse).T  # row i of the product is W e_i (or W⁻¹ e_i)

    def _compute_spectra(self) -> Tensor:
        if self.parameterization == "kernel":
            return torch.fft.rfft(self.kernel, dim=-1)
        # the complex bins are 1 .. (n - 1) // 2; DC and (even n) Nyquist get phase 0 and a sign
        phase = F.pad(self.phase, (1, 1 - self.features % 2))
        return torch.polar(self.log_modulus.exp(), phase) * self.spectrum_sign

    def _compute_log_abs_det(self) -> Tensor:
        if self.parameterization == "kernel":
            log_modulus = self.spectra().abs().log()
        else:
            log_modulus = self.log_modulus
        return self.log_diag.sum() + (log_modulus * self.pair_weights).sum()

    def _inverse_diagonals(self) -> Tensor:
        return self._cached("inverse_diagonals", lambda: self.diag_sign * torch.exp(-self.log_diag))

    def _inverse_spectra(self) -> Tensor:
        return self._cached("inverse_spectra", lambda: self.spectra().reciprocal())

    # -- application --------------------------------------------------------------------------
    def _mix(self, x: Tensor, *, spatial: int, inverse: bool, bias: Tensor | None = None) -> Tensor:
        """Apply ``W`` (or ``W⁻¹``) along the feature axis ``-1 - spatial`` of ``x``; ``bias`` is added after ``W``."""
        n, axis = self.features, -1 - spatial
        tail = (1,) * spatial
        if x.numel() == 0:  # an empty batch: the FFT backends refuse empty transforms
            return x.clone()
        if not inverse:
            d, s = self.diagonals(), self.spectra()
            u = x * d[-1].view(n, *tail)
            for j in reversed(range(self.factors - 1)):
                u = torch.fft.irfft(torch.fft.rfft(u, dim=axis) * s[j].view(-1, *tail), n=n, dim=axis)
                scale = d[j].view(n, *tail)
                u = torch.addcmul(bias.view(n, *tail), u, scale) if j == 0 and bias is not None else u * scale
            return u
        d, s = self._inverse_diagonals(), self._inverse_spectra()
        u = x if bias is None else x - bias.view(n, *tail)
        u = u * d[0].view(n, *tail)
        for j in range(self.factors - 1):
            u = torch.fft.irfft(torch.fft.rfft(u, dim=axis) * s[j].view(-1, *tail), n=n, dim=axis)
            u = u * d[j + 1].view(n, *tail)
        return u

    def _multiplicity(self, x: Tensor) -> int:
        return math.prod(x.shape[x.dim() - self._spatial :]) if self._spatial else 1

    def _use_dense(self, x: Tensor) -> bool:
        if self.method != "auto":
            return self.method == "dense"
        n = self.features
        return n <= _AUTO_DENSE_MAX and x.numel() >= _AUTO_DENSE_ROWS * n * n

    def _apply_dense(self, x: Tensor, *, inverse: bool) -> Tensor:
        """``W x + b`` or ``W⁻¹ (x - b)`` with the materialised matrix: one matmul, or a 1x1 convolution for images."""
        w, bias = (self.inverse_weight(), None) if inverse else (self.weight(), self.bias)
        n = self.features
        if inverse and self.bias is not None:
            x = x - self.bias.view(n, *(1,) * self._spatial)
        if not self._spatial:
            return F.linear(x, w, bias)
        flat = x.reshape(-1, *x.shape[x.dim() - 3 :])  # the channel form has (C, H, W) events
        return F.conv2d(flat, w[:, :, None, None], bias).reshape(x.shape)

    def _apply_map(self, x: Tensor, *, inverse: bool) -> Tensor:
        if self._use_dense(x) or x.numel() == 0:  # FFTs of empty tensors fail (MKL); the matmul does not
            return self._apply_dense(x, inverse=inverse)
        return self._mix(x, spatial=self._spatial, inverse=inverse, bias=self.bias)

    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z = self._apply_map(x, inverse=False)
        ladj = self.log_abs_det() * self._multiplicity(x)
        return z, ladj.expand(self.batch_shape(x))

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = self._apply_map(z, inverse=True)
        ladj = -self.log_abs_det() * self._multiplicity(z)
        return x, ladj.expand(self.batch_shape(z))

    # -- eval-mode cache ----------------------------------------------------------------------
    def _cached(self, name: str, compute: Callable[[], Tensor]) -> Tensor:
        """``compute()``, reused while the cache is on, valid and no parameter gradient is being recorded."""
        if not self.cache or self.training:
            return compute()
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters(recurse=False)):
            return compute()
        key = tuple(
            (t.data_ptr(), t._version, t.dtype, t.device)
            for t in (*self.parameters(recurse=False), *self.buffers(recurse=False))
        )
        if key != self._cache_key:
            self._cache, self._cache_key = {}, key
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def clear_cache(self) -> None:
        """Drop the cached derived quantities (needed only after writing parameters through ``.data``)."""
        self._cache, self._cache_key = {}, None

    def train(self, mode: bool = True) -> CirculantDiagonal:
        self.clear_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):  # .to(), .double(), .cuda(), ...
        self.clear_cache()
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.clear_cache()
        super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, factors={self.factors}, parameterization={self.parameterization!r}, "
            f"bias={self.bias is not None}, method={self.method!r}, cache={self.cache}"
        )


class CirculantDiagonal2d(CirculantDiagonal):
    r"""The channel form of :class:`CirculantDiagonal` for ``(C, H, W)`` image events, any height and width.

    The same :math:`W = D_1 C_1 \cdots C_{m-1} D_m` (:math:`C \times C`) mixes the channels at every
    pixel, :math:`z_{:,h,w} = W x_{:,h,w} + b`: a drop-in replacement for Glow's invertible
    :math:`1\times 1` convolution, with the FFTs taken along the channel axis, and
    :math:`\log|\det J| = H W \log|\det W|`.

    Args:
        channels: number of channels ``C``.
        factors: number of diagonal factors ``m >= 2``.
        parameterization: ``"kernel"`` or ``"spectrum"`` (see :class:`CirculantDiagonal`).
        init: ``"identity"`` or ``"orthogonal"``.
        bias: learn a per-channel bias.
        method: ``"auto"``, ``"fft"`` or ``"dense"`` (see :class:`CirculantDiagonal`; ``"auto"``
            applies the materialised :math:`W` as a :math:`1\times 1` convolution when
            ``C <= 512`` and the input holds at least ``8 C`` pixels in all).
        cache: reuse derived quantities in eval mode (see :class:`CirculantDiagonal`).
        generator: random generator for ``init="orthogonal"``.

    References:
        Feng, Liao (2025), "CDFlow: Building Invertible Layers with Circulant and Diagonal
        Matrices", NeurIPS, arXiv:2510.25323. Kingma, Dhariwal (2018), "Glow: Generative Flow with
        Invertible 1x1 Convolutions", NeurIPS, arXiv:1807.03039.

    Example:
        >>> import torch
        >>> t = CirculantDiagonal2d(5, factors=2, init="orthogonal").double()
        >>> x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
        >>> z, ladj = t.forward_and_log_det(x)
        >>> conv = torch.nn.functional.conv2d(x, t.weight()[:, :, None, None], t.bias)
        >>> torch.allclose(z, conv), torch.allclose(t.inverse(z), x), ladj.shape
        (True, True, torch.Size([2]))
    """

    _spatial = 2

    def __init__(
        self,
        channels: int,
        *,
        factors: int = 2,
        parameterization: str = "kernel",
        init: str = "identity",
        bias: bool = True,
        method: str = "auto",
        cache: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            channels,
            factors=factors,
            parameterization=parameterization,
            init=init,
            bias=bias,
            method=method,
            cache=cache,
            generator=generator,
        )
