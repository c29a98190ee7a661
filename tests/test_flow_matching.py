"""Flow matching: the marginal field between two Gaussians, minibatch OT, NLL of a flow-matched CNF, trainer, CLI."""

from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import flows
from flows import CNF, Flow, StandardNormal
from flows.train import FlowMatching, NonFiniteGuard, Trainer
from flows.train.flow_matching import flow_matching_parts, ot_coupling


class PolyAffineField(nn.Module):
    r"""``f(t, y) = a(s) + B(s) y``, ``a`` and ``B`` Chebyshev polynomials of degree ``K-1`` in ``s``.

    Linear in its parameters, so the flow-matching loss is a quadratic whose minimiser one Newton
    step finds exactly; the family holds the marginal field of two Gaussians up to the polynomial
    approximation of its time dependence.
    """

    def __init__(self, features: int, degree: int, t0: float, t1: float) -> None:
        super().__init__()
        self.t0, self.t1, self.degree = t0, t1, degree
        self.a = nn.Parameter(torch.zeros(degree, features, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(degree, features, features, dtype=torch.float64))

    def basis(self, t: torch.Tensor) -> torch.Tensor:
        u = 2 * (t - self.t0) / (self.t1 - self.t0) - 1
        values = [torch.ones_like(u), u]
        while len(values) < self.degree:
            values.append(2 * u * values[-1] - values[-2])
        return torch.stack(values[: self.degree], -1)  # (N, K)

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        phi = self.basis(t.expand(y.shape[0]))
        return phi @ self.a + torch.einsum("nk,kij,nj->ni", phi, self.b, y)


def marginal_field(t, y, mu, a, sigma, t0, t1):
    r"""Closed-form marginal field of flow matching from data ``N(μ, diag a²)`` at ``t0`` to ``N(0, I)`` at ``t1``.

    With ``x_s = (1 - s) x + s z + σ ε`` (independent ``x``, ``z``, ``ε``), per coordinate
    ``x_s ~ N((1 - s) μ, v)``, ``v = (1 - s)² a² + s² + σ²``, and the conditional target
    ``u = (z - x)/(t1 - t0)`` is jointly Gaussian with it: ``E u = -μ/T``,
    ``Cov(u, x_s) = (s - (1 - s) a²)/T``. So ``E[u | x_s = y] = (-μ + (s - (1 - s) a²)(y - (1 - s) μ)/v)/T``.
    """
    s = ((t - t0) / (t1 - t0))[:, None]
    v = (1 - s) ** 2 * a**2 + s**2 + sigma**2
    return (-mu + (s - (1 - s) * a**2) * (y - (1 - s) * mu) / v) / (t1 - t0)


@pytest.mark.parametrize(("sigma", "time_power"), [(0.0, 1.0), (0.3, 1.0), (0.0, 1.5)])
def test_flow_matching_between_two_gaussians_recovers_the_closed_form_marginal_field(
    sigma: float, time_power: float
) -> None:
    t0, t1 = 0.5, 2.0
    mu = torch.tensor([1.0, -2.0], dtype=torch.float64)
    a = torch.tensor([0.5, 2.0], dtype=torch.float64)
    field = PolyAffineField(2, degree=6, t0=t0, t1=t1)
    flow = Flow(CNF(2, field=field, t0=t0, t1=t1), StandardNormal(2)).double()
    x = mu + a * torch.randn(100_000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    objective = FlowMatching(sigma=sigma, time_power=time_power)  # the times' law must not move the minimiser
    params = [field.a, field.b]

    def loss_and_grad():
        torch.manual_seed(1)  # the same base samples, times and noise at every evaluation
        loss = objective(flow, (x,))
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, create_graph=True)])

    grad = loss_and_grad()
    hessian = torch.stack(
        [torch.cat([h.reshape(-1) for h in torch.autograd.grad(g, params, retain_graph=True)]) for g in grad]
    )
    step = torch.linalg.solve(hessian, grad.detach())  # the loss is quadratic: one Newton step is the minimiser
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in params]) - step
        field.a.copy_(flat[: field.a.numel()].reshape(field.a.shape))
        field.b.copy_(flat[field.a.numel() :].reshape(field.b.shape))
    assert float(loss_and_grad().detach().abs().max()) < 1e-8

    s = torch.linspace(0.05, 0.95, 19, dtype=torch.float64)
    t = (t0 + s * (t1 - t0)).repeat_interleave(9)
    spread = torch.linspace(-1.5, 1.5, 9, dtype=torch.float64).repeat(19)[:, None]
    sd = ((1 - s[:, None]) ** 2 * a**2 + s[:, None] ** 2 + sigma**2).sqrt().repeat_interleave(9, 0)
    y = (1 - s).repeat_interleave(9)[:, None] * mu + spread * sd  # within 1.5 sd of the path's marginal mean
    with torch.no_grad():
        learned = field(t, y)
    expected = marginal_field(t, y, mu, a, sigma, t0, t1)
    # |field| reaches 3.3 here; the error (0.03-0.04 at the edges) is the sampling error of 1e5 pairs,
    # up to 0.06 near s = 0.8 when time_power = 1.5 leaves fewer pairs at late times.
    atol = 0.06 if time_power == 1.0 else 0.075
    assert torch.allclose(learned, expected, atol=atol, rtol=0.0), float((learned - expected).abs().max())
    # The field of the other direction (noise at t0, data at t1) is far from it: the test can fail.
    assert float((learned + expected).abs().max()) > 0.5


