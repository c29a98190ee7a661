"""Bad inputs end in the right result or a clear error: MCMC starts, energy targets, contexts, linear layers.

Issue 17, items 9-11: MCMC kernels refuse non-finite or empty starts, energy targets give
``+inf`` (not NaN) far out and refuse integer/complex input, every conditional transform checks its
context like its input, linear layers refuse events with axes they do not act on, and ActNorm's
data-dependent initialisation is exact for data far from zero.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch

import flows
import flows.targets as targets_module
from flows import IAF, MAF, NICE, NSF, ActNorm, ActNorm2d, Flow, Invertible1x1Conv, LULinear, RealNVP, StandardNormal
from flows.architectures.continuous import FFJORD
from flows.bijections.base import Bijection
from flows.mcmc import HMC, IMH, ISIR, MALA, GlobalLocal, NeuTra, RandomWalk, sample
from flows.mcmc.base import State
from flows.targets import (
    DW4,
    LJ13,
    Banana,
    DoubleWell,
    EnergyTarget,
    Funnel,
    Gaussian,
    GaussianMixture,
    InterpolatedEnergy,
    ManyWell,
    MullerBrown,
    PhiFour,
    TemperedEnergy,
)
from tests.registry import Case, all_cases

# -- energy targets (item 11) ------------------------------------------------------------------

TARGETS = {
    "DW4": DW4,
    "LJ13": LJ13,
    "Banana": lambda: Banana(4),
    "DoubleWell": DoubleWell,
    "Funnel": lambda: Funnel(3),
    "Gaussian": lambda: Gaussian(2, loc=1.0, scale=2.0),
    "GaussianMixture": lambda: GaussianMixture(torch.tensor([[0.0, 0.0], [3.0, 3.0]])),
    "InterpolatedEnergy": lambda: InterpolatedEnergy(Gaussian(2), DoubleWell(), 0.5),
    "ManyWell": lambda: ManyWell(4),
    "MullerBrown": MullerBrown,
    "PhiFour": lambda: PhiFour(3, dims=2),
    "TemperedEnergy": lambda: TemperedEnergy(DoubleWell(), 2.0),
    "TransformedTarget": lambda: targets_module.TransformedTarget(DoubleWell(), flows.Affine(2)),
}
# the protocol, the base classes and the adapter
ABSTRACT_TARGETS = {"Energy", "EnergyTarget", "ParticleSystem", "ProtocolTarget", "as_target"}
# OpenMM targets need the optional openmm package and a force field: tests/test_molecules_openmm.py sweeps them
OPTIONAL_TARGETS = {"AlanineDipeptide", "OpenMMTarget"}


def test_every_exported_target_is_swept() -> None:
    """A new target in ``flows.targets`` must be added to :data:`TARGETS` (and so to every sweep below)."""
    assert set(targets_module.__all__) - ABSTRACT_TARGETS - OPTIONAL_TARGETS == set(TARGETS)


def _spread(target: EnergyTarget, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One configuration with distinct, non-zero entries (no coinciding particles), ``(1, *event)``."""
    n = target.event_shape.numel()
    return (torch.linspace(-1.0, 1.0, n, dtype=torch.float64) + 0.1).reshape(1, *target.event_shape).to(dtype)


@pytest.mark.parametrize("name", TARGETS)
@pytest.mark.parametrize(
    ("dtype", "scale"), [(torch.float32, 1e30), (torch.float32, -1e20), (torch.float64, 1e200), (torch.float64, -1e300)]
)
def test_targets_give_infinite_energy_far_out(name: str, dtype: torch.dtype, scale: float) -> None:
    target = TARGETS[name]().to(dtype)
    x = (scale * _spread(target)).to(dtype)
    u = target.energy(x)
    assert u.dtype == dtype
    assert torch.isposinf(u).all(), f"{name}: u = {u.tolist()} at {scale:g}"
    assert torch.isneginf(target.log_prob(x)).all()
    log_prob, _ = target.log_prob_and_grad(x)
    assert torch.isneginf(log_prob).all()


@pytest.mark.parametrize("name", TARGETS)
def test_targets_infinite_coordinates_and_nan(name: str) -> None:
    target = TARGETS[name]().double()
    x = _spread(target).repeat(3, *([1] * len(target.event_shape)))
    x.view(3, -1)[0, 0] = math.inf
    x.view(3, -1)[1, -1] = -math.inf
    x.view(3, -1)[2, 0] = math.nan
    u = target.energy(x)
    assert torch.isposinf(u[:2]).all(), u.tolist()
    assert torch.isnan(u[2])  # documented: a NaN input gives a NaN energy


