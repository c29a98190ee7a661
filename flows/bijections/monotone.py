r"""Neural and polynomial monotone transformers: deep sigmoidal (NAF), UMNN, sum-of-squares and Bernstein.

Each is a :class:`~flows.bijections.transformers.Transformer` (so it goes wherever one goes:
:class:`~flows.bijections.autoregressive.MaskedAutoregressive`,
:class:`~flows.bijections.coupling.Coupling`, :class:`~flows.bijections.elementwise.Elementwise`)
whose forward map and log-derivative are closed-form (or a quadrature) and whose inverse is the
safeguarded Newton solve of :func:`~flows.bijections.numerical_inverse.monotone_inverse`, with
exact implicit gradients. Every map is strictly increasing from :math:`\mathbb{R}` onto
:math:`\mathbb{R}` and is the identity at all-zero raw parameters (for UMNN: at the initial,
zero last layer of its integrand network), so identity-initialised conditioners start at the
identity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows._validation import check_count, check_number
from flows.bijections.numerical_inverse import monotone_inverse
from flows.bijections.transformers import Transformer

__all__ = [
    "BernsteinTransformer",
    "DeepSigmoidTransformer",
    "MonotoneTransformer",
    "SOSPolynomialTransformer",
    "UMNNTransformer",
    "clenshaw_curtis",
]

_SOFTPLUS_ONE = math.log(math.e - 1)  # softplus(_SOFTPLUS_ONE) = 1


class MonotoneTransformer(Transformer):
    r"""A transformer with a closed-form forward map and a numerical inverse (:func:`monotone_inverse`).

    Subclasses implement :meth:`forward_and_log_det`; the inverse solves
    :math:`\tau(x; \theta) = z` elementwise and returns :math:`-\log\tau'(x)`, both carrying exact
    first derivatives with respect to :math:`z` and :math:`\theta` (implicit function theorem).

    Args:
        atol: absolute tolerance of the inverse's residual (``None``: 1e-12 in float64, 1e-5 otherwise).
        max_iter: most Newton-bisection iterations of the inverse.
    """

    def __init__(self, *, atol: float | None = None, max_iter: int = 100) -> None:
        super().__init__()
        self.atol = atol
        self.max_iter = max_iter

    def _check_params(self, params: Tensor) -> None:
        if params.shape[-1] != self.params_per_dim:
            raise ValueError(
                f"{type(self).__name__}: expected raw parameters of shape (*, {self.params_per_dim}), "
                f"got {tuple(params.shape)}"
            )

    def inverse_and_log_det(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)

        def fn(x: Tensor) -> tuple[Tensor, Tensor]:
            y, log_d = self.forward_and_log_det(x, params)
            return y, log_d.exp()

        x = monotone_inverse(fn, z, atol=self.atol, rtol=self.atol, max_iter=self.max_iter, who=type(self).__name__)
        return x, -self.forward_and_log_det(x, params)[1]


def _log_sigmoid_pair(u: Tensor) -> tuple[Tensor, Tensor]:
    """``(log σ(u), log(1 - σ(u)))``, both stable for any ``u``."""
    return -F.softplus(-u), -F.softplus(u)


class DeepSigmoidTransformer(MonotoneTransformer):
    r"""NAF's deep sigmoidal flow: :math:`\tau(x) = \sigma^{-1}\big(\sum_j w_j\, \sigma(a_j x + b_j)\big)` (stacked).

    Per layer and element, ``3H`` raw parameters :math:`(\hat a, b, \hat w)` give
    :math:`a = \operatorname{softplus}(\hat a + \log(e - 1)) > 0` (1 at zero),
    :math:`w = \operatorname{softmax}(\hat w)`; ``layers`` such maps are composed. With
    :math:`u_j = a_j x + b_j` and :math:`s = \sum_j w_j \sigma(u_j)`:

    .. math:: \log\tau'(x) = \log\sum_j w_j a_j \sigma(u_j)(1 - \sigma(u_j)) - \log s - \log(1 - s),

    all in log-space (``logsumexp``), so the map is finite for any finite input: its tails are
    linear with slope :math:`\min_j a_j` (right) and likewise on the left, so it is onto
    :math:`\mathbb{R}`. All-zero raw parameters give the identity (every :math:`u_j = x`).

    References:
        Huang, Krueger, Lacoste, Courville (2018), "Neural Autoregressive Flows", ICML,
        arXiv:1804.00779.

    Args:
        sigmoids: number of sigmoids ``H`` per layer.
        layers: number of stacked sigmoidal maps.
        atol, max_iter: of the numerical inverse (see :class:`MonotoneTransformer`).

    Example:
        >>> import torch
        >>> tau = DeepSigmoidTransformer(sigmoids=4)
        >>> x, params = torch.randn(5, dtype=torch.float64), torch.randn(5, 12, dtype=torch.float64)
        >>> z, ladj = tau.forward_and_log_det(x, params)
        >>> torch.allclose(tau.inverse_and_log_det(z, params)[0], x)
        True
    """

    def __init__(self, sigmoids: int = 8, *, layers: int = 1, atol: float | None = None, max_iter: int = 100) -> None:
        super().__init__(atol=atol, max_iter=max_iter)
        for label, value in (("sigmoids", sigmoids), ("layers", layers)):
            check_count("DeepSigmoidTransformer", label, value)
        self.sigmoids, self.layers = sigmoids, layers
        self.params_per_dim = 3 * sigmoids * layers

    def _layer(self, x: Tensor, raw: Tensor) -> tuple[Tensor, Tensor]:
        a_raw, b, w_raw = raw.unflatten(-1, (3, self.sigmoids)).unbind(-2)
        log_a = torch.log(F.softplus(a_raw + _SOFTPLUS_ONE))
        log_w = torch.log_softmax(w_raw, -1)
        u = log_a.exp() * x.unsqueeze(-1) + b
        log_sig, log_one_minus = _log_sigmoid_pair(u)
        log_s = torch.logsumexp(log_w + log_sig, -1)
        log_one_minus_s = torch.logsumexp(log_w + log_one_minus, -1)
        log_d = torch.logsumexp(log_w + log_a + log_sig + log_one_minus, -1) - log_s - log_one_minus_s
        return log_s - log_one_minus_s, log_d

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)
        ladj = torch.zeros_like(x)
        for raw in params.chunk(self.layers, -1):
            x, log_d = self._layer(x, raw)
            ladj = ladj + log_d
        return x, ladj

    def extra_repr(self) -> str:
        return f"sigmoids={self.sigmoids}, layers={self.layers}"


def clenshaw_curtis(nodes: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    r"""Clenshaw–Curtis nodes :math:`s_k = \cos(k\pi/N)` and weights on ``[-1, 1]``, ``N = nodes`` (even).

    :math:`\int_{-1}^1 f \approx \sum_{k=0}^N w_k f(s_k)`, exact for polynomials of degree
    :math:`\le N` and spectrally accurate for smooth :math:`f` (Trefethen 2008, "Is Gauss
    Quadrature Better than Clenshaw–Curtis?", SIAM Review 50(1)).

    Example:
        >>> s, w = clenshaw_curtis(8)
        >>> round(float((w * s**4).sum()), 12)  # ∫ s⁴ = 2/5
        0.4
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2 or nodes % 2:
        raise ValueError(f"clenshaw_curtis: expected an even number of nodes >= 2, got {nodes!r}")
    n = nodes
    k = torch.arange(n + 1, dtype=torch.float64)
    j = torch.arange(1, n // 2 + 1, dtype=torch.float64)
    b = torch.where(j == n / 2, 1.0, 2.0)
    sums = (b / (4 * j * j - 1) * torch.cos(2 * torch.outer(k, j) * math.pi / n)).sum(-1)
    c = torch.where((k == 0) | (k == n), 1.0, 2.0)
    weights = c / n * (1 - sums)
    return torch.cos(k * math.pi / n).to(dtype), weights.to(dtype)


class UMNNTransformer(MonotoneTransformer):
    r"""Unconstrained monotonic neural network: :math:`\tau(x) = \beta + \int_0^x f(t, h)\,dt` with :math:`f > 0`.

    Raw parameters per element are :math:`(\beta, h_1, \dots, h_E)`: an offset and an embedding
    fed, with :math:`t`, to the integrand network :math:`f(t, h) = \operatorname{softplus}(g(t, h)
    + \log(e - 1))`, an MLP :math:`g` shared by all elements (this transformer's own parameters;
    its last layer starts at zero, so :math:`f = 1` and :math:`\tau` is the identity at zero raw
    parameters). The integral is Clenshaw–Curtis quadrature with ``nodes + 1`` points,

    .. math:: \int_0^x f(t)\,dt \approx \frac{x}{2}\sum_k w_k\, f\Big(\frac{x (s_k + 1)}{2}\Big),

    and :math:`\log\tau'(x) = \log f(x, h)` (the fundamental theorem of calculus). The integrand
    is smooth (softplus rather than the paper's ELU + 1, whose second derivative jumps), so the
    quadrature converges spectrally and the log-derivative agrees with the derivative of the
    computed map to the quadrature's accuracy. Gradients flow through the quadrature by autograd.

    References:
        Wehenkel, Louppe (2019), "Unconstrained Monotonic Neural Networks", NeurIPS,
        arXiv:1908.05164. Clenshaw, Curtis (1960), "A method for numerical integration on an
        automatic computer", Numerische Mathematik 2.

    Args:
        embedding: embedding width ``E``.
        hidden: hidden widths of the integrand network.
        nodes: quadrature order ``N`` (even; ``N + 1`` integrand evaluations per element).
        atol, max_iter: of the numerical inverse (see :class:`MonotoneTransformer`).

    Example:
        >>> import torch
        >>> tau = UMNNTransformer(embedding=2, hidden=(8,)).double()
        >>> x, params = torch.randn(4, dtype=torch.float64), torch.zeros(4, 3, dtype=torch.float64)
        >>> torch.allclose(tau.forward_and_log_det(x, params)[0], x)  # identity at initialisation
        True
    """

    def __init__(
        self,
        embedding: int = 4,
        hidden: Sequence[int] = (32, 32),
        *,
        nodes: int = 16,
        atol: float | None = None,
        max_iter: int = 100,
    ) -> None:
        super().__init__(atol=atol, max_iter=max_iter)
        check_count("UMNNTransformer", "embedding", embedding, minimum=0)
        if (
            isinstance(hidden, (str, bytes))
            or not isinstance(hidden, Sequence)
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)
        ):
            raise ValueError(f"UMNNTransformer: expected hidden to be a sequence of positive ints, got {hidden!r}")
        nodes_, weights = clenshaw_curtis(nodes)
        self.register_buffer("nodes", nodes_, persistent=False)
        self.register_buffer("weights", weights, persistent=False)
        widths = [1 + embedding, *hidden, 1]
        layers: list[nn.Module] = []
        for i in range(len(widths) - 1):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < len(widths) - 2:
                layers.append(nn.Tanh())
        nn.init.zeros_(layers[-1].weight)
        nn.init.zeros_(layers[-1].bias)
        self.integrand_net = nn.Sequential(*layers)
        self.embedding = embedding
        self.params_per_dim = 1 + embedding

    def integrand(self, t: Tensor, h: Tensor) -> Tensor:
        """:math:`f(t, h) > 0` for ``t`` of shape ``S`` and ``h`` of shape ``(*S, E)``."""
        inputs = torch.cat((t.unsqueeze(-1), h.expand(*t.shape, self.embedding)), -1)
        return F.softplus(self.integrand_net(inputs).squeeze(-1) + _SOFTPLUS_ONE)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)
        params = params.expand(*x.shape, self.params_per_dim)
        beta, h = params[..., 0], params[..., 1:]
        s, w = self.nodes.to(x), self.weights.to(x)
        t = x.unsqueeze(-1) * (s + 1) / 2  # (*S, N + 1)
        values = self.integrand(t, h.unsqueeze(-2))
        integral = x / 2 * (values * w).sum(-1)
        return beta + integral, torch.log(self.integrand(x, h))

    def extra_repr(self) -> str:
        return f"embedding={self.embedding}, nodes={self.nodes.shape[0] - 1}"


