"""CirculantDiagonal(2d) against the dense-matrix oracle: W built from its factors with torch.roll."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from flows import CirculantDiagonal, CirculantDiagonal2d

F64 = torch.float64


def circulant(c: torch.Tensor) -> torch.Tensor:
    """``circ(c)`` by definition: column ``k`` is ``c`` rolled down by ``k``, so ``C[i, k] = c[(i - k) mod n]``."""
    return torch.stack([torch.roll(c, k) for k in range(c.shape[0])], dim=1)


def full_spectrum_kernel(half: torch.Tensor, n: int) -> torch.Tensor:
    """Real kernel of a half spectrum, by hand: Hermitian extension, complex inverse DFT, imaginary part ~0."""
    k = torch.arange(n)
    mirrored = torch.clamp((n - k) % n, max=n // 2)
    full = torch.where(k <= n // 2, half[torch.clamp(k, max=n // 2)], half[mirrored].conj())
    c = torch.fft.ifft(full)
    assert c.imag.abs().max() < 1e-12  # the extension is Hermitian, so the kernel is real
    return c.real


def oracle_kernels(t: CirculantDiagonal) -> torch.Tensor:
    """The circulants' first columns, recomputed from the raw parameters without the module's FFT path."""
    if t.parameterization == "kernel":
        return t.kernel.detach()
    n, bins = t.features, t.features // 2 + 1
    phase = torch.zeros(t.factors - 1, bins, dtype=F64)
    phase[:, 1 : 1 + (n - 1) // 2] = t.phase.detach()
    half = torch.polar(t.log_modulus.detach().exp(), phase) * t.spectrum_sign
    return torch.stack([full_spectrum_kernel(h, n) for h in half])


def oracle_weight(t: CirculantDiagonal) -> torch.Tensor:
    """``W = D_1 C_1 D_2 ... C_{m-1} D_m`` as a dense matrix product."""
    d = t.diag_sign * t.log_diag.detach().exp()
    c = oracle_kernels(t)
    w = torch.diag(d[0])
    for j in range(t.factors - 1):
        w = w @ circulant(c[j]) @ torch.diag(d[j + 1])
    return w


def perturbed(
    n: int,
    m: int,
    parameterization: str,
    *,
    init: str = "identity",
    seed: int = 0,
    cls=CirculantDiagonal,
    method: str = "fft",
):
    """A float64 layer well away from its initialisation, with spectra of modulus O(1) for any ``n``."""
    torch.manual_seed(seed)
    t = cls(n, factors=m, parameterization=parameterization, init=init, method=method).double()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in t.named_parameters():
            scale = 0.3 / math.sqrt(n) if name == "kernel" else 0.3  # kernel noise adds up over n bins
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=F64))
    return t


SIZES = [1, 2, 3, 4, 5, 8, 15, 16, 64, 127, 256]


@pytest.mark.parametrize("method", ["fft", "dense"])
@pytest.mark.parametrize("parameterization", ["kernel", "spectrum"])
@pytest.mark.parametrize("n", SIZES)
def test_matches_dense_oracle(n: int, parameterization: str, method: str) -> None:
    """Outputs, log-det and inverse agree with W x + b, slogdet(W) and solve(W, z - b) to 1e-10."""
    for m in (2, 3, 4):
        t = perturbed(n, m, parameterization, seed=n + m, method=method)
        w = oracle_weight(t)
        x = torch.randn(7, n, dtype=F64, generator=torch.Generator().manual_seed(m))
        z, ladj = t.forward_and_log_det(x)
        torch.testing.assert_close(z, x @ w.T + t.bias, atol=1e-10, rtol=1e-10)
        sign, logabsdet = torch.linalg.slogdet(w)
        assert sign != 0
        assert (ladj - logabsdet).abs().max() <= 1e-10
        assert abs(float(t.log_abs_det().detach() - logabsdet)) <= 1e-10
        x_back, ladj_inv = t.inverse_and_log_det(z)
        solved = torch.linalg.solve(w, (z - t.bias).T).T
        torch.testing.assert_close(x_back, solved, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(x_back, x, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(ladj_inv, -ladj, atol=1e-12, rtol=0)
        torch.testing.assert_close(t.weight(), w, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(t.inverse_weight() @ w, torch.eye(n, dtype=F64), atol=1e-10, rtol=0)


def test_identity_initialisation() -> None:
    for n in (1, 4, 7):
        for parameterization in ("kernel", "spectrum"):
            t = CirculantDiagonal(n, factors=3, parameterization=parameterization).double()
            x = torch.randn(5, n, dtype=F64)
            z, ladj = t.forward_and_log_det(x)
            torch.testing.assert_close(z, x, atol=1e-14, rtol=0)  # FFT round-off only
            assert ladj.abs().max() <= 1e-15
            torch.testing.assert_close(t.weight(), torch.eye(n, dtype=F64), atol=1e-14, rtol=0)


@pytest.mark.parametrize("n", [5, 8])
def test_cyclic_shift_has_log_det_zero(n: int) -> None:
    """c = e_1 is the cyclic shift (a permutation): z = roll(x, 1) per circulant and log|det| = 0."""
    t = CirculantDiagonal(n, factors=3, bias=False).double()
    with torch.no_grad():
        t.kernel.zero_()
        t.kernel[:, 1] = 1.0
    x = torch.randn(4, n, dtype=F64)
    z, ladj = t.forward_and_log_det(x)
    torch.testing.assert_close(z, torch.roll(x, 2, dims=-1), atol=1e-12, rtol=0)
    assert ladj.abs().max() <= 1e-12
    torch.testing.assert_close(t.inverse(z), x, atol=1e-12, rtol=0)

    # the same shift in the spectral parameterisation: unit modulus, phase -2πk/n, Nyquist -1
    s = CirculantDiagonal(n, factors=3, parameterization="spectrum", bias=False).double()
    k = torch.arange(1, 1 + (n - 1) // 2, dtype=F64)
    with torch.no_grad():
        s.phase.copy_((-2 * math.pi * k / n).expand_as(s.phase))
        if n % 2 == 0:
            s.spectrum_sign[:, -1] = -1.0
    torch.testing.assert_close(s(x), z, atol=1e-12, rtol=0)
    assert s.log_abs_det().abs() <= 1e-12


def test_signed_diagonals_and_log_det_of_a_diagonal_product() -> None:
    """With identity circulants W = D_1 D_2: log|det| = Σ log|d| whatever the signs."""
    t = CirculantDiagonal(6, factors=2, bias=False).double()
    with torch.no_grad():
        t.log_diag.copy_(torch.randn(2, 6, dtype=F64))
        t.diag_sign.copy_(torch.tensor([[1, -1, 1, -1, -1, 1], [-1, -1, 1, 1, 1, -1]], dtype=F64))
    d = t.diag_sign * t.log_diag.exp()
    x = torch.randn(3, 6, dtype=F64)
    torch.testing.assert_close(t(x), x * d[0] * d[1])
    torch.testing.assert_close(t.log_abs_det(), t.log_diag.sum())


def test_circulant_product_is_real_and_matches_the_complex_dft() -> None:
    """irfft(rfft(c) ⊙ rfft(x)) equals ifft(fft(c) ⊙ fft(x)), whose imaginary part vanishes for real c."""
    for n in (7, 8):
        t = perturbed(n, 2, "kernel", seed=3)
        with torch.no_grad():
            t.log_diag.zero_()
            t.bias.zero_()
        c = t.kernel[0].detach()
        x = torch.randn(5, n, dtype=F64)
        full = torch.fft.ifft(torch.fft.fft(c) * torch.fft.fft(x))
        assert full.imag.abs().max() < 1e-13
        torch.testing.assert_close(t(x), full.real, atol=1e-13, rtol=0)
        # the log-det is the sum over the *full* spectrum, which the half-spectrum weights reproduce
        torch.testing.assert_close(t.log_abs_det(), torch.fft.fft(c).abs().log().sum(), atol=1e-13, rtol=0)


def test_spectrum_parameterisation_is_a_true_circulant() -> None:
    """The stored half spectrum is exactly the rfft of the kernel that is applied (real DC/Nyquist bins)."""
    for n in (6, 9):
        t = perturbed(n, 3, "spectrum", init="orthogonal", seed=5)
        torch.testing.assert_close(torch.fft.rfft(t.kernels(), dim=-1), t.spectra(), atol=1e-13, rtol=0)
        torch.testing.assert_close(t.kernels(), oracle_kernels(t), atol=1e-13, rtol=0)


def test_free_complex_spectrum_with_real_part_is_the_pitfall() -> None:
    """Why the module never does Re(ifft(ĉ ⊙ fft(x))) with a free ĉ: that matrix's log-det is not Σ log|ĉ|."""
    n = 6
    gen = torch.Generator().manual_seed(0)
    spectrum = torch.complex(torch.randn(n, generator=gen, dtype=F64), torch.randn(n, generator=gen, dtype=F64))
    eye = torch.eye(n, dtype=F64)
    applied = torch.fft.ifft(spectrum * torch.fft.fft(eye, dim=0).T, dim=-1).real.T  # columns: Re(...)(e_k)
    wrong = spectrum.abs().log().sum()
    assert abs(float(torch.linalg.slogdet(applied).logabsdet - wrong)) > 1e-2


