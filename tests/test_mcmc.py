"""MCMC kernel oracles (docs/mcmc.md): perfect flows, stationarity, detailed balance, funnel, adaptation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy import stats

from flows import Affine, Flow, RealNVP, StandardNormal
from flows.mcmc import (
    HMC,
    IMH,
    ISIR,
    MALA,
    CountingTarget,
    GlobalLocal,
    Kernel,
    NeuTra,
    PullbackTarget,
    RandomWalk,
    State,
    StepInfo,
    metropolis_accept,
    sample,
)
from flows.mcmc.base import FlowWatch, _keep_rejected, _select
from flows.metrics import mode_weights
from flows.targets import Funnel, GaussianMixture
from flows.testing import check_bijection
from tests.mcmc_support import (
    FunnelTransport,
    Gaussian,
    ThreeStates,
    correlated_gaussian,
    discrete_flow,
    imperfect_flow,
    perfect_flow,
)

# -- perfect flows ------------------------------------------------------------------------------


def test_imh_with_perfect_flow_accepts_every_proposal() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    kernel = IMH(target, perfect_flow(target))
    start = 5.0 * torch.randn(64, 3, dtype=torch.float64)  # anywhere: w = pi / q is constant
    trace = sample(kernel, start, 20)
    assert trace.accepted.all()
    assert float(trace.accept_prob.min()) > 1 - 1e-9


def test_imh_with_imperfect_flow_rejects_some_proposals() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    trace = sample(IMH(target, imperfect_flow(target)), target.sample(256), 10)
    assert 0.3 < trace.acceptance_rate() < 0.99


def test_neutra_latent_target_of_perfect_flow_is_standard_normal() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    latent = PullbackTarget(target, perfect_flow(target))
    z = torch.randn(50, 3, dtype=torch.float64)
    energy, grad = latent.energy_and_grad(z)
    constant = -float(target.scale_tril.diagonal().log().sum())  # -log|det L|
    torch.testing.assert_close(energy, 0.5 * z.square().sum(-1) + constant)
    torch.testing.assert_close(grad, z)
    torch.testing.assert_close(latent.energy(z), energy)
    assert latent.log_Z == target.log_Z


def test_pullback_exact_samples_are_the_flow_latents_of_exact_target_samples() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    latent = PullbackTarget(target, perfect_flow(target))
    assert latent.has_exact_sampler
    z = latent.sample(4000)
    assert z.shape == (4000, 3)
    assert (z.mean(0).abs() < 5 / math.sqrt(4000)).all()
    assert ((torch.cov(z.T) - torch.eye(3, dtype=z.dtype)).abs() < 5 * math.sqrt(2 / 4000)).all()
    assert PullbackTarget(two_modes(), Flow(Affine(2), StandardNormal(2)).double()).has_exact_sampler
    assert not PullbackTarget(ThreeStates(torch.ones(3) / 3), discrete_flow(torch.ones(3) / 3)).has_exact_sampler


def test_pullback_gradient_matches_autograd_through_the_energy() -> None:
    torch.manual_seed(0)
    target = Funnel(4).double()
    flow = Flow(FunnelTransport(4, a=2.0, b=0.7), StandardNormal(4)).double()
    latent = PullbackTarget(target, flow)
    z = torch.randn(6, 4, dtype=torch.float64)
    energy, grad = latent.energy_and_grad(z)
    energy_ag, grad_ag = latent.energy_and_grad(z, create_graph=True)  # plain autograd path
    torch.testing.assert_close(energy, energy_ag.detach())
    torch.testing.assert_close(grad, grad_ag.detach())
    log_prob, grad_lp = latent.log_prob_and_grad(z)  # the path MALA and HMC take
    torch.testing.assert_close(log_prob, -energy_ag.detach())
    torch.testing.assert_close(grad_lp, -grad_ag.detach())
    assert not log_prob.requires_grad and not grad_lp.requires_grad


def test_neutra_chain_latent_is_standard_normal_with_perfect_flow() -> None:
    torch.manual_seed(1)
    target = correlated_gaussian()
    kernel = NeuTra(target, perfect_flow(target), step_size=0.5, adapt_step_size=False)
    trace = sample(kernel, torch.zeros(2000, 3, dtype=torch.float64), 30)
    z = kernel.latent_state(trace.state).x
    n = z.shape[0]
    assert (z.mean(0).abs() < 5 / math.sqrt(n)).all()
    assert ((torch.cov(z.T) - torch.eye(3, dtype=z.dtype)).abs() < 5 * math.sqrt(2 / n)).all()
    # the data-side chain state is T(z) with log pi consistent with the target
    torch.testing.assert_close(trace.state.x, kernel.latent.to_data(z)[0])
    torch.testing.assert_close(trace.state.log_prob, -target.energy(trace.state.x))


def two_modes() -> GaussianMixture:
    """Equal mixture of N(±(3, 3), I) in 2-D."""
    return GaussianMixture(torch.tensor([[3.0, 3.0], [-3.0, -3.0]])).double()


# -- stationarity from exact samples -----------------------------------------------------------


def _moments_agree(x: torch.Tensor, target: Gaussian, sigmas: float = 5.0) -> bool:
    """Sample mean and covariance within ``sigmas`` standard errors of the exact ones, entrywise."""
    n = x.shape[0]
    cov = target.cov
    var = cov.diagonal()
    mean_ok = ((x.mean(0) - target.mean).abs() <= sigmas * (var / n).sqrt()).all()
    cov_se = ((var[:, None] * var[None, :] + cov.square()) / n).sqrt()
    cov_ok = ((torch.cov(x.T) - cov).abs() <= sigmas * cov_se).all()
    return bool(mean_ok and cov_ok)


def _kernels(target: Gaussian) -> dict[str, Kernel]:
    fixed = {"adapt_step_size": False}
    return {
        "RandomWalk": RandomWalk(target, 0.8, **fixed),
        "MALA": MALA(target, 0.3, **fixed),
        "HMC": HMC(target, 0.3, 5, **fixed),
        "IMH": IMH(target, imperfect_flow(target)),
        "ISIR": ISIR(target, imperfect_flow(target), n_proposals=3),
        "NeuTra-MALA": NeuTra(target, imperfect_flow(target), step_size=0.6, **fixed),
        "NeuTra-HMC": NeuTra(target, imperfect_flow(target), inner=HMC, step_size=0.5, leapfrog_steps=3, **fixed),
        "GlobalLocal-IMH-MALA": GlobalLocal(
            IMH(target, imperfect_flow(target)), MALA(target, 0.3, **fixed), local_steps=2
        ),
        "GlobalLocal-ISIR-HMC": GlobalLocal(
            ISIR(target, imperfect_flow(target), n_proposals=2), HMC(target, 0.3, 3, **fixed), local_steps=1
        ),
        "GlobalLocal-IMH-RandomWalk": GlobalLocal(
            IMH(target, imperfect_flow(target)), RandomWalk(target, 0.8, **fixed), local_steps=2
        ),
        "GlobalLocal-IMH-NeuTra": GlobalLocal(
            IMH(target, imperfect_flow(target)), NeuTra(target, imperfect_flow(target), step_size=0.6, **fixed)
        ),
    }


@pytest.mark.parametrize("name", list(_kernels(correlated_gaussian())))
def test_chains_started_from_exact_samples_stay_stationary(name: str) -> None:
    torch.manual_seed(2)
    target = correlated_gaussian()
    kernel = _kernels(target)[name]
    start = target.sample(4000)
    assert _moments_agree(start, target)
    trace = sample(kernel, start, 15)
    assert trace.accepted.float().mean() > 0.1, "a kernel that never moves would pass trivially"
    assert _moments_agree(trace.state.x, target)
    torch.testing.assert_close(trace.state.log_prob, -target.energy(trace.state.x))
    if trace.state.grad is not None:
        torch.testing.assert_close(trace.state.grad, -target.energy_and_grad(trace.state.x)[1])


@pytest.mark.parametrize("name", list(_kernels(correlated_gaussian())))
def test_a_step_leaves_the_old_state_intact_and_keeps_rejected_rows(name: str) -> None:
    torch.manual_seed(3)
    target = correlated_gaussian()
    kernel = _kernels(target)[name]
    state = kernel.init(target.sample(200))
    if isinstance(kernel, (MALA, HMC)):
        state, _ = kernel.step(state)  # a state with a cached gradient
    before = [t.clone() for t in (state.x, state.log_prob) + ((state.grad,) if state.grad is not None else ())]
    new, info = kernel.step(state)
    after = [state.x, state.log_prob] + ([state.grad] if state.grad is not None else [])
    for old, now in zip(before, after, strict=True):
        assert torch.equal(old, now), "a kernel wrote into the state it was given"
    if name.startswith("GlobalLocal"):
        return  # its report is the flow move's; local moves follow it in the same step
    assert 0 < int(info.accepted.sum()) < 200, "both outcomes must occur for the check to bite"
    stayed = ~info.accepted
    assert torch.equal(new.x[stayed], state.x[stayed])
    assert torch.equal(new.log_prob[stayed], state.log_prob[stayed])
    assert not torch.equal(new.x[info.accepted], state.x[info.accepted])
    if new.grad is not None and state.grad is not None:
        assert torch.equal(new.grad[stayed], state.grad[stayed])


def test_keep_rejected_selects_without_nonzero_off_cpu() -> None:
    # nonzero would make a CUDA step wait for the device; "meta" tensors have no nonzero at all
    accepted = torch.tensor([True, False, True])
    new, old = torch.zeros(3, 2), torch.ones(3, 2)
    assert torch.equal(_keep_rejected(accepted, new.clone(), old), torch.tensor([[0.0, 0], [1, 1], [0, 0]]))
    out = _keep_rejected(accepted.to("meta"), new.to("meta"), old.to("meta"))
    assert out.device.type == "meta" and out.shape == (3, 2)


class _UnadjustedLangevin(MALA):
    """MALA without its Metropolis–Hastings test (ULA): biased for any fixed step size."""

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        state = self._with_grad(state)
        eps = float(self.step_size)
        y = state.x + eps * state.grad + math.sqrt(2 * eps) * torch.randn_like(state.x)
        log_prob, grad = self._log_prob_and_grad(y)
        ones = torch.ones_like(log_prob, dtype=torch.bool)
        return State(y, log_prob, grad), StepInfo(ones.to(log_prob.dtype), ones)


class _WrongSignIMH(IMH):
    """IMH with the acceptance ratio inverted (w(x)/w(y)): the bug the oracle must catch."""

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        y, log_q_y, log_pi_y = self._propose((state.chains,))
        log_q_x = self._log_q(state)
        accept_prob, accepted = metropolis_accept((state.log_prob - log_q_x) - (log_pi_y - log_q_y))
        return self._moved(state, accepted, y, log_pi_y, torch.where(accepted, log_q_y, log_q_x)), StepInfo(
            accept_prob, accepted
        )


@pytest.mark.parametrize("broken", ["ULA", "wrong-sign IMH"])
def test_stationarity_oracle_catches_broken_kernels(broken: str) -> None:
    torch.manual_seed(2)
    target = correlated_gaussian()
    if broken == "ULA":
        kernel = _UnadjustedLangevin(target, 0.3, adapt_step_size=False)
    else:
        kernel = _WrongSignIMH(target, imperfect_flow(target))
    trace = sample(kernel, target.sample(4000), 15)
    assert not _moments_agree(trace.state.x, target)


# -- detailed balance on a three-state toy ------------------------------------------------------

PI = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)


def _exact_imh_matrix(pi: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P[i, j] = q_j min(1, pi_j q_i / (pi_i q_j)) off the diagonal (Tierney 1994)."""
    p = torch.zeros(3, 3, dtype=pi.dtype)
    for i, j in itertools.permutations(range(3), 2):
        p[i, j] = q[j] * min(1.0, float(pi[j] * q[i] / (pi[i] * q[j])))
    p += torch.diag(1 - p.sum(1))
    return p