class SOSPolynomialTransformer(MonotoneTransformer):
    r"""Sum-of-squares polynomial: :math:`\tau(x) = c + \epsilon x + \int_0^x \sum_k (\sum_l a_{kl} t^l)^2 dt`.

    The integrand is a sum of ``K`` squared polynomials of degree ``r``, so :math:`\tau` is a
    polynomial of odd degree :math:`2r + 1`, integrated in closed form:

    .. math:: \tau(x) = c + \epsilon x + \sum_k \sum_{l, m} \frac{a_{kl} a_{km}}{l + m + 1} x^{l+m+1},
              \qquad \tau'(x) = \epsilon + \sum_k p_k(x)^2 \ge \epsilon.

    The floor :math:`\epsilon = 10^{-3}` keeps :math:`\tau` strictly increasing (and onto
    :math:`\mathbb{R}`) when every coefficient vanishes. Raw parameters per element:
    :math:`(c, a_{10}, \dots, a_{Kr})`, ``1 + K (r + 1)``, with :math:`a_{k0}` offset by
    :math:`\sqrt{(1 - \epsilon)/K}` so that zero raw parameters give the identity. High degrees
    grow fast: standardise the data (the polynomial is not bounded like a spline's tails).

    With ``bound=B`` the polynomial part is taken of :math:`u = x / B` on :math:`[-B, B]` and
    continued by straight lines outside, with the end slopes (as :class:`BernsteinTransformer`'s
    tails): for :math:`\bar x = \mathrm{clamp}(x, -B, B)`,

    .. math:: \tau(x) = c + \epsilon x + B \int_0^{\bar x/B} \sum_k p_k(u)^2 du
              + (x - \bar x) \sum_k p_k(\bar x / B)^2,
              \qquad \tau'(x) = \epsilon + \sum_k p_k(\bar x / B)^2.

    Each map is then a bijection of :math:`\mathbb{R}` that grows linearly, so a stack of them
    cannot overflow on far-out inputs (a stack of plain odd-degree polynomials grows like
    :math:`x^{(2r+1)^L}`), and coefficients of order one act on :math:`[-1, 1]`. ``bound=None`` is
    the plain polynomial on all of :math:`\mathbb{R}`.

    References:
        Jaini, Selby, Yu (2019), "Sum-of-Squares Polynomial Flow", ICML, arXiv:1905.02325.

    Args:
        degree: ``r``, the degree of each squared polynomial.
        squares: ``K``, the number of squares.
        bound: ``0 < B <= 1e6``: the polynomial part on ``[-B, B]``, linear tails outside (``None``: the
            plain polynomial everywhere).
        atol, max_iter: of the numerical inverse (see :class:`MonotoneTransformer`).

    Example:
        >>> import torch
        >>> tau = SOSPolynomialTransformer(degree=2, squares=2)
        >>> x = torch.randn(6, dtype=torch.float64)
        >>> params = 0.3 * torch.randn(6, tau.params_per_dim, dtype=torch.float64)
        >>> z, _ = tau.forward_and_log_det(x, params)
        >>> torch.allclose(tau.inverse_and_log_det(z, params)[0], x)
        True
    """

    floor = 1e-3

    def __init__(
        self,
        degree: int = 2,
        squares: int = 2,
        *,
        bound: float | None = None,
        atol: float | None = None,
        max_iter: int = 100,
    ) -> None:
        super().__init__(atol=atol, max_iter=max_iter)
        for label, value, low in (("degree", degree, 0), ("squares", squares, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SOSPolynomialTransformer: expected {label} to be an int >= {low}, got {value!r}")
        if bound is not None:
            # beyond 1e6 the polynomials' argument x / bound underflows in float32 for data of any sensible size
            bound = check_number("SOSPolynomialTransformer", "bound", bound, minimum=0.0, strict=True, maximum=1e6)
        self.bound = bound
        self.degree, self.squares = degree, squares
        self.params_per_dim = 1 + squares * (degree + 1)
        # b_n = sum_k sum_{l+m=n} a_kl a_km: the Gram matrix's anti-diagonal sums, as one matrix product
        order = torch.arange(degree + 1)
        antidiagonal = F.one_hot((order[:, None] + order[None, :]).flatten(), 2 * degree + 1).to(torch.float64)
        self.register_buffer("_antidiagonal", antidiagonal, persistent=False)
        # the integral's coefficients scale / (n + 1), n = 0 .. 2r, with the bound's scale folded in
        scale = 1.0 if bound is None else bound
        self.register_buffer(
            "_integral_weights", scale / torch.arange(1.0, 2 * degree + 2, dtype=torch.float64), persistent=False
        )
        offset = torch.zeros(squares, degree + 1, dtype=torch.float64)
        offset[:, 0] = math.sqrt((1 - self.floor) / squares)  # zero raw parameters: the identity
        self.register_buffer("_offset", offset, persistent=False)
        self.register_buffer("_first", torch.arange(2 * degree + 1) == 0, persistent=False)
        self._constants: dict[tuple, Tensor] = {}

    def _constant(self, name: str, like: Tensor) -> Tensor:
        """The float64 buffer ``name`` in ``like``'s dtype and device, converted once (not at every call)."""
        buffer = getattr(self, name)
        if buffer.dtype == like.dtype and buffer.device == like.device:
            return buffer
        key = (name, like.dtype, like.device, buffer.data_ptr())
        if key not in self._constants:
            self._constants = {k: v for k, v in self._constants.items() if k[0] != name} | {key: buffer.to(like)}
        return self._constants[key]

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)
        r = self.degree
        c, a = params.split((1, self.params_per_dim - 1), -1)  # one split: cheaper to differentiate than slices
        a = a.unflatten(-1, (self.squares, r + 1)) + self._constant("_offset", x)
        inside = x if self.bound is None else x.clamp(-self.bound, self.bound)
        u = inside if self.bound is None else inside * (1 / self.bound)
        # sum_k p_k(u)^2 = sum_n b_n u^n and its integral sum_n b_n u^(n+1) / (n+1), from the 2r + 1
        # coefficients b (a batched Gram matrix and its anti-diagonal sums) and the powers u^0 .. u^(2r)
        b = (a.mT @ a).flatten(-2) @ self._constant("_antidiagonal", x)
        first = self._first  # (True, False, ...): the cumprod of (1, u, u, ...) is (1, u, u^2, ...)
        terms = b * torch.where(first, 1.0, u.unsqueeze(-1).expand(*u.shape, 2 * r + 1)).cumprod(-1)
        squares = terms.sum(-1)
        z = c.squeeze(-1) + self.floor * x + u * (terms * self._constant("_integral_weights", x)).sum(-1)
        if self.bound is not None:
            z = z + (x - inside) * squares  # the straight tails, with the end slopes
        return z, torch.log(self.floor + squares)

    def extra_repr(self) -> str:
        bound = "" if self.bound is None else f", bound={self.bound:g}"
        return f"degree={self.degree}, squares={self.squares}{bound}"


class BernsteinTransformer(MonotoneTransformer):
    r"""Bernstein polynomial transformer on ``[-B, B]`` with linear tails.

    With :math:`u = (x + B)/(2B) \in [0, 1]` and the Bernstein basis
    :math:`b_{k,M}(u) = \binom{M}{k} u^k (1 - u)^{M - k}`,

    .. math:: \tau(x) = \sum_{k=0}^{M} \vartheta_k\, b_{k,M}(u), \qquad
              \tau'(x) = \frac{M}{2B}\sum_{k=0}^{M-1} (\vartheta_{k+1} - \vartheta_k)\, b_{k,M-1}(u),

    increasing because the coefficients are: :math:`\vartheta_0 = -B + \hat\vartheta_0`,
    :math:`\vartheta_{k} - \vartheta_{k-1} = \frac{2B}{M}\operatorname{softplus}(\hat\vartheta_k
    + \log(e - 1))`. Zero raw parameters give :math:`\vartheta_k = -B + 2Bk/M`, the identity
    (Bernstein polynomials reproduce linear functions). Outside ``[-B, B]`` the map continues
    linearly with the end slopes, so it is :math:`C^1` and onto :math:`\mathbb{R}`. ``M + 1`` raw
    parameters per element.

    References:
        Sick, Hothorn, Dürr (2021), "Deep transformation models: Tackling complex regression
        problems with neural network based transformation models", ICPR, arXiv:2004.00464.
        Ramasinghe, Fernando, Khan, Barnes (2021), "Robust normalizing flows using Bernstein-type
        polynomials", arXiv:2102.03509.

    Args:
        degree: ``M`` (at least 1).
        bound: ``B``, the half-width of the polynomial part.
        atol, max_iter: of the numerical inverse (see :class:`MonotoneTransformer`).

    Example:
        >>> import torch
        >>> tau = BernsteinTransformer(degree=6, bound=4.0)
        >>> x = torch.linspace(-6, 6, 7, dtype=torch.float64)
        >>> torch.allclose(tau.forward_and_log_det(x, torch.zeros(7, 7, dtype=torch.float64))[0], x)
        True
    """

    def __init__(self, degree: int = 8, *, bound: float = 5.0, atol: float | None = None, max_iter: int = 100) -> None:
        super().__init__(atol=atol, max_iter=max_iter)
        check_count("BernsteinTransformer", "degree", degree)
        bound = check_number("BernsteinTransformer", "bound", bound, minimum=0, maximum=1e30, strict=True)
        self.degree, self.bound = degree, bound
        self.params_per_dim = degree + 1
        k = torch.arange(degree + 1, dtype=torch.float64)
        log_binomial = (
            torch.lgamma(torch.tensor(degree + 1.0, dtype=torch.float64))
            - torch.lgamma(k + 1)
            - torch.lgamma(degree - k + 1)
        )
        self.register_buffer("_binomial", log_binomial.exp(), persistent=False)
        k1 = torch.arange(degree, dtype=torch.float64)
        log_binomial1 = (
            torch.lgamma(torch.tensor(float(degree), dtype=torch.float64))
            - torch.lgamma(k1 + 1)
            - torch.lgamma(degree - k1)
        )
        self.register_buffer("_binomial1", log_binomial1.exp(), persistent=False)

    @staticmethod
    def _powers(u: Tensor, m: int) -> Tensor:
        """``u^0 .. u^m`` along a new last axis, by a cumulative product (no power with a tensor exponent)."""
        u = u.unsqueeze(-1)
        return torch.cat((torch.ones_like(u), u.expand(*u.shape[:-1], m).cumprod(-1)), -1)

    def forward_and_log_det(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        self._check_params(params)
        b, m = self.bound, self.degree
        steps = (2 * b / m) * F.softplus(params[..., 1:] + _SOFTPLUS_ONE)
        theta = torch.cat((params[..., :1] - b, params[..., :1] - b + steps.cumsum(-1)), -1)
        xc = x.clamp(-b, b)
        u = (xc + b) / (2 * b)
        # b_{k,M}(u) = C(M,k) u^k (1-u)^(M-k) and b_{k,M-1}(u) from one table of powers of u and of 1 - u
        up, down = self._powers(u, m), self._powers(1 - u, m).flip(-1)  # u^k and (1-u)^(M-k), k = 0..M
        value = (theta * self._binomial.to(u) * up * down).sum(-1)
        slope = (m / (2 * b)) * (steps * self._binomial1.to(u) * up[..., :m] * down[..., 1:]).sum(-1)
        return value + slope * (x - xc), torch.log(slope)

    def extra_repr(self) -> str:
        return f"degree={self.degree}, bound={self.bound}"