def test_time_power_draws_times_as_powers_of_uniforms_and_is_validated() -> None:
    t0, t1 = 0.5, 2.0
    seen: list[torch.Tensor] = []

    class Recording(nn.Module):
        def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            seen.append(t)
            return torch.zeros_like(y)

    flow = Flow(CNF(1, field=Recording(), t0=t0, t1=t1), StandardNormal(1))
    x = torch.randn(200_000, 1)
    quantiles = torch.tensor([0.01, 0.1, 0.25, 0.5, 0.9])
    for power in (1.0, 3.0):
        seen.clear()
        torch.manual_seed(0)
        FlowMatching(time_power=power)(flow, (x,))
        s = (seen[0] - t0) / (t1 - t0)
        cdf = (s[:, None] <= quantiles).double().mean(0)
        # P(u^p <= q) = q^(1/p); at p = 3 that is 0.22 at q = 0.01, against 0.01 for uniform times.
        assert torch.allclose(cdf, quantiles.double() ** (1 / power), atol=5e-3), (power, cdf)
    assert "time_power=3" in repr(FlowMatching(time_power=3.0)) and "time_power" not in repr(FlowMatching())
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="expected time_power to be a finite number > 0"):
            FlowMatching(time_power=bad)


class Probe(nn.Module):
    """A field that outputs zeros and records its inputs; the loss's gradient on its output gives the target."""

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.t, self.y = t, y
        self.out = torch.zeros_like(y, requires_grad=True)
        return self.out


def _targets(objective: FlowMatching, flow: Flow, x: torch.Tensor, seed: int = 0):
    """``(s, x_t, u)`` of one flow-matching batch: ``u`` from ``dL/df = 2 (f - u) / N`` at ``f = 0``."""
    torch.manual_seed(seed)
    loss = objective(flow, (x,))
    loss.backward()
    cnf = flow_matching_parts(flow)[1]
    probe = cnf.field
    s = (probe.t - cnf.t0) / (cnf.t1 - cnf.t0)
    return s, probe.y, -0.5 * len(x) * probe.out.grad


def _posterior_velocity_by_quadrature(y, s, rows, sigma, span):
    """``E[(z - r)/span | x_t = y]`` for ``r`` uniform on ``rows`` and ``z ~ N(0, I)`` in 2-D, on a grid of ``z``.

    ``x_t = (1 - s) r + s z + σ ε``: ``p(r_j, z | y) ∝ N(z; 0, I) N(y - (1 - s) r_j - s z; 0, σ² I)``.
    """
    g = torch.linspace(-8, 8, 641, dtype=torch.float64)
    z = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)  # (G, 2)
    log_prior = -0.5 * z.square().sum(-1)
    out = []
    for yi, si in zip(y, s, strict=True):
        resid = yi - (1 - si) * rows[:, None, :] - si * z[None]  # (M, G, 2)
        log_w = log_prior[None] - 0.5 * resid.square().sum(-1) / sigma**2
        w = torch.softmax(log_w.reshape(-1), 0).reshape(log_w.shape)
        out.append(((z[None] - rows[:, None, :]) * w[..., None]).sum((0, 1)) / span)
    return torch.stack(out)