def _exact_isir_matrix(pi: torch.Tensor, q: torch.Tensor, m: int) -> torch.Tensor:
    """i-SIR with m proposals, by enumeration: P[i, j] = E_{y ~ q^m}[#{y_k = j} w_j / (w_i + sum_k w_{y_k})]."""
    w = pi / q
    p = torch.zeros(3, 3, dtype=pi.dtype)
    for i in range(3):
        for ys in itertools.product(range(3), repeat=m):
            prob = math.prod(float(q[y]) for y in ys)
            total = float(w[i]) + sum(float(w[y]) for y in ys)
            p[i, i] += prob * float(w[i]) / total
            for y in ys:
                p[i, y] += prob * float(w[y]) / total
    return p


def _empirical_matrix(kernel: Kernel, n: int = 20000) -> tuple[torch.Tensor, torch.Tensor]:
    rows, errors = [], []
    for i in range(3):
        state, _ = kernel.step(kernel.init(torch.full((n, 1), float(i), dtype=torch.float64)))
        counts = torch.bincount(state.x[:, 0].round().long(), minlength=3).double()
        freq = counts / n
        rows.append(freq)
        errors.append((freq * (1 - freq) / n).sqrt().clamp(min=1 / n))
    return torch.stack(rows), torch.stack(errors)


