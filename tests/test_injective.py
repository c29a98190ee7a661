"""Oracles for the injective transforms (docs/injective.md): exact volume terms, projections, the FIF surrogate."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

import flows
from flows.bijections.injective import FreeFormInjective, InjectiveLinear, half_log_det_gram, orthogonal_probes
from flows.data import SineManifold
from flows.testing import check_bijection, perturb_parameters

f64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread avoids oversubscribing the shared CI cores (50x slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _half_log_det_gram_autograd(fn, z: Tensor) -> Tensor:
    """½ log det(JᵀJ) per sample from the full autograd Jacobian of ``fn`` at each row of ``z``."""
    out = []
    for zi in z.reshape(-1, z.shape[-1]):
        jac = torch.autograd.functional.jacobian(fn, zi)
        out.append(0.5 * torch.linalg.slogdet(jac.T @ jac).logabsdet)
    return torch.stack(out).reshape(z.shape[:-1])


# -- half_log_det_gram ---------------------------------------------------------------------------


def test_half_log_det_gram_matches_slogdet() -> None:
    j = torch.randn(4, 7, 3, dtype=f64, generator=torch.Generator().manual_seed(0))
    want = 0.5 * torch.linalg.slogdet(j.mT @ j).logabsdet
    torch.testing.assert_close(half_log_det_gram(j), want)


def test_half_log_det_gram_rejects_wide_matrices() -> None:
    with pytest.raises(ValueError, match=r"expected a \(\*batch, D, d\) Jacobian with d <= D, got \(2, 3\)"):
        half_log_det_gram(torch.randn(2, 3))


# -- InjectiveLinear ------------------------------------------------------------------------------


def _linear(features: int, latent: int, *, bias: bool = True, seed: int = 0) -> InjectiveLinear:
    torch.manual_seed(seed)
    return perturb_parameters(InjectiveLinear(features, latent, bias=bias).double(), 0.3)


@pytest.mark.parametrize(("features", "latent", "bias"), [(5, 2, True), (3, 1, False), (4, 3, True)])
def test_injective_linear_volume_matches_autograd(features: int, latent: int, bias: bool) -> None:
    t = _linear(features, latent, bias=bias)
    z = torch.randn(3, latent, dtype=f64)
    x, volume = t.inverse_and_log_det(z)
    torch.testing.assert_close(volume, _half_log_det_gram_autograd(t.inverse, z))
    z_back, minus_volume = t.forward_and_log_det(x)
    torch.testing.assert_close(z_back, z)  # exact left inverse on the manifold
    torch.testing.assert_close(minus_volume, -volume)


def test_injective_linear_forward_is_the_pseudo_inverse_and_an_orthogonal_projection() -> None:
    t = _linear(5, 2)
    x = torch.randn(6, 5, dtype=f64)
    jac = torch.autograd.functional.jacobian(t.forward, x[0])
    torch.testing.assert_close(jac, torch.linalg.pinv(t.weight.detach()))
    projected = t.inverse(t(x))
    residual = x - projected
    # the residual is orthogonal to the subspace and projecting twice changes nothing
    torch.testing.assert_close(residual @ t.weight.detach(), torch.zeros(6, 2, dtype=f64), atol=1e-12, rtol=0)
    torch.testing.assert_close(t.inverse(t(projected)), projected)
    assert residual.abs().max() > 0.1  # the points were off the plane: the checks above are not vacuous


def test_injective_linear_square_case_is_a_bijection() -> None:
    check_bijection(_linear(3, 3), torch.randn(4, 3, dtype=f64))


def test_injective_linear_padding_init() -> None:
    t = InjectiveLinear(4, 2, init="pad", bias=False)
    z = torch.randn(3, 2)
    torch.testing.assert_close(t.inverse(z), torch.cat((z, torch.zeros(3, 2)), -1))
    x = torch.randn(3, 4)
    torch.testing.assert_close(t(x), x[:, :2])
    assert torch.equal(t.forward_and_log_det(x)[1], torch.zeros(3))


@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_injective_linear_batch_shapes(batch: tuple[int, ...]) -> None:
    t = _linear(5, 2)
    x = torch.randn(*batch, 5, dtype=f64)
    z, ladj = t.forward_and_log_det(x)
    assert z.shape == (*batch, 2) and ladj.shape == batch
    x_back, volume = t.inverse_and_log_det(z)
    assert x_back.shape == (*batch, 5) and volume.shape == batch
    if len(batch) == 2:
        torch.testing.assert_close(t(x.reshape(6, 5)).reshape(z.shape), z)


def test_injective_linear_gradients_and_state_dict() -> None:
    t = _linear(5, 2)
    x = torch.randn(4, 5, dtype=f64)
    z, ladj = t.forward_and_log_det(x)
    x_back, volume = t.inverse_and_log_det(z)
    (z.square().sum() + ladj.sum() + x_back.sin().sum() + volume.sum()).backward()
    for name, p in t.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    fresh = _linear(5, 2, seed=3)
    fresh.load_state_dict(t.state_dict())
    assert torch.equal(fresh(x), t(x))
    assert torch.equal(copy.deepcopy(t)(x), t(x))
    torch.testing.assert_close(copy.deepcopy(t).float()(x.float()).double(), t(x), atol=1e-5, rtol=1e-5)
    assert "InjectiveLinear" in repr(t) and "latent_features=2" in repr(t)


def test_injective_linear_flow_density_integrates_to_one_along_the_line() -> None:
    """∫ p(x(s)) ds = 1 over arc length s of the line: independent of the volume formula."""
    torch.manual_seed(1)
    latent = perturb_parameters(flows.Affine(1).double(), 0.5)
    t = _linear(2, 1)
    flow = flows.Flow(flows.Chain(t, latent), flows.StandardNormal(1)).double()
    w = t.weight.detach()[:, 0]
    direction = w / w.norm()
    s = torch.linspace(-40.0, 40.0, 40001, dtype=f64)
    points = t.bias.detach() + s[:, None] * direction
    with torch.no_grad():
        density = flow.log_prob(points).exp()
    total = torch.trapezoid(density, s)
    assert abs(float(total) - 1.0) < 1e-6


def test_injective_linear_composes_with_latent_flows() -> None:
    torch.manual_seed(0)
    latent = flows.RealNVP(2, transforms=2, hidden=(8,))
    perturb_parameters(latent, 0.2)
    flow = flows.Flow(flows.Chain(InjectiveLinear(5, 2), latent.transform), latent.base).double()
    x, log_p = flow.sample_and_log_prob((6,))
    torch.testing.assert_close(flow.log_prob(x), log_p)
    assert x.shape == (6, 5)


def test_injective_linear_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="expected ints 1 <= latent_features <= features, got features=2"):
        InjectiveLinear(2, 3)
    with pytest.raises(ValueError, match="expected init 'pad' or 'orthogonal', got 'eye'"):
        InjectiveLinear(3, 2, init="eye")
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 3\), got \(4, 2\)"):
        InjectiveLinear(3, 2)(torch.randn(4, 2))


# -- orthogonal probes -------------------------------------------------------------------------


@pytest.mark.parametrize("samples", [1, 3])
def test_probes_have_identity_second_moment(samples: int) -> None:
    d, n = 4, 20000
    v = orthogonal_probes(torch.zeros(n, d, dtype=f64), samples, generator=torch.Generator().manual_seed(0))
    for k in range(samples):
        moment = torch.einsum("ni,nj->ij", v[..., k], v[..., k]) / n
        # entries of v vᵀ have variance < 2 (v uniform on the sphere of radius √d): 5 standard errors
        assert (moment - torch.eye(d, dtype=f64)).abs().max() < 5 * math.sqrt(2 / n)
    assert v.mean((0, 2)).abs().max() < 5 / math.sqrt(n * samples)


@pytest.mark.parametrize("samples", [1, 2, 4])
def test_probes_are_orthogonal_with_squared_norm_d(samples: int) -> None:
    d = 4
    v = orthogonal_probes(torch.zeros(2, 3, d, dtype=f64), samples)
    assert v.shape == (2, 3, d, samples)
    torch.testing.assert_close(v.mT @ v, d * torch.eye(samples, dtype=f64).expand(2, 3, samples, samples))


def test_probes_make_hutchinson_exact_with_d_samples() -> None:
    d = 5
    a = torch.randn(d, d, dtype=f64)
    v = orthogonal_probes(torch.zeros(7, d, dtype=f64), d)
    estimate = torch.einsum("nik,ij,njk->n", v, a, v) / d
    torch.testing.assert_close(estimate, torch.trace(a).expand(7))


def test_probes_reject_bad_sample_counts() -> None:
    with pytest.raises(ValueError, match=r"expected 1 <= samples <= d = 3, got 4"):
        orthogonal_probes(torch.zeros(2, 3), 4)
    with pytest.raises(ValueError, match="expected 1 <= samples <= d = 3, got 0"):
        orthogonal_probes(torch.zeros(2, 3), 0)


# -- FreeFormInjective: exact volume term ---------------------------------------------------------


def _free_form(features: int = 5, latent: int = 2, *, seed: int = 0, **kwargs) -> FreeFormInjective:
    torch.manual_seed(seed)
    return perturb_parameters(FreeFormInjective(features, latent, hidden=(16, 16), **kwargs).double(), 0.1)


def test_decoder_jacobian_matches_autograd() -> None:
    t = _free_form()
    z = torch.randn(2, 3, 2, dtype=f64)
    x, jac = t.decoder_jacobian(z)
    assert jac.shape == (2, 3, 5, 2)
    torch.testing.assert_close(x, t.decoder(z))
    torch.testing.assert_close(jac[1, 2], torch.autograd.functional.jacobian(t.decoder, z[1, 2]))


def test_exact_nll_matches_autograd_jacobian_on_a_5_to_2_toy() -> None:
    torch.manual_seed(0)
    latent = perturb_parameters(flows.RealNVP(2, transforms=2, hidden=(8,)).double(), 0.3)
    model = flows.FreeFormInjectiveFlow(5, latent_features=2, latent=latent, hidden=(16, 16)).double()
    perturb_parameters(model.injective, 0.1)
    x = torch.randn(4, 5, dtype=f64)
    z = model.injective.encoder(x)
    want = latent.log_prob(z) - _half_log_det_gram_autograd(model.injective.decoder, z)
    torch.testing.assert_close(model.log_prob(x), want)
    # the inverse direction carries +½ log det(J_gᵀJ_g) at the latent point
    x_gen, volume = model.injective.inverse_and_log_det(z)
    torch.testing.assert_close(volume, _half_log_det_gram_autograd(model.injective.decoder, z))
    torch.testing.assert_close(x_gen, model.injective.decoder(z))


class _Graph(nn.Module):
    """Decoder t -> (t, h(t)) of a sine manifold, and its exact left inverse x -> x[..., :k]."""

    def __init__(self, manifold: SineManifold, encode: bool) -> None:
        super().__init__()
        self.manifold, self.encode = manifold, encode

    def forward(self, x: Tensor) -> Tensor:
        return x[..., : self.manifold.dim] if self.encode else self.manifold.embed(x)


@pytest.mark.parametrize("dim", [1, 2])
def test_exact_density_equals_the_closed_form_of_a_known_manifold(dim: int) -> None:
    manifold = SineManifold(dim)
    model = flows.FreeFormInjectiveFlow(
        dim + 1,
        latent_features=dim,
        encoder=_Graph(manifold, encode=True),
        decoder=_Graph(manifold, encode=False),
    ).double()
    x = manifold.sample(20, generator=torch.Generator().manual_seed(0), dtype=f64)
    torch.testing.assert_close(model.log_prob(x), manifold.log_prob(x))
    # samples and their fused log-density agree with log_prob (the encoder is an exact left inverse)
    torch.manual_seed(0)
    samples, log_p = model.sample_and_log_prob((10,))
    torch.testing.assert_close(model.log_prob(samples), log_p)
    assert manifold.distance(samples).max() < 1e-9


def test_density_on_a_curve_integrates_to_one_along_arc_length() -> None:
    manifold = SineManifold(1)
    model = flows.FreeFormInjectiveFlow(
        2, latent_features=1, encoder=_Graph(manifold, True), decoder=_Graph(manifold, False)
    ).double()
    t = torch.linspace(-9.0, 9.0, 200001, dtype=f64)
    points = manifold.embed(t[:, None])
    arc = torch.cat((torch.zeros(1, dtype=f64), (points[1:] - points[:-1]).norm(dim=-1).cumsum(0)))
    with torch.no_grad():
        total = torch.trapezoid(model.log_prob(points).exp(), arc)
    assert abs(float(total) - 1.0) < 1e-6


# -- FreeFormInjective: the FIF surrogate ---------------------------------------------------------


@pytest.mark.parametrize("jvp", ["double_backward", "forward"])
def test_surrogate_uses_the_encoder_jacobian_at_the_data_point(jvp: str) -> None:
    t = _free_form(jvp=jvp)
    x = torch.randn(3, 5, dtype=f64)
    generator = torch.Generator().manual_seed(5)
    z, x_rec, surrogate = t.surrogate(x, samples=2, generator=generator)
    probes = orthogonal_probes(z, 2, generator=torch.Generator().manual_seed(5))
    for i in range(3):
        jf = torch.autograd.functional.jacobian(t.encoder, x[i])  # (2, 5) at the data point
        jg = torch.autograd.functional.jacobian(t.decoder, z[i].detach())  # (5, 2)
        want = torch.einsum("ik,ij,jl,lk->", probes[i], jf, jg, probes[i]) / 2
        torch.testing.assert_close(surrogate[i], want)
        # at the reconstruction the encoder Jacobian differs: the check above can tell them apart
        jf_rec = torch.autograd.functional.jacobian(t.encoder, x_rec[i].detach())
        assert (jf_rec - jf).abs().max() > 1e-3
    torch.testing.assert_close(x_rec, t.decoder(t.encoder(x)))


def test_surrogate_jvp_modes_agree_in_value_and_gradient() -> None:
    values, grads = [], []
    for jvp in ("double_backward", "forward"):
        t = _free_form(jvp=jvp)
        x = torch.randn(4, 5, dtype=f64, generator=torch.Generator().manual_seed(1))
        _, x_rec, surrogate = t.surrogate(x, generator=torch.Generator().manual_seed(2))
        (surrogate.sum() + x_rec.square().sum()).backward()
        values.append(surrogate.detach())
        grads.append(torch.cat([p.grad.reshape(-1) for p in t.parameters()]))
    torch.testing.assert_close(values[0], values[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_surrogate_stops_the_gradient_into_the_decoder() -> None:
    t = _free_form()
    _, _, surrogate = t.surrogate(torch.randn(4, 5, dtype=f64))
    surrogate.sum().backward()
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in t.decoder.parameters())
    assert sum(p.grad.abs().sum() for p in t.encoder.parameters() if p.grad is not None) > 0


def _linear_pair(features: int, latent: int, seed: int = 0) -> tuple[FreeFormInjective, nn.Linear, nn.Linear]:
    """Encoder z = A x and decoder x = B z with A = B⁺ (both without bias)."""
    torch.manual_seed(seed)
    encoder = nn.Linear(features, latent, bias=False).double()
    decoder = nn.Linear(latent, features, bias=False).double()
    with torch.no_grad():
        encoder.weight.copy_(torch.linalg.pinv(decoder.weight))
    return FreeFormInjective(features, latent, encoder=encoder, decoder=decoder), encoder, decoder


def test_linear_case_is_exact_with_d_probes() -> None:
    """A = B⁺: the surrogate is tr(AB) = d and its gradient in A is ∇_A ½ log det(AAᵀ) = (A⁺)ᵀ = Bᵀ."""
    t, encoder, decoder = _linear_pair(5, 3)
    x = torch.randn(6, 5, dtype=f64)
    _, _, surrogate = t.surrogate(x, samples=3)
    torch.testing.assert_close(surrogate, torch.full((6,), 3.0, dtype=f64))
    (grad,) = torch.autograd.grad(surrogate.mean(), encoder.weight)
    a = encoder.weight.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(0.5 * torch.linalg.slogdet(a @ a.T).logabsdet, a)
    torch.testing.assert_close(grad, want)
    torch.testing.assert_close(grad, decoder.weight.detach().T)


def test_linear_case_single_probe_is_unbiased() -> None:
    """One probe per sample: the mean over many samples converges to d and to the exact gradient."""
    t, encoder, _ = _linear_pair(4, 2)
    n = 20000
    x = torch.randn(n, 4, dtype=f64)
    _, _, surrogate = t.surrogate(x, samples=1, generator=torch.Generator().manual_seed(0))
    standard_error = float(surrogate.detach().std()) / math.sqrt(n)
    assert abs(float(surrogate.detach().mean()) - 2.0) < 5 * standard_error + 1e-12
    (grad,) = torch.autograd.grad(surrogate.mean(), encoder.weight)
    a = encoder.weight.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(0.5 * torch.linalg.slogdet(a @ a.T).logabsdet, a)
    assert (grad - want).abs().max() < 0.1 * want.abs().max()


class _PseudoInverseEncoder(nn.Module):
    """z = B⁺ x with B the decoder's weight: the encoder is exactly the decoder's left inverse."""

    def __init__(self, decoder: nn.Linear) -> None:
        super().__init__()
        self.decoder = [decoder]  # not registered: the parameters belong to the decoder

    def forward(self, x: Tensor) -> Tensor:
        return x @ torch.linalg.pinv(self.decoder[0].weight).T


def test_linear_case_gradient_matches_half_log_det_of_the_decoder() -> None:
    """With A = B⁺(B), ∇_B(−surrogate) = ∇_B ½ log det(BᵀB): the volume term of the NLL."""
    torch.manual_seed(0)
    decoder = nn.Linear(3, 6, bias=False).double()
    t = FreeFormInjective(6, 3, encoder=_PseudoInverseEncoder(decoder), decoder=decoder)
    _, _, surrogate = t.surrogate(torch.randn(5, 6, dtype=f64), samples=3)
    (grad,) = torch.autograd.grad(-surrogate.mean(), decoder.weight)
    b = decoder.weight.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(0.5 * torch.linalg.slogdet(b.T @ b).logabsdet, b)
    torch.testing.assert_close(grad, want)


def test_full_dimensional_case_gradient_is_the_log_determinant_gradient() -> None:
    """d = D (free-form flow) with g = f⁻¹ exactly: ∇_A E[surrogate] = ∇_A log|det A|."""
    torch.manual_seed(0)
    encoder = nn.Linear(4, 4, bias=True).double()
    decoder = nn.Linear(4, 4, bias=False).double()
    with torch.no_grad():
        decoder.weight.copy_(torch.linalg.inv(encoder.weight))
    t = FreeFormInjective(4, 4, encoder=encoder, decoder=decoder)
    _, _, surrogate = t.surrogate(torch.randn(3, 4, dtype=f64), samples=4)
    (grad,) = torch.autograd.grad(surrogate.mean(), encoder.weight)
    a = encoder.weight.detach().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.linalg.slogdet(a).logabsdet, a)
    torch.testing.assert_close(grad, want)


# -- FreeFormInjectiveFlow -------------------------------------------------------------------------


def test_loss_terms_add_up_and_reach_every_parameter() -> None:
    torch.manual_seed(0)
    latent = flows.RealNVP(2, transforms=2, hidden=(8,))
    perturb_parameters(latent, 0.1)
    model = flows.FreeFormInjectiveFlow(3, latent_features=2, latent=latent, hidden=(16,), beta=3.0, noise_std=0.0)
    x = torch.randn(5, 3)
    terms = model.loss_terms(x, generator=torch.Generator().manual_seed(0))
    assert all(v.shape == (5,) for v in terms.values())
    torch.testing.assert_close(terms["loss"], 3.0 * terms["reconstruction"] + terms["nll_surrogate"])
    torch.testing.assert_close(terms["nll_surrogate"], -terms["log_prob_latent"] - terms["surrogate"])
    torch.testing.assert_close(terms["reconstruction"], (x - model.reconstruct(x)).square().sum(-1))
    torch.testing.assert_close(terms["log_prob_latent"], latent.log_prob(model.encode(x)))
    terms["loss"].mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_training_noise_is_applied_and_can_be_overridden() -> None:
    torch.manual_seed(0)
    model = flows.FreeFormInjectiveFlow(3, latent_features=1, hidden=(8,), noise_std=0.5)
    x = torch.randn(4, 3)
    clean = model.loss_terms(x, noise_std=0.0)["reconstruction"]
    torch.testing.assert_close(model.loss_terms(x, noise_std=0.0)["reconstruction"], clean)
    noisy = model.loss_terms(x, generator=torch.Generator().manual_seed(0))["reconstruction"]
    assert (noisy - clean).abs().max() > 1e-3


def test_sampling_decodes_latent_samples_on_the_manifold() -> None:
    torch.manual_seed(0)
    model = flows.FreeFormInjectiveFlow(3, latent_features=1, hidden=(8,))
    torch.manual_seed(1)
    x = model.sample((2, 4))
    torch.manual_seed(1)
    z = model.base.sample((2, 4))
    assert x.shape == (2, 4, 3) and not x.requires_grad
    torch.testing.assert_close(x, model.injective.decoder(z))


def test_conditional_model() -> None:
    torch.manual_seed(0)
    model = flows.FreeFormInjectiveFlow(3, 2, latent_features=1, hidden=(8,))
    x, c = torch.randn(4, 3), torch.randn(4, 2)
    assert model.loss(x, c).shape == (4,) and model.log_prob(x, c).shape == (4,)
    assert model.sample((5,), context=torch.randn(2)).shape == (5, 3)
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 2\), got None"):
        model.loss(x)


def test_state_dict_round_trip() -> None:
    torch.manual_seed(0)
    model = flows.FreeFormInjectiveFlow(3, latent_features=2, latent=flows.RealNVP(2, hidden=(8,)), hidden=(8,))
    torch.manual_seed(1)
    fresh = flows.FreeFormInjectiveFlow(3, latent_features=2, latent=flows.RealNVP(2, hidden=(8,)), hidden=(8,))
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(4, 3)
    assert torch.equal(fresh.log_prob(x), model.log_prob(x))


def test_short_training_puts_samples_on_the_sine_curve() -> None:
    """A few hundred steps on the FIF sine toy: on-manifold reconstruction and samples near the curve."""
    torch.manual_seed(0)
    manifold = SineManifold(1)
    data = manifold.sample(4096, generator=torch.Generator().manual_seed(0))
    model = flows.FreeFormInjectiveFlow(2, latent_features=1, hidden=(32, 32), noise_std=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(300):
        batch = data[torch.randint(len(data), (128,), generator=generator)]
        loss = model.loss(batch, generator=generator).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test = manifold.sample(500, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reconstruction = (model.reconstruct(test) - test).norm(dim=-1).mean()
        distance = manifold.distance(model.sample((500,)))
    assert reconstruction < 0.1
    assert distance.mean() < 0.2  # the target: ≤ 2 × the training noise level


def test_flow_rejects_bad_arguments_and_inputs() -> None:
    make = flows.FreeFormInjectiveFlow
    with pytest.raises(ValueError, match="expected ints 1 <= latent_features <= features, got features=2"):
        make(2, latent_features=3)
    with pytest.raises(ValueError, match="expected beta to be a finite number >= 0, got -1"):
        make(3, latent_features=1, beta=-1)
    with pytest.raises(ValueError, match="expected noise_std to be a finite number >= 0, got nan"):
        make(3, latent_features=1, noise_std=float("nan"))
    with pytest.raises(ValueError, match=r"expected 1 <= hutchinson_samples <= latent_features = 2, got 3"):
        make(3, latent_features=2, hutchinson_samples=3)
    with pytest.raises(ValueError, match=r"expected a latent flow with event shape \(2,\), got \(3,\)"):
        make(4, latent_features=2, latent=flows.RealNVP(3))
    with pytest.raises(TypeError, match="expected latent to be a Flow on R\\^2, got Affine"):
        make(4, latent_features=2, latent=flows.Affine(2))
    with pytest.raises(ValueError, match="expected jvp 'double_backward' or 'forward', got 'fd'"):
        make(3, latent_features=1, jvp="fd")
    model = make(3, latent_features=1, hidden=(4,))
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 3\), got \(2, 2\)"):
        model.loss(torch.randn(2, 2))
    with pytest.raises(ValueError, match="expected a finite input, got 1 NaN/Inf"):
        model.loss(torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(TypeError, match=r"expected input with dtype torch\.float32"):
        model.loss(torch.randn(2, 3, dtype=f64))
    bad = make(3, latent_features=1, encoder=nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"expected the encoder to return shape \(2, 1\), got \(2, 2\)"):
        bad.loss(torch.randn(2, 3))


def test_trainer_objective_trains_and_validates_with_the_exact_likelihood() -> None:
    from flows.train import FreeFormInjectiveObjective, Trainer

    torch.manual_seed(0)
    manifold = SineManifold(1)
    data = manifold.sample(640, generator=torch.Generator().manual_seed(0))
    model = flows.FreeFormInjectiveFlow(2, latent_features=1, hidden=(16,), noise_std=0.1)
    objective = FreeFormInjectiveObjective()
    before = objective.evaluate(model, [(data[512:],)])
    history = Trainer(model, objective, lr=3e-3, progress=False).fit(data[:512], data[512:], epochs=3, batch_size=64)
    record = history.last()
    assert {"loss", "reconstruction", "nll_surrogate", "val_loss", "val_reconstruction", "val_nll"} <= set(record)
    with torch.no_grad(), flows.evaluating(model):
        x = data[512:]
        reconstruction = (x - model.reconstruct(x)).square().sum(-1)
        nll = -model.log_prob(x)
    after = objective.evaluate(model, [(x[:64],), (x[64:],)])
    assert after["nll"] == pytest.approx(float(nll.mean()), rel=1e-5)
    assert after["loss"] == pytest.approx(float((model.beta * reconstruction + nll).mean()), rel=1e-5)
    assert record["val_loss"] == pytest.approx(after["loss"], rel=1e-5)
    assert after["loss"] < before["loss"]