@pytest.mark.parametrize("with_reference", [False, True])
def test_the_stable_target_is_the_posterior_mean_of_the_velocity(with_reference: bool) -> None:
    t0, t1, sigma = 0.5, 2.0, 0.3
    flow = Flow(CNF(2, field=Probe(), t0=t0, t1=t1), StandardNormal(2)).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, generator=gen, dtype=torch.float64) * 1.5
    extra = torch.randn(4, 2, generator=gen, dtype=torch.float64) if with_reference else None
    objective = FlowMatching(sigma=sigma, velocity="stable", reference=extra, time_power=0.7)
    s, y, u = _targets(objective, flow, x, seed=3)
    rows = x if extra is None else torch.cat([x, extra])  # the batch is always part of the reference
    expected = _posterior_velocity_by_quadrature(y.detach(), s, rows, sigma, t1 - t0)
    assert torch.allclose(u, expected, atol=1e-7, rtol=0), float((u - expected).abs().max())
    # the conditional target (each pair's own velocity) differs from it: the test can fail
    _, _, conditional = _targets(FlowMatching(sigma=sigma, time_power=0.7), flow, x, seed=3)
    assert float((conditional - expected).abs().max()) > 0.1


def test_the_stable_target_at_sigma_zero_and_its_limit_at_the_data() -> None:
    flow = Flow(CNF(2, field=Probe()), StandardNormal(2)).double()
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s, y, u = _targets(FlowMatching(velocity="stable"), flow, x)
    # sigma = 0: the state fixes z given the row, z_j = (y - (1 - s) r_j)/s, and p(r_j | y) ∝ N(y; (1 - s) r_j, s²)
    keep = (1 - s)[:, None, None]
    z = (y[:, None] - keep * x[None]) / s[:, None, None]  # (N, M, 2)
    w = torch.softmax(-(y[:, None] - keep * x[None]).square().sum(-1) / (2 * s[:, None] ** 2), -1)
    expected = ((z - x[None]) * w[..., None]).sum(1)
    assert torch.allclose(u, expected.detach(), atol=1e-9, rtol=0)
    # times at the data end itself (s = u^p underflows to exactly 0): the limit, each pair's own z - x
    _, _, at_data = _targets(FlowMatching(velocity="stable", time_power=1e6), flow, x, seed=5)
    s_zero, _, own = _targets(FlowMatching(time_power=1e6), flow, x, seed=5)
    assert bool((s_zero == 0).all()) and torch.equal(at_data, own) and bool(torch.isfinite(at_data).all())