@pytest.mark.parametrize("name", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.complex128])
def test_targets_refuse_integer_and_complex_input(name: str, dtype: torch.dtype) -> None:
    target = TARGETS[name]()
    x = torch.zeros(2, *target.event_shape, dtype=dtype)
    with pytest.raises(TypeError, match=rf"expected a real floating-point input, got dtype {dtype}"):
        target.energy(x)
    with pytest.raises(TypeError, match="real floating-point"):
        target.log_prob(x)


@pytest.mark.parametrize("name", TARGETS)
def test_targets_float64_values_and_gradients(name: str) -> None:
    target = TARGETS[name]().double()
    x = _spread(target) * 0.7
    u, grad = target.energy_and_grad(x)
    assert u.dtype == grad.dtype == torch.float64
    assert torch.isfinite(u).all() and torch.isfinite(grad).all()
    # float64 agrees with a float32 evaluation to float32 precision (the same function, not a promotion bug)
    u32 = TARGETS[name]().energy(x.float())
    assert torch.allclose(u32.double(), u, rtol=1e-5, atol=1e-4)


def test_lj13_coinciding_particles_have_infinite_energy() -> None:
    target = LJ13().double()
    x = _spread(target)
    x[0, 3:6] = x[0, 0:3]  # particles 0 and 1 at the same place: the repulsion is infinite
    assert torch.isposinf(target.energy(x)).all()


def _particle_start(target: EnergyTarget, chains: int, seed: int = 0) -> torch.Tensor:
    """Centred, well-separated float64 configurations near a lattice (finite energy)."""
    g = torch.Generator().manual_seed(seed)
    n, d = target.n_particles, target.spatial_dim
    grid = torch.stack(torch.meshgrid(*[torch.arange(3.0, dtype=torch.float64)] * d, indexing="ij"), -1).reshape(-1, d)
    base = (grid[:n] * (4.0 if n == 4 else 1.1)).reshape(1, -1)
    x = base + 0.05 * torch.randn(chains, n * d, generator=g, dtype=torch.float64)
    return target.centre(x)


@pytest.mark.parametrize("make", [DW4, LJ13], ids=["DW4", "LJ13"])
@pytest.mark.parametrize("kernel", ["MALA", "HMC", "NeuTra", "IMH"])
def test_particle_targets_sample_in_float64_end_to_end(make, kernel: str) -> None:
    torch.manual_seed(0)
    target = make().double()
    dim = target.dim
    flow = Flow(LULinear(dim), StandardNormal(dim)).double()
    kernels = {
        "MALA": lambda: MALA(target, 1e-4),
        "HMC": lambda: HMC(target, 1e-3, leapfrog_steps=2),
        "NeuTra": lambda: NeuTra(target, flow, step_size=1e-4),
        "IMH": lambda: IMH(target, flow),
    }
    start = _particle_start(target, 3)
    trace = sample(kernels[kernel](), start, 4, warmup=2)
    assert trace.samples.dtype == trace.log_prob.dtype == torch.float64
    assert torch.isfinite(trace.samples).all()
    # the recorded log-density is the float64 target's, at the recorded samples
    torch.testing.assert_close(trace.log_prob, target.log_prob(trace.samples), rtol=1e-12, atol=1e-10)


def test_neutra_refuses_a_flow_of_another_dtype() -> None:
    target = DoubleWell().double()
    kernel = NeuTra(target, RealNVP(2, transforms=1, hidden=(4,)))  # float32 flow
    with pytest.raises(TypeError, match=r"expected positions with dtype torch.float32.*got dtype torch.float64"):
        sample(kernel, torch.zeros(3, 2, dtype=torch.float64), 2)


# -- MCMC starting states (item 9) ---------------------------------------------------------------


def _flow() -> Flow:
    torch.manual_seed(0)
    return RealNVP(2, transforms=1, hidden=(4,))