@pytest.mark.parametrize("name", ["IMH", "ISIR-1", "ISIR-3"])
def test_flow_kernels_on_three_states_match_the_detailed_balance_matrix(name: str) -> None:
    torch.manual_seed(3)
    target, flow = ThreeStates(PI), discrete_flow(Q)
    if name == "IMH":
        kernel, exact = IMH(target, flow), _exact_imh_matrix(PI, Q)
    else:
        m = int(name[-1])
        kernel, exact = ISIR(target, flow, n_proposals=m), _exact_isir_matrix(PI, Q, m)
    # the exact matrix is a Markov matrix in detailed balance with pi (so pi is stationary)
    torch.testing.assert_close(exact.sum(1), torch.ones(3, dtype=torch.float64))
    flux = PI[:, None] * exact
    torch.testing.assert_close(flux, flux.T)
    torch.testing.assert_close(PI @ exact, PI)
    empirical, se = _empirical_matrix(kernel)
    assert ((empirical - exact).abs() <= 5 * se).all(), (empirical, exact)


def test_three_state_oracle_rejects_the_inverted_ratio() -> None:
    """The inverted ratio w(x)/w(y) gives a matrix out of detailed balance, and the kernel shows it."""
    torch.manual_seed(3)
    wrong = _exact_imh_matrix(Q / PI * Q, Q)  # inverting w = pi/q is the same as using pi' = q^2/pi
    flux = PI[:, None] * wrong
    assert (flux - flux.T).abs().max() > 0.01
    empirical, se = _empirical_matrix(_WrongSignIMH(ThreeStates(PI), discrete_flow(Q)))
    assert ((empirical - _exact_imh_matrix(PI, Q)).abs() > 5 * se).any()