def test_the_stable_target_has_a_far_smaller_variance_than_the_conditional_one() -> None:
    flow = Flow(CNF(2, field=Probe()), StandardNormal(2)).double()
    gen = torch.Generator().manual_seed(2)
    centres = torch.tensor([[-2.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    x = centres[torch.randint(2, (512,), generator=gen)] + 0.1 * torch.randn(512, 2, generator=gen, dtype=torch.float64)
    errors = {}
    for target in ("conditional", "stable"):
        u = _targets(FlowMatching(sigma=0.05, velocity=target), flow, x)[2]
        stable = _targets(FlowMatching(sigma=0.05, velocity="stable", reference=x), flow, x)[2]
        errors[target] = float((u - stable).square().sum(-1).mean())  # spread about a 1024-row posterior mean
    # a 512-row reference is close to the 1024-row one; single pairs scatter about it by O(1) per coordinate
    assert errors["stable"] < 0.05 * errors["conditional"], errors


def test_the_stable_target_maps_its_reference_through_the_fixed_layers_in_front() -> None:
    from flows.bijections import Chain, Standardize

    gen = torch.Generator().manual_seed(4)
    x = 3 + 2 * torch.randn(8, 2, generator=gen, dtype=torch.float64)
    reference = 3 + 2 * torch.randn(16, 2, generator=gen, dtype=torch.float64)
    front = Standardize.fit(torch.cat([x, reference])).double()
    with_front = Flow(Chain(front, CNF(2, field=Probe())), StandardNormal(2)).double()
    plain = Flow(CNF(2, field=Probe()), StandardNormal(2)).double()
    objective = FlowMatching(sigma=0.1, velocity="stable", reference=reference)
    u = _targets(objective, with_front, x)[2]
    with torch.no_grad():
        mapped, mapped_reference = front(x), front(reference)
    expected = _targets(FlowMatching(sigma=0.1, velocity="stable", reference=mapped_reference), plain, mapped)[2]
    assert torch.allclose(u, expected, atol=1e-12)
    unmapped = _targets(FlowMatching(sigma=0.1, velocity="stable", reference=reference), plain, mapped)[2]
    assert float((unmapped - expected).abs().max()) > 1e-3


def test_the_stable_target_is_validated() -> None:
    x = torch.randn(8, 2)
    flow = Flow(CNF(2, hidden=(4,)), StandardNormal(2))
    with pytest.raises(ValueError, match="expected velocity in"):
        FlowMatching(velocity="marginal")
    with pytest.raises(ValueError, match='reference and reference_size are for velocity="stable"'):
        FlowMatching(reference=x)
    with pytest.raises(ValueError, match='reference and reference_size are for velocity="stable"'):
        FlowMatching(reference_size=4)
    with pytest.raises(ValueError, match='needs coupling="independent"'):
        FlowMatching(velocity="stable", coupling="ot")
    with pytest.raises(TypeError, match=r"expected reference to be a floating-point tensor, got dtype torch\.int64"):
        FlowMatching(velocity="stable", reference=torch.ones(4, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point tensor, got list"):
        FlowMatching(velocity="stable", reference=[[0.0, 1.0]])
    for shape in ((0, 2), (5,)):
        with pytest.raises(ValueError, match=r"expected reference rows of shape \(M >= 1, \*event\)"):
            FlowMatching(velocity="stable", reference=torch.zeros(shape))
    bad = torch.zeros(5, 2)
    bad[1, 0], bad[3, 1] = math.nan, math.inf
    with pytest.raises(ValueError, match="expected finite reference rows, got 2 with NaN or Inf"):
        FlowMatching(velocity="stable", reference=bad)
    for size in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="expected reference_size to be an integer >= 1"):
            FlowMatching(velocity="stable", reference=x, reference_size=size)
    with pytest.raises(ValueError, match=r"expected reference rows of event shape \(2,\) \(as the data\), got \(3,\)"):
        FlowMatching(velocity="stable", reference=torch.zeros(4, 3))(flow, (x,))
    with pytest.raises(ValueError, match='velocity="stable" does not support a context'):
        conditional = Flow(CNF(2, context=1, hidden=(4,)), StandardNormal(2))
        FlowMatching(velocity="stable")(conditional, (x, torch.zeros(8, 1)))
    with pytest.raises(TypeError, match=r"needs a StandardNormal base .* got DiagNormal"):
        FlowMatching(velocity="stable")(Flow(CNF(2, hidden=(4,)), flows.DiagNormal(2)), (x,))
    assert repr(FlowMatching(velocity="stable", reference=x, reference_size=3)) == (
        "FlowMatching(sigma=0, coupling='independent', velocity='stable', reference=8 rows, reference_size=3, "
        "eval_nll=False)"
    )
    assert "velocity" not in repr(FlowMatching())


def test_minibatch_ot_agrees_with_brute_force_over_permutations() -> None:
    generator = torch.Generator().manual_seed(3)
    for _ in range(5):
        x = torch.randn(6, 2, generator=generator, dtype=torch.float64)
        z = torch.randn(6, 2, generator=generator, dtype=torch.float64)
        x_out, z_out = ot_coupling(x, z)
        assert torch.equal(x_out, x)
        best = min(((x - z[list(p)]).square().sum(), p) for p in itertools.permutations(range(6)))  # 720 permutations
        assert torch.equal(z_out, z[list(best[1])])
        assert float((x - z_out).square().sum()) == pytest.approx(float(best[0]), abs=1e-12)


def test_couplings_pair_within_context_groups_and_callables_are_checked() -> None:
    torch.manual_seed(0)
    flow = Flow(CNF(2, 1, hidden=(8,)), StandardNormal(2), context=1)
    x = torch.randn(12, 2)
    context = torch.tensor([0.0, 1.0] * 6)[:, None]
    seen: list[torch.Tensor] = []

    def recording(x, z):
        seen.append(x)
        return ot_coupling(x, z)

    loss = FlowMatching(coupling=recording)(flow, (x, context))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert [len(rows) for rows in seen] == [6, 6]  # one assignment per context value
    assert torch.equal(seen[0], x[0::2]) and torch.equal(seen[1], x[1::2])
    loss.backward()
    assert all(p.grad is not None for p in flow.parameters())

    with pytest.raises(TypeError, match=r"expected the coupling to return shapes \(12, 2\) and \(12, 2\), got"):
        FlowMatching(coupling=lambda x, z: (x[:3], z))(Flow(CNF(2, hidden=(8,)), StandardNormal(2)), (x,))
    with pytest.raises(ValueError, match="expected coupling in"):
        FlowMatching(coupling="sinkhorn")
    with pytest.raises(ValueError, match=r"expected sigma to be a finite number >= 0 and <= 1e\+150, got -0\.1"):
        FlowMatching(sigma=-0.1)


def test_flow_matching_refuses_flows_without_exactly_one_cnf() -> None:
    with pytest.raises(TypeError, match=r"expected a Flow whose transform is one CNF .*got \[Affine\]"):
        FlowMatching()(Flow(flows.Affine(2), StandardNormal(2)), (torch.randn(4, 2),))
    with pytest.raises(TypeError, match=r"got \[CNF, CNF\]"):
        FlowMatching()(flows.FFJORD(2, transforms=2, hidden=(8,)), (torch.randn(4, 2),))
    with pytest.raises(
        TypeError, match="expected the layers before the CNF to have no trainable parameters, got Affine"
    ):
        flow_matching_parts(Flow(flows.Chain(flows.Affine(2), CNF(2, hidden=(8,))), StandardNormal(2)))
    with pytest.raises(TypeError, match="expected a Flow whose transform is a CNF, got CNF"):
        FlowMatching()(CNF(2, hidden=(8,)), (torch.randn(4, 2),))


@pytest.mark.parametrize("stable", [False, True])
def test_a_flow_matched_cnf_reaches_the_analytic_nll_of_a_2d_gaussian(stable: bool) -> None:
    torch.manual_seed(0)
    mean = torch.tensor([1.0, -0.5], dtype=torch.float64)
    cov = torch.tensor([[1.5, 0.6], [0.6, 0.5]], dtype=torch.float64)
    target = torch.distributions.MultivariateNormal(mean, cov)
    flow = Flow(CNF(2, hidden=(32,), rtol=1e-6, atol=1e-6), StandardNormal(2)).double()
    objective = FlowMatching()
    if stable:  # the stable target, over the batch and 512 of 8192 reference rows drawn each step
        objective = FlowMatching(velocity="stable", reference=target.sample((8192,)), reference_size=512)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 800)
    for _ in range(800):  # about 2 ms a step: no ODE solve in training
        loss = objective(flow, (target.sample((256,)),))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    x = target.sample((2000,))
    with torch.no_grad(), flows.evaluating(flow):
        nll = -flow.log_prob(x)
    exact = -target.log_prob(x)
    # Same samples: the difference is a low-variance estimate of KL(p || q) >= 0.
    assert abs(float(nll.mean() - exact.mean())) < 0.02, (float(nll.mean()), float(exact.mean()))
    entropy = 0.5 * math.log(torch.linalg.det(2 * math.pi * math.e * cov).item())
    assert float(exact.mean()) == pytest.approx(entropy, abs=0.05)


def _fm_trainer(checkpoint: Path | None = None, objective: FlowMatching | None = None, **kwargs) -> Trainer:
    torch.manual_seed(0)
    flow = Flow(CNF(2, hidden=(8,), rtol=1e-4, atol=1e-4), StandardNormal(2))
    objective = objective or FlowMatching(sigma=0.1, coupling="ot", eval_nll=True)
    return Trainer(flow, objective, lr=1e-2, checkpoint=checkpoint, **kwargs)


@pytest.mark.parametrize("velocity", ["conditional", "stable"])
def test_trainer_resumes_flow_matching_exactly_and_validates_with_the_ode(tmp_path: Path, velocity: str) -> None:
    x = torch.randn(120, 2, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 0.3])
    make = _fm_trainer
    if velocity == "stable":  # its reference rows are drawn by the global generator, which checkpoints save
        objective = FlowMatching(sigma=0.1, velocity="stable", reference=x[:100], reference_size=16, eval_nll=True)
        make = functools.partial(_fm_trainer, objective=objective)
    full = make()
    full.fit(x[:100], x[100:], epochs=3, batch_size=25)
    reference = {k: v.clone() for k, v in full.model.state_dict().items()}
    assert {"val_loss", "val_nll"} <= set(full.history.columns)
    assert all(math.isfinite(v) for v in full.history["val_nll"])

    first = make(tmp_path / "run.ckpt")
    first.fit(x[:100], x[100:], epochs=3, batch_size=25, max_steps=6)
    torch.manual_seed(123)  # the resumed process starts with different random state
    resumed = make(tmp_path / "run.ckpt").resume()
    assert resumed.step == 6
    resumed.fit(x[:100], x[100:], epochs=3, batch_size=25)
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, reference[name]), name
    assert resumed.history["val_loss"][-1] == full.history["val_loss"][-1]


def test_a_nan_row_stops_training_with_its_index_instead_of_being_dropped_by_the_nan_guard() -> None:
    x = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    x[30] = math.nan  # row 5 of the second batch of 25
    guard = NonFiniteGuard(max_consecutive=3)
    trainer = _fm_trainer(guard=guard)
    trainer.objective = FlowMatching()
    with pytest.raises(
        ValueError,
        match=r"FlowMatching: expected a finite input, got 2 NaN/Inf value\(s\), the first at index \(5, 0\)",
    ):
        trainer.fit(x, epochs=1, batch_size=25, shuffle=False)
    assert guard.skipped == 0  # refused, not skipped as a "non-finite step"


def test_cli_fit_with_flow_matching_on_a_cnf_and_refusal_for_other_models(tmp_path: Path, capsys) -> None:
    from flows.cli import main

    pytest.importorskip("sklearn")
    tiny = ["--data", "moons", "--epochs", "1", "--hidden", "8", "--threads", "1", "--no-plots"]
    out = tmp_path / "fm"
    code = main(
        [
            "fit",
            *tiny,
            "--model",
            "FFJORD",
            "--transforms",
            "1",
            "--objective",
            "fm",
            "--coupling",
            "ot",
            "--sigma",
            "0.05",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "test log-likelihood:" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file()
    stable = ["--model", "FFJORD", "--transforms", "1", "--objective", "fm", "--velocity", "stable", "--sigma", "0.05"]
    code = main(["fit", *tiny, *stable, "--reference-size", "64", "--time-power", "2", "--out", str(tmp_path / "st")])
    assert code == 0 and (tmp_path / "st" / "model.safetensors").is_file()
    capsys.readouterr()
    code = main(["fit", *tiny, *stable, "--coupling", "ot", "--out", str(tmp_path / "st-ot")])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and 'velocity="stable" needs coupling="independent"' in error
    # flow-matching flags that the run would ignore are refused, not dropped
    for flags, expected in (
        (["--sigma", "0.1"], "--sigma 0.1: expected flow-matching flags only with --objective fm, got --objective ml"),
        (["--velocity", "stable", "--time-power", "2"], "--velocity stable, --time-power 2.0: expected flow-matching"),
        (
            ["--objective", "fm", "--reference-size", "64"],
            "--reference-size 64: expected it only with --velocity stable",
        ),
    ):
        code = main(["fit", *tiny, "--model", "FFJORD", "--transforms", "1", *flags, "--out", str(tmp_path / "x")])
        assert code == 2, flags
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and expected in error, error
    code = main(["fit", *tiny, "--model", "RealNVP", "--objective", "fm", "--out", str(tmp_path / "nvp")])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--objective fm trains a continuous flow" in error


def test_benchmark_smoke(capsys, tmp_path: Path) -> None:
    from tests.scripts import run_script

    pytest.importorskip("sklearn")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "flow_matching.py"
    main = run_script(str(path), run_name="benchmark")["main"]
    argv = [
        "--budget",
        "0.3",
        "--eval-every",
        "0.15",
        "--limit",
        "100",
        "--hidden",
        "8",
        "--contenders",
        "ml",
        "fm",
        "fm-ot:16",
        "fm-stable:16",
        "--fm-reference-size",
        "32",
        "--cosine",
        "--plot",
        str(tmp_path / "curves.png"),
    ]
    summary = main(argv)
    assert len(summary) == 4 and all(math.isfinite(r["test_nll"]) for r in summary.values())
    ml = summary["FFJORD, maximum likelihood (exact)"]
    assert ml["reach_ratio"] <= 1.0 and ml["test_delta"] == 0.0
    stable = summary["FFJORD, flow matching (stable target, σ=0, 16)"]
    assert stable["test_delta"] == pytest.approx(stable["test_nll"] - ml["test_nll"], abs=1e-5)
    assert "medians over seeds [0]" in capsys.readouterr().out
    assert (tmp_path / "curves.png").stat().st_size > 1000


# -- the checks of Flow.log_prob, and the options (issue 27) --------------------------------------
def _bad_batches() -> list:
    x = torch.randn(6, 2)
    nan_row = x.clone()
    nan_row[3, 1] = math.nan
    return [
        ((x[:0],), ValueError, r"expected a batch of at least one row, got data of shape \(0, 2\)"),
        ((x[0],), ValueError, r"expected data of shape \(N, \*event\) with 1 event dimension\(s\), got shape \(2,\)"),
        ((torch.randn(6, 3),), ValueError, r"expected input of shape \(\*batch, 2\), got \(6, 3\)"),
        ((torch.ones(6, 2, dtype=torch.long),), TypeError, r"expected a floating-point input, got dtype torch.int64"),
        ((nan_row,), ValueError, r"expected a finite input, got 1 NaN/Inf value\(s\), the first at index \(3, 1\)"),
        ((x, torch.randn(6, 1)), ValueError, "expected no context for Flow, which takes none"),
    ]


@pytest.mark.parametrize(("batch", "error", "match"), _bad_batches())
def test_flow_matching_refuses_what_maximum_likelihood_refuses(batch: tuple, error: type, match: str) -> None:
    from flows.train import MaximumLikelihood

    flow = Flow(CNF(2, hidden=(8,)), StandardNormal(2))
    with pytest.raises(error, match=match):
        FlowMatching()(flow, batch)
    with pytest.raises(error):  # the same class of error from the same checks
        MaximumLikelihood()(flow, batch)


def test_flow_matching_checks_the_context_of_a_conditional_cnf() -> None:
    flow = Flow(CNF(2, 1, hidden=(8,)), StandardNormal(2), context=1)
    x, c = torch.randn(6, 2), torch.randn(6, 1)
    assert torch.isfinite(FlowMatching()(flow, (x, c)))
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 1\), got None"):
        FlowMatching()(flow, (x,))
    with pytest.raises(TypeError, match="context"):
        FlowMatching()(flow, (x, torch.ones(6, 1, dtype=torch.long)))
    bad = c.clone()
    bad[2] = math.nan
    with pytest.raises(
        ValueError, match=r"expected a finite context, got 1 NaN/Inf value\(s\), the first at index \(2, 0\)"
    ):
        FlowMatching()(flow, (x, bad))
    # a flow without a declared context width: the CNF's own width decides, as in its solve
    unconditional = Flow(CNF(2, hidden=(8,)), StandardNormal(2))
    with pytest.raises(ValueError, match="expected no context"):
        FlowMatching()(unconditional, (x, c))


def test_flow_matching_refuses_rnode_weights_it_would_not_add() -> None:
    flow = Flow(CNF(2, hidden=(8,), kinetic=0.1), StandardNormal(2))
    with pytest.raises(
        ValueError, match=r"RNODE weights \(kinetic=0.1, jacobian=0\), which flow matching does not add"
    ):
        FlowMatching()(flow, (torch.randn(4, 2),))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"sigma": 1e300}, ValueError, r"expected sigma to be a finite number >= 0 and <= 1e\+150, got 1e\+300"),
        ({"sigma": math.inf}, ValueError, "expected sigma to be a finite number"),
        ({"sigma": math.nan}, ValueError, "expected sigma to be a finite number"),
        ({"sigma": "0.1"}, TypeError, "expected sigma to be a real number, got str"),
        ({"time_power": True}, TypeError, "expected time_power to be a real number, got bool"),
        ({"eval_nll": 1}, TypeError, "expected eval_nll to be a bool"),
        ({"eval_seed": 0.5}, TypeError, "expected eval_seed to be an int, got 0.5"),
        ({"velocity": "stable", "reference_size": 4}, ValueError, "reference_size draws rows from reference, got"),
    ],
)
def test_flow_matching_options_out_of_domain(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FlowMatching(**options)


def test_a_sigma_that_overflows_the_data_dtype_is_an_error_not_a_skipped_step() -> None:
    flow = Flow(CNF(2, hidden=(8,)), StandardNormal(2))
    with pytest.raises(ValueError, match=r"overflow torch.float32 with sigma=1e\+100"):
        FlowMatching(sigma=1e100)(flow, (torch.randn(4, 2),))