KERNELS = {
    "RandomWalk": lambda t: RandomWalk(t),
    "MALA": lambda t: MALA(t),
    "HMC": lambda t: HMC(t, leapfrog_steps=2),
    "NeuTra-MALA": lambda t: NeuTra(t, _flow()),
    "NeuTra-HMC": lambda t: NeuTra(t, _flow(), inner=HMC, leapfrog_steps=2),
    "NeuTra-RandomWalk": lambda t: NeuTra(t, _flow(), inner=RandomWalk),
    "IMH": lambda t: IMH(t, _flow()),
    "ISIR": lambda t: ISIR(t, _flow(), n_proposals=2),
    "GlobalLocal": lambda t: GlobalLocal(IMH(t, _flow()), MALA(t), local_steps=1),
    "GlobalLocal-train": lambda t: GlobalLocal(ISIR(t, _flow()), HMC(t), local_steps=1, train=True),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_kernels_refuse_non_finite_starting_positions(kernel: str, bad: float) -> None:
    k = KERNELS[kernel](DoubleWell())
    x = torch.zeros(3, 2)
    x[1, 0] = bad
    with pytest.raises(
        ValueError, match=r"expected finite starting positions, got NaN/Inf in 1 chain\(s\), the first chain 1"
    ):
        sample(k, x, 2, warmup=1)
    with pytest.raises(ValueError, match="expected finite starting positions"):
        k.init(x)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_refuse_starts_with_non_finite_energy(kernel: str) -> None:
    k = KERNELS[kernel](DoubleWell())
    x = torch.zeros(3, 2)
    x[2, 0] = 1e30  # finite, but u overflows to +inf (it was NaN before, and the chain never moved)
    with pytest.raises(
        ValueError, match=r"expected a finite energy at every starting position, got u = inf at chain 2"
    ):
        sample(k, x, 2, warmup=1)


class _Cliff(EnergyTarget):
    """Finite energy everywhere, +inf on x_0 > 5, and a NaN gradient at x_0 = -1 (|x|^(1/2) cusp)."""

    def __init__(self) -> None:
        super().__init__(2)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        u = 0.5 * x.square().sum(-1) + (x[..., 0] + 1).abs().sqrt() * 0.0
        return torch.where(x[..., 0] > 5, torch.inf, u)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_refuse_a_start_where_the_target_is_infinite(kernel: str) -> None:
    k = KERNELS[kernel](_Cliff())
    x = torch.tensor([[0.0, 0.0], [6.0, 0.0]])
    with pytest.raises(ValueError, match="expected a finite energy at every starting position, got u = inf at chain 1"):
        sample(k, x, 1)


@pytest.mark.parametrize("kernel", ["MALA", "HMC"])
def test_gradient_kernels_refuse_a_start_with_a_non_finite_gradient(kernel: str) -> None:
    k = KERNELS[kernel](_Cliff())
    x = torch.tensor([[0.0, 0.0], [-1.0, 0.0]])  # d/dx sqrt|x+1| * 0 = 0 * inf = NaN at x_0 = -1
    with pytest.raises(
        ValueError, match="expected a finite energy gradient at every starting position, got NaN/Inf at chain 1"
    ):
        k.init(x)


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_chain_batch_is_a_clear_error_everywhere(kernel: str) -> None:
    k = KERNELS[kernel](DoubleWell())
    with pytest.raises(ValueError, match=r"expected at least one chain, got positions of shape \(0, 2\)"):
        sample(k, torch.zeros(0, 2), 2, warmup=1)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_refuse_integer_starts(kernel: str) -> None:
    with pytest.raises(TypeError, match=r"expected floating-point positions, got dtype torch\.int64"):
        sample(KERNELS[kernel](DoubleWell()), torch.zeros(3, 2, dtype=torch.long), 1)


def test_a_continued_state_with_a_non_finite_energy_is_refused() -> None:
    kernel = RandomWalk(DoubleWell())
    state = State(torch.zeros(2, 2), torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="expected a finite energy at every starting position, got u = nan at chain 1"):
        sample(kernel, state, 1)


# -- transforms: contexts, event shapes, dtypes, empty batches (item 10 and the registry sweep) ----

CASES = all_cases()
CONTEXT_CASES = [c for c in CASES if c.context]


def _built(case: Case) -> Bijection:
    torch.manual_seed(0)
    t = case.make().double()
    if case.warmup:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            t(case.inputs((16,), g), case.contexts((16,), g))
    return t.eval()


def _data(case: Case, batch: tuple[int, ...] = (5,)) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(2)
    return case.inputs(batch, g), case.contexts(batch, g)


def _bad_context(kind: str, context: torch.Tensor, width: int) -> torch.Tensor | None:
    if kind == "nan":
        return context.clone().index_fill_(0, torch.tensor([1]), math.nan)
    if kind == "inf":
        return context.clone().index_fill_(0, torch.tensor([2]), -math.inf)
    if kind == "short-batch":
        return context[:4]
    if kind == "extra-batch":
        return context.expand(3, *context.shape)
    if kind == "width":
        return torch.randn(*context.shape[:-1], width + 1, dtype=context.dtype)
    if kind == "float32":
        return context.float()
    if kind == "int":
        return context.round().long()
    return None


CONTEXT_ATTACKS = {
    "nan": (ValueError, "expected a finite context, got"),
    "inf": (ValueError, "expected a finite context, got"),
    "short-batch": (ValueError, r"expected a context of shape \(\*batch, C\) with batch shape \(5,\)"),
    "extra-batch": (ValueError, r"with batch shape \(5,\) .*got \(3, 5, "),
    "width": (ValueError, r"expected a context of shape \(\*batch, \d+\)( or \(\*batch, \d+, \d+, \d+\))?, got"),
    "float32": (TypeError, r"expected a context with the input's dtype torch.float64 on cpu, got dtype torch.float32"),
    "int": (TypeError, r"floating-point context, got dtype torch\.int64"),
    "none": (ValueError, r"expected a context of shape \(\*batch, \d+\), got None"),
}


@pytest.mark.parametrize("kind", CONTEXT_ATTACKS)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("case", CONTEXT_CASES, ids=str)
def test_every_conditional_transform_checks_its_context(case: Case, inverse: bool, kind: str) -> None:
    t = _built(case)
    x, context = _data(case)
    inputs = t.forward(x, context).detach() if inverse else x
    call = t.inverse_and_log_det if inverse else t.forward_and_log_det
    error, match = CONTEXT_ATTACKS[kind]
    with pytest.raises(error, match=match):
        call(inputs, _bad_context(kind, context, case.context))


@pytest.mark.parametrize("case", CONTEXT_CASES, ids=str)
def test_a_context_that_broadcasts_is_accepted(case: Case) -> None:
    """One context row for the whole batch is the same as that row repeated."""
    t = _built(case)
    x, context = _data(case)
    one = context[:1]
    z, ladj = t.forward_and_log_det(x, one)
    z_rep, ladj_rep = t.forward_and_log_det(x, one.expand_as(context).contiguous())
    torch.testing.assert_close(z, z_rep)
    torch.testing.assert_close(ladj, ladj_rep)


def _conditional_flows() -> dict[str, Callable[[], Flow]]:
    small = {"transforms": 2, "hidden": (8,)}
    return {
        "RealNVP": lambda: RealNVP(3, 2, **small),
        "NICE": lambda: NICE(3, 2, **small),
        "MAF": lambda: MAF(3, 2, **small),
        "IAF": lambda: IAF(3, 2, **small),
        "NSF": lambda: NSF(3, 2, **small),
        "FFJORD": lambda: FFJORD(3, 2, hidden=(8,)),
    }


@pytest.mark.parametrize("kind", CONTEXT_ATTACKS)
@pytest.mark.parametrize("name", list(_conditional_flows()))
def test_every_conditional_flow_checks_its_context(name: str, kind: str) -> None:
    torch.manual_seed(0)
    flow = _conditional_flows()[name]().double()
    x = torch.randn(5, 3, dtype=torch.float64)
    context = torch.randn(5, 2, dtype=torch.float64)
    error, match = CONTEXT_ATTACKS[kind]
    if kind == "float32":  # the flow names its own dtype first
        match = "expected context with dtype torch.float64"
    with pytest.raises(error, match=match):
        flow.log_prob(x, _bad_context(kind, context, 2))
    if kind in ("nan", "inf"):
        with pytest.raises(ValueError, match="expected a finite context"):
            flow.sample((2,), _bad_context(kind, context, 2))


def _concrete_axis(shape: tuple[int | None, ...]) -> int:
    return next(i for i, s in enumerate(shape) if s is not None)


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_transform_refuses_a_wrong_event_shape(case: Case, inverse: bool) -> None:
    t = _built(case)
    x, context = _data(case)
    inputs = t.forward(x, context).detach() if inverse else x
    event = t.event_shape_out if inverse else t.event_shape
    axis = inputs.dim() - len(event) + _concrete_axis(event)
    wrong = torch.cat((inputs, inputs.narrow(axis, 0, 1)), dim=axis)  # one entry too many on a fixed axis
    call = t.inverse_and_log_det if inverse else t.forward_and_log_det
    what = "latent input" if inverse else "input"
    with pytest.raises(
        ValueError, match=rf"expected {what} of shape \(\*batch, .*\), got {re.escape(str(tuple(wrong.shape)))}"
    ):
        call(wrong, context)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex128])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_transform_refuses_integer_and_complex_input(case: Case, dtype: torch.dtype) -> None:
    t = _built(case)
    x, context = _data(case)
    with pytest.raises(TypeError, match=rf"expected a real floating-point input, got dtype {dtype}"):
        t.forward_and_log_det(x.to(dtype), context)
    z = t.forward(x, context).detach()
    with pytest.raises(TypeError, match=rf"expected a real floating-point latent input, got dtype {dtype}"):
        t.inverse_and_log_det(z.to(dtype), context)