def test_orthogonal_initialisation_mixes_and_preserves_volume() -> None:
    for parameterization in ("kernel", "spectrum"):
        gen = torch.Generator().manual_seed(0)
        t = CirculantDiagonal(9, factors=3, init="orthogonal", parameterization=parameterization, generator=gen)
        t = t.double()
        w = t.weight()
        # the kernel is stored in float32 (the spectrum parameterisation is exactly orthogonal)
        torch.testing.assert_close(w @ w.T, torch.eye(9, dtype=F64), atol=1e-6, rtol=0)
        assert abs(float(t.log_abs_det().detach())) < 1e-6
        assert int((w.abs() > 1e-6).sum()) > 3 * 9  # not a permutation: it mixes features


@pytest.mark.parametrize("method", ["fft", "dense"])
def test_channel_form_is_a_1x1_convolution_with_hw_log_det(method: str) -> None:
    t = perturbed(6, 3, "kernel", seed=7, cls=CirculantDiagonal2d, method=method)
    w = oracle_weight(t)
    x = torch.randn(2, 6, 3, 5, dtype=F64)
    z, ladj = t.forward_and_log_det(x)
    conv = torch.nn.functional.conv2d(x, w[:, :, None, None], t.bias)
    torch.testing.assert_close(z, conv, atol=1e-12, rtol=0)
    torch.testing.assert_close(ladj, 15 * torch.linalg.slogdet(w).logabsdet.expand(2), atol=1e-11, rtol=0)
    solved = torch.linalg.solve(w, (z - t.bias[:, None, None]).movedim(1, -1).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(t.inverse(z), solved.movedim(-1, 1), atol=1e-12, rtol=0)
    # the full C·H·W Jacobian on a 2×2 image carries the H·W factor
    x1 = torch.randn(6, 2, 2, dtype=F64)
    jac = torch.autograd.functional.jacobian(t, x1).reshape(24, 24)
    torch.testing.assert_close(t.forward_and_log_det(x1)[1], torch.linalg.slogdet(jac).logabsdet, atol=1e-11, rtol=0)


def test_auto_method_materialises_w_for_many_rows(monkeypatch) -> None:
    """ "auto" uses the dense path when n <= 512 and there are >= 8 n rows, and agrees with the FFT path."""
    t = perturbed(6, 3, "spectrum", seed=2, cls=CirculantDiagonal2d, method="auto")
    fft = copy.deepcopy(t)
    fft.method = "fft"
    used = []
    original = CirculantDiagonal._apply_dense
    monkeypatch.setattr(
        CirculantDiagonal, "_apply_dense", lambda self, x, **kw: used.append(1) or original(self, x, **kw)
    )
    small, large = torch.randn(1, 6, 2, 2, dtype=F64), torch.randn(3, 6, 4, 4, dtype=F64)  # 4 and 48 pixels
    for x, dense in ((small, False), (large, True)):
        used.clear()
        z, ladj = t.forward_and_log_det(x)
        assert bool(used) == dense
        z_fft, ladj_fft = fft.forward_and_log_det(x)
        torch.testing.assert_close(z, z_fft, atol=1e-12, rtol=0)
        torch.testing.assert_close(ladj, ladj_fft, atol=0, rtol=0)
        torch.testing.assert_close(t.inverse(z), x, atol=1e-12, rtol=0)
    big = CirculantDiagonal(513, method="auto")
    used.clear()
    big(torch.randn(8 * 513, 513))  # n > 512: the FFT path even with 8 n rows
    assert not used


def test_float32_round_trip_at_large_n() -> None:
    t = CirculantDiagonal(1024, factors=4, init="orthogonal", generator=torch.Generator().manual_seed(0))
    x = torch.randn(8, 1024)
    assert (t.inverse(t(x)) - x).abs().max() < 1e-4


# -- eval-mode cache ------------------------------------------------------------------------------


def _cached_pair(parameterization: str = "kernel") -> tuple[CirculantDiagonal, CirculantDiagonal]:
    torch.manual_seed(0)
    t = CirculantDiagonal(8, factors=3, cache=True, parameterization=parameterization)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return t, copy.deepcopy(t)


def _uncached_result(t: CirculantDiagonal, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    reference = copy.deepcopy(t)
    reference.cache = False
    reference.clear_cache()
    with torch.no_grad():
        return reference.forward_and_log_det(x)


def test_cache_is_used_in_eval_mode_without_grad() -> None:
    t, _ = _cached_pair()
    t.eval()
    with torch.no_grad():
        assert t.spectra() is t.spectra()
        assert t.log_abs_det() is t.log_abs_det()
    assert t.spectra() is not t.spectra()  # parameters require grad and grad mode is on: no cache
    t.train()
    with torch.no_grad():
        assert t.spectra() is not t.spectra()  # train mode: no cache


@pytest.mark.parametrize("parameterization", ["kernel", "spectrum"])
def test_cache_is_invalidated_by_an_optimizer_step(parameterization: str) -> None:
    t, _ = _cached_pair(parameterization)
    t.eval()  # stay in eval mode throughout: only the version counters can invalidate the cache
    x = torch.randn(4, 8)
    with torch.no_grad():
        before = t.forward_and_log_det(x)
    optimizer = torch.optim.SGD(t.parameters(), lr=0.1)
    z, ladj = t.forward_and_log_det(x)  # grad recorded: bypasses the cache and reaches the parameters
    (z.square().sum() - ladj.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in t.parameters())
    optimizer.step()
    with torch.no_grad():
        after = t.forward_and_log_det(x)
    assert not torch.allclose(after[0], before[0])
    assert not torch.allclose(after[1], before[1])
    expected = _uncached_result(t, x)
    torch.testing.assert_close(after, expected, atol=0, rtol=0)


def test_cache_is_invalidated_by_load_state_dict_and_in_place_updates() -> None:
    t, other = _cached_pair()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    t.eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        t(x)  # fill the cache
        t.load_state_dict(other.state_dict())
        torch.testing.assert_close(t.forward_and_log_det(x), _uncached_result(other, x), atol=0, rtol=0)
        t.log_diag.add_(0.25)  # an in-place update bumps the version counter
        torch.testing.assert_close(t.forward_and_log_det(x), _uncached_result(t, x), atol=0, rtol=0)
        t.diag_sign[0, 0] = -1.0  # buffers are part of the key too
        torch.testing.assert_close(t.forward_and_log_det(x), _uncached_result(t, x), atol=0, rtol=0)


def test_cache_follows_dtype_changes_and_clear_cache() -> None:
    t, _ = _cached_pair()
    t.eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        t(x)
        t.double()
        z, ladj = t.forward_and_log_det(x.double())
        assert z.dtype == ladj.dtype == F64
        t.log_diag.data.mul_(2.0)  # writes through .data bypass the version counters ...
        t.clear_cache()  # ... which is what clear_cache is for
        torch.testing.assert_close(t.forward_and_log_det(x.double()), _uncached_result(t, x.double()))


# -- argument checks ------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"CirculantDiagonal: expected features to be an int >= 1, got 2.5"):
        CirculantDiagonal(2.5)
    with pytest.raises(TypeError, match=r"expected features to be an int >= 1, got \(4, None, None\)"):
        CirculantDiagonal((4, None, None))
    with pytest.raises(ValueError, match=r"expected features >= 1, got 0"):
        CirculantDiagonal(0)
    with pytest.raises(ValueError, match=r"CirculantDiagonal2d: expected channels >= 1, got -3"):
        CirculantDiagonal2d(-3)
    with pytest.raises(ValueError, match=r"expected factors >= 2 .* got 1"):
        CirculantDiagonal(4, factors=1)
    with pytest.raises(TypeError, match=r"expected factors to be an int >= 2, got True"):
        CirculantDiagonal(4, factors=True)
    with pytest.raises(ValueError, match=r"expected parameterization 'kernel' or 'spectrum', got 'fft'"):
        CirculantDiagonal(4, parameterization="fft")
    with pytest.raises(ValueError, match=r"expected init 'identity' or 'orthogonal', got 'random'"):
        CirculantDiagonal(4, init="random")
    with pytest.raises(ValueError, match=r"expected method 'auto', 'fft' or 'dense', got 'matmul'"):
        CirculantDiagonal2d(4, method="matmul")


def test_wrong_input_shape_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"CirculantDiagonal: expected input of shape \(\*batch, 4\), got \(2, 5\)"):
        CirculantDiagonal(4)(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"expected latent input of shape \(\*batch, 3, \*, \*\), got \(2, 4, 5, 5\)"):
        CirculantDiagonal2d(3).inverse(torch.randn(2, 4, 5, 5))