# -- the funnel ------------------------------------------------------------------------------------


def test_funnel_transport_is_a_correct_bijection() -> None:
    x = Funnel(5).sample(4).double()
    check_bijection(FunnelTransport(5, a=2.5, b=0.8).double(), x)


def test_neutra_recovers_the_funnel_neck_marginal_with_an_imperfect_transport() -> None:
    """v ~ N(0, 3^2) is recovered from a poor start by NeuTra-MALA with a wrong (a, b) transport."""
    torch.manual_seed(4)
    target = Funnel(5).double()
    flow = Flow(FunnelTransport(5, a=2.5, b=0.8), StandardNormal(5)).double()
    kernel = NeuTra(target, flow, step_size=0.3)
    trace = sample(kernel, torch.randn(500, 5, dtype=torch.float64), 150, warmup=150)
    v = trace.state.x[:, 0].numpy()
    assert stats.kstest(v / 3.0, "norm").pvalue > 1e-3
    assert 0.4 < trace.acceptance_rate() < 0.9


# -- costs, adaptation, online training -----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "energy", "grad"),
    [("RandomWalk", 1, 0), ("MALA", 0, 1), ("HMC", 0, 5), ("IMH", 1, 0), ("ISIR", 3, 0)],
)
def test_target_evaluations_per_step(name: str, energy: int, grad: int) -> None:
    torch.manual_seed(0)
    base = correlated_gaussian()
    target = CountingTarget(base)
    kernel = {
        "RandomWalk": lambda: RandomWalk(target),
        "MALA": lambda: MALA(target),
        "HMC": lambda: HMC(target, 0.1, 5),
        "IMH": lambda: IMH(target, imperfect_flow(base)),
        "ISIR": lambda: ISIR(target, imperfect_flow(base), n_proposals=3),
    }[name]()
    state = kernel.init(base.sample(10))
    target.reset()
    for _ in range(4):
        state, _ = kernel.step(state)
    assert (target.energy_evals, target.grad_evals) == (4 * 10 * energy, 4 * 10 * grad)


def test_imh_refreshes_gradients_only_for_accepted_chains() -> None:
    torch.manual_seed(0)
    base = correlated_gaussian()
    target = CountingTarget(base)
    kernel = IMH(target, imperfect_flow(base))
    state = MALA(target).init(base.sample(100))
    target.reset()
    new, info = kernel.step(state)
    assert target.grad_evals == int(info.accepted.sum())
    torch.testing.assert_close(new.grad, -base.energy_and_grad(new.x)[1])