@pytest.mark.parametrize("batch", [(0,), (0, 3), (2, 0)])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_transform_maps_an_empty_batch_to_an_empty_result(case: Case, batch: tuple[int, ...]) -> None:
    t = _built(case)
    x, context = _data(case)
    z_full = t.forward(x, context)
    x0, c0 = _data(case, batch)
    z, ladj = t.forward_and_log_det(x0, c0)
    assert z.shape == (*batch, *z_full.shape[1:]) and ladj.shape == batch
    x_back, ladj_inv = t.inverse_and_log_det(z, c0)
    assert x_back.shape == x0.shape and ladj_inv.shape == batch


@pytest.mark.parametrize("case", CASES, ids=str)
def test_nan_input_never_gives_a_finite_wrong_number(case: Case) -> None:
    """Documented: transforms do not scan their input (Flow does); a NaN entry makes its row NaN or is a clear error."""
    t = _built(case)
    x, context = _data(case)
    x = x.clone()
    x[1].view(-1)[0] = math.nan
    try:
        z, ladj = t.forward_and_log_det(x, context)
    except (ValueError, FloatingPointError) as error:  # Logit's domain check, a CNF's failed solve
        assert "expected" in str(error)
        return
    assert not (torch.isfinite(z[1]).all() and torch.isfinite(ladj[1]))


# -- linear layers and ActNorm -------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [lambda: LULinear((4, 3)), lambda: LULinear((4, 3), init="orthogonal"), lambda: ActNorm((4, 3))],
    ids=["LULinear", "LULinear-orthogonal", "ActNorm"],
)
def test_vector_layers_refuse_events_with_more_axes(make) -> None:
    with pytest.raises(ValueError, match=r"expected an event of shape \(features,\).*got \(4, 3\)"):
        make()


def test_lu_linear_refuses_rows_of_another_width() -> None:
    """``(5, 4, 3)`` data is a (5, 4) batch of 3-vectors, never 15 chunks of 4 numbers with a wrong log-det."""
    t = LULinear(4, init="orthogonal")
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 4\), got \(5, 4, 3\)"):
        t.forward_and_log_det(torch.randn(5, 4, 3))
    with pytest.raises(ValueError, match=r"expected latent input of shape \(\*batch, 4\), got \(5, 4, 3\)"):
        t.inverse_and_log_det(torch.randn(5, 4, 3))


def test_invertible_1x1_conv_refuses_a_vector() -> None:
    with pytest.raises(ValueError, match=r"expected input of shape \(\*batch, 3, \*, \*\), got \(5, 3\)"):
        Invertible1x1Conv(3).forward_and_log_det(torch.randn(5, 3))


@pytest.mark.parametrize("image", [False, True], ids=["ActNorm", "ActNorm2d"])
def test_actnorm_initialisation_is_exact_far_from_zero(image: bool) -> None:
    """float32 data of mean 1e4: the statistics match a float64 reference to float32 precision.

    ``E[x²] − μ²`` loses every digit here (1e8 − 1e8 in float32); the two-pass algorithm does not.
    """
    g = torch.Generator().manual_seed(0)
    spread = torch.tensor([1.0, 0.01, 3.0], dtype=torch.float64)
    if image:
        x64 = 1e4 + torch.randn(64, 3, 4, 4, generator=g, dtype=torch.float64) * spread[:, None, None]
        t, dims = ActNorm2d(3), (0, 2, 3)
    else:
        x64 = 1e4 + torch.randn(1024, 3, generator=g, dtype=torch.float64) * spread
        t, dims = ActNorm(3), (0,)
    x = x64.float()
    t(x)
    reference = x.double()  # the float32 data, in float64
    std = reference.std(dims, unbiased=False)
    mean = reference.mean(dims)
    torch.testing.assert_close(t.log_scale.detach().double().flatten(), -std.log(), rtol=0, atol=2e-5)
    torch.testing.assert_close(t.shift.detach().double().flatten(), -mean / std, rtol=2e-6, atol=0)


def test_actnorm_is_not_initialised_by_an_empty_batch() -> None:
    t = ActNorm(3)
    z, ladj = t.forward_and_log_det(torch.zeros(0, 3))
    assert z.shape == (0, 3) and ladj.shape == (0,)
    assert not bool(t.initialized) and torch.isfinite(t.log_scale).all() and torch.isfinite(t.shift).all()
    t(torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]))
    assert bool(t.initialized)