@pytest.mark.parametrize(("kernel_cls", "goal"), [(MALA, 0.574), (HMC, 0.65), (RandomWalk, 0.234)])
def test_dual_averaging_reaches_the_target_acceptance(kernel_cls, goal: float) -> None:
    torch.manual_seed(5)
    target = correlated_gaussian()
    make = (lambda s: HMC(target, s, 4)) if kernel_cls is HMC else (lambda s: kernel_cls(target, s))
    kernel = make(2.0)  # far too large a start
    trace = sample(kernel, target.sample(100), 100, warmup=300)
    # dual averaging drives the running mean of the warm-up acceptance to the goal ...
    assert abs(float(trace.warmup_accept_prob[-150:].mean()) - goal) < 0.05
    # ... and the averaged step size used afterwards is at least as safe; MALA's and RWM's
    # acceptance falls smoothly with the step size, HMC's has resonances and a stability cliff.
    after = float(trace.accept_prob.mean())
    assert (goal - 0.1 < after < 1.0) if kernel_cls is HMC else abs(after - goal) < 0.1
    assert kernel.adaptation.count == 0  # reset after end_adaptation
    restored = make(1.0)
    restored.load_state_dict(kernel.state_dict())
    assert float(restored.step_size) == float(kernel.step_size) != 2.0


def test_imh_log_q_cache_is_refreshed_after_the_flow_changes() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    flow = imperfect_flow(target)
    kernel = IMH(target, flow)
    state, _ = kernel.step(kernel.init(target.sample(20)))
    torch.testing.assert_close(kernel._log_q(state), flow.log_prob(state.x).detach())
    with torch.no_grad():
        flow.transform[1].params.add_(0.5)  # e.g. an optimiser step
    torch.testing.assert_close(kernel._log_q(state), flow.log_prob(state.x).detach())


def test_flow_watch_fingerprint_and_eval_mode() -> None:
    torch.manual_seed(0)
    flow = RealNVP(2, transforms=2, hidden=(8,))
    watch = FlowWatch(flow)
    first = watch.version()
    assert watch.version() == first  # nothing changed
    optimizer = torch.optim.SGD(flow.parameters(), lr=0.1)
    flow.log_prob(torch.randn(4, 2)).sum().backward()
    optimizer.step()
    second = watch.version()
    assert second != first
    flow.transform.transforms[0] = Affine(2)  # a replaced submodule is noticed and listed
    assert watch.version() != second
    assert any(m is flow.transform.transforms[0] for m in watch._modules)
    flow.train()
    with watch.evaluating():
        assert not any(m.training for m in flow.modules())
    assert all(m.training for m in flow.modules())


def test_neutra_latent_cache_is_rebuilt_after_the_flow_changes() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    flow = imperfect_flow(target)
    kernel = NeuTra(target, flow)
    state, _ = kernel.step(kernel.init(target.sample(20)))
    with torch.no_grad():
        flow.transform[1].params.add_(0.5)
    latent = kernel.latent_state(state)
    torch.testing.assert_close(latent.x, flow.transform(state.x).detach())


def test_global_local_with_online_training_equilibrates_mode_weights() -> None:
    """Chains start 90/10 in two modes; MALA keeps that split, flowMC-style global-local fixes it."""
    torch.manual_seed(6)
    target = two_modes()
    means = target.locs
    start = torch.cat([means[0] + torch.randn(180, 2), means[1] + torch.randn(20, 2)]).double()

    mala = sample(MALA(target), start, 150, warmup=150)
    assert abs(float(mode_weights(mala.samples, means)[0]) - 0.9) < 0.02

    flow = Flow(Affine(2), StandardNormal(2)).double()  # a trainable Gaussian proposal
    kernel = GlobalLocal(IMH(target, flow), MALA(target), local_steps=4, train=True, lr=0.05, train_steps=2)
    trace = sample(kernel, start, 60, warmup=60)
    weight = float(mode_weights(trace.samples[-20:], means)[0])
    assert abs(weight - 0.5) < 0.08, weight
    assert kernel.losses[-1] < kernel.losses[0]
    assert trace.acceptance_rate() > 0.1
    assert 0.3 < float(trace.extras["local_accept_prob"].mean()) < 0.9


def test_global_local_trains_a_realnvp_flow_towards_the_target() -> None:
    torch.manual_seed(7)
    target = Gaussian(torch.full((2,), 2.0, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
    flow = RealNVP(2, transforms=2, hidden=(16,)).double()
    kernel = GlobalLocal(IMH(target, flow), MALA(target), local_steps=2, train=True, lr=1e-2, train_steps=2)
    before = sample(IMH(target, flow), target.sample(128), 5).acceptance_rate()
    sample(kernel, target.sample(128), 0, warmup=100)
    after = sample(IMH(target, flow), target.sample(128), 5).acceptance_rate()
    assert before < 0.1 < 0.5 < after


# -- the driver and bad input ---------------------------------------------------------------------


def test_sample_continues_from_a_trace_state_and_thins() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian()
    kernel = MALA(target, 0.3, adapt_step_size=False)
    first = sample(kernel, target.sample(7), 10, thin=5)
    assert first.samples.shape == (2, 7, 3) and first.log_prob.shape == (2, 7)
    assert first.accepted.shape == (10, 7) and first.warmup_accept_prob.shape == (0, 7)
    seen = []
    second = sample(kernel, first.state, 3, warmup=2, progress=True, callback=lambda i, s, info: seen.append(i))
    assert seen == [0, 1, 2, 3, 4]
    assert second.samples.shape == (3, 7, 3)
    assert "draws=3, chains=7" in repr(second)


def test_kernels_work_in_float32() -> None:
    torch.manual_seed(0)
    target = correlated_gaussian(torch.float32)
    flow = imperfect_flow(target)
    for kernel in (MALA(target), HMC(target, 0.2, 3), IMH(target, flow), NeuTra(target, flow)):
        trace = sample(kernel, target.sample(16), 3)
        assert trace.samples.dtype == torch.float32


def test_metropolis_select_helper() -> None:
    mask = torch.tensor([True, False])
    out = _select(mask, torch.ones(2, 2, 2), torch.zeros(2, 2, 2))
    assert out[0].eq(1).all() and out[1].eq(0).all()


def test_bad_arguments_raise_clear_errors() -> None:
    target = correlated_gaussian()
    flow = imperfect_flow(target)
    kernel = MALA(target)
    with pytest.raises(ValueError, match=r"expected positions of shape \(chains, 3\), got \(4, 2\)"):
        kernel.init(torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expected positions of shape \(chains, 3\), got \(3,\)"):
        kernel.init(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="expected floating-point positions"):
        kernel.init(torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"expected target to be an EnergyTarget or an object"):
        MALA(lambda x: x)
    with pytest.raises(ValueError, match="expected a positive finite step_size"):
        MALA(target, step_size=0.0)
    with pytest.raises(ValueError, match="HMC: expected leapfrog_steps to be an int >= 1"):
        HMC(target, 0.1, 0)
    with pytest.raises(ValueError, match="expected n_proposals to be an int >= 1"):
        ISIR(target, flow, n_proposals=0)
    with pytest.raises(ValueError, match=r"expected a flow on events of shape \(3,\)"):
        IMH(target, RealNVP(2))
    with pytest.raises(TypeError, match=r"expected a flows\.Flow"):
        NeuTra(target, flow.transform)
    with pytest.raises(ValueError, match="expected the global and local kernels to share one target"):
        GlobalLocal(IMH(target, flow), MALA(correlated_gaussian()))
    with pytest.raises(TypeError, match="expected an IMH or ISIR global kernel"):
        GlobalLocal(MALA(target), MALA(target))
    with pytest.raises(ValueError, match="expected target_accept in"):
        MALA(target, target_accept=1.5)
    with pytest.raises(ValueError, match="expected steps to be an int >= 0"):
        sample(kernel, torch.zeros(2, 3, dtype=torch.float64), -1)
    with pytest.raises(ValueError, match="expected thin to be an int >= 1"):
        sample(kernel, torch.zeros(2, 3, dtype=torch.float64), 2, thin=0)
    with pytest.raises(TypeError, match="expected start to be a Tensor or a State"):
        sample(kernel, [0.0, 0.0, 0.0], 2)


def test_nan_proposals_are_rejected() -> None:
    prob, accepted = metropolis_accept(torch.tensor([float("nan"), 0.5, float("inf")]))
    assert prob.tolist()[0] == 0.0 and not accepted[0]
    assert prob[2] == 1.0 and accepted[2]
