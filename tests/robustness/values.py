"""Value attacks: every metric, every particle function, every torch distribution as a base, FlowDistribution.

The lists are discovered, not written out: metric functions from ``flows.metrics.__all__``,
particle functions from ``flows.particles.__all__``, base families from
``torch.distributions.__all__`` and the keyword options to abuse from :func:`inspect.signature`.
A function without a recipe below fails its ``construct`` attack until one is added; a new
keyword is attacked with the absurd values of its annotation without a new test.

Oracles (independent of the implementation where one exists):

* a NaN in the input must give NaN in the output or a clear error, never only finite numbers;
* an empty input, zero chains or a complex input must give a clear error or an empty result;
* an integer or bool input must give the result of the same values in float64, or a clear error;
* an absurd keyword (a negative or fractional count, a NaN or infinite order, an unknown method,
  a string for a flag) must give a clear error; an allocation-sized count a clear error or an
  answer within the time limit;
* a base distribution is acceptable for a flow on R^d iff it is continuous, its declared support
  holds every probe point of R^d and (scalar events) its density integrates to one over R; an
  acceptable one must give the flow's density, any other must be refused.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tests.robustness.table import Attack, AttackFailed, Outcome, Result, expect_clear, expect_right_or_clear

__all__ = ["attacks"]


# -- shared pieces ---------------------------------------------------------------------------------


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _has_nan(result: object) -> bool:
    if isinstance(result, Tensor):
        return bool(torch.isnan(result).any()) if result.is_floating_point() else False
    if isinstance(result, float):
        return math.isnan(result)
    if isinstance(result, (tuple, list)):
        return any(_has_nan(r) for r in result)
    if isinstance(result, dict):
        return any(_has_nan(r) for r in result.values())
    if hasattr(result, "__dataclass_fields__"):
        return any(_has_nan(getattr(result, f)) for f in result.__dataclass_fields__)
    return False


def _same(a: object, b: object) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-8, equal_nan=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-8)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def _is_empty(result: object) -> bool:
    if isinstance(result, Tensor):
        return result.numel() == 0
    if isinstance(result, (tuple, list)):
        return all(_is_empty(r) for r in result)
    return False


@dataclass(frozen=True)
class Recipe:
    """A valid call of a discovered function: ``make()`` gives ``(args, kwargs)``.

    Attributes:
        make: builds the arguments (fresh tensors each call).
        tensor: index in ``args`` of the tensor to poison (``None``: the function takes none).
        chains: the tensor is laid out ``(draws, chains, ...)`` (gets the zero-chains attack).
        any_rank: every rank of the tensor is valid (no wrong-rank attack).
    """

    make: Callable[[], tuple[list, dict]]
    tensor: int | None = 0
    chains: bool = False
    any_rank: bool = False


_ABSURD: dict[str, list[tuple[str, object, bool]]] = {
    # annotation word -> (label, value, must_be_refused); the others may also answer in time
    "int": [("negative", -1, True), ("fraction", 2.5, True), ("string", "3", True), ("bool", True, True)],
    "float": [("nan", math.nan, True), ("inf", math.inf, True), ("negative", -1.0, True), ("string", "x", True)],
    "str": [("unknown", "nonsense", True), ("none", None, True)],
    "bool": [("string", "yes", True), ("int", 2, True)],
    "Sequence": [("infinite", (-math.inf, math.inf), True), ("nan", (math.nan, 1.0), True), ("string", "ab", True)],
    "dtype": [("integer", torch.int64, True), ("string", "float64", True)],
}
_HUGE_COUNT = ("huge", 10**12, False)
_UNATTACKED = ("Tensor", "Flow", "Target", "Generator", "Callable", "dict")


def _keyword_values(parameter: inspect.Parameter) -> list[tuple[str, object, bool]]:
    """The absurd values for one option, from its annotation (``from __future__`` strings).

    Options are the parameters with a default, and the sizes (positional ``int`` parameters);
    the other positional parameters are values (a negative log-likelihood may be -1).
    """
    annotation = str(parameter.annotation)
    if parameter.default is inspect.Parameter.empty and annotation != "int":
        return []
    if any(word in annotation for word in _UNATTACKED) or parameter.kind is parameter.VAR_POSITIONAL:
        return []
    for word in ("bool", "dtype", "Sequence", "str", "float", "int"):
        if word in annotation:
            values = list(_ABSURD[word])
            return [*values, _HUGE_COUNT] if word == "int" else values
    return []


def _function_attacks(family: str, module, recipes: dict[str, Recipe]) -> list[Attack]:
    """Every attack of ``family`` on every function in ``module.__all__``."""
    out: list[Attack] = []
    for name in sorted(module.__all__):
        function = getattr(module, name)
        if not inspect.isfunction(function):
            continue

        def add(attack: str, fn: Callable[[], Result], name=name, timeout: float = 30.0) -> None:
            out.append(Attack(f"{family}/{name}/{attack}", family, fn, timeout))

        recipe = recipes.get(name)
        if recipe is None:
            add(
                "construct",
                lambda name=name: Result(
                    Outcome.RAW_CRASH, f"no recipe calls {name}: add one to tests/robustness/values.py"
                ),
            )
            continue
        add("construct", functools.partial(_valid_call, function, recipe))
        if recipe.tensor is not None:
            for kind in ("nan", "inf", "empty", "int", "bool", "complex", "list"):
                add(f"{kind}-input", functools.partial(_tensor_attack, function, recipe, kind))
            if recipe.chains:
                add("zero-chains", functools.partial(_tensor_attack, function, recipe, "zero-chains"))
            if not recipe.any_rank:
                add("scalar-input", functools.partial(_tensor_attack, function, recipe, "scalar"))
        for parameter in inspect.signature(function).parameters.values():
            for label, value, refuse in _keyword_values(parameter):
                add(
                    f"{parameter.name}-{label}",
                    functools.partial(_keyword_attack, function, recipe, parameter, value, refuse),
                    timeout=60.0,
                )
    return out


def _valid_call(function, recipe: Recipe) -> Result:
    args, kwargs = recipe.make()
    result = function(*args, **kwargs)
    if _has_nan(result):
        return Result(Outcome.SILENT_WRONG, "a valid call gave NaN")
    return Result(Outcome.OK, "a valid call answers")


def _replace(args: list, index: int, value: object) -> list:
    return [value if i == index else a for i, a in enumerate(args)]


def _tensor_attack(function, recipe: Recipe, kind: str) -> Result:
    args, kwargs = recipe.make()
    fresh = lambda: recipe.make()[1]  # noqa: E731  (a generator in the keywords is used up by each call)
    x: Tensor = args[recipe.tensor]
    if kind in ("nan", "inf"):
        bad = x.clone()
        bad.view(-1)[1 % bad.numel()] = math.nan if kind == "nan" else math.inf
        call = lambda: function(*_replace(args, recipe.tensor, bad), **kwargs)  # noqa: E731
        if kind == "inf":  # infinite values may have finite answers (ranks, distances): no crash, no hang
            return expect_right_or_clear(call, lambda r: None)
        return expect_right_or_clear(call, lambda r: None if _has_nan(r) else "a NaN input gave only finite numbers")
    if kind in ("empty", "zero-chains"):
        bad = x[:0] if kind == "empty" else x[:, :0]
        return expect_right_or_clear(
            lambda: function(*_replace(args, recipe.tensor, bad), **kwargs),
            lambda r: None if _is_empty(r) else f"an input of shape {tuple(bad.shape)} gave an answer: {r!r}"[:200],
        )
    if kind in ("int", "bool"):
        same = (x * 3).round() if kind == "int" else x > x.median()
        cast = same.long() if kind == "int" else same
        try:
            reference = function(*_replace(args, recipe.tensor, same.double()), **fresh())
        except (ValueError, TypeError):  # the values themselves are refused: so must their cast be
            return expect_clear(
                lambda: function(*_replace(args, recipe.tensor, cast), **kwargs), accepted=f"accepted {cast.dtype}"
            )
        return expect_right_or_clear(
            lambda: function(*_replace(args, recipe.tensor, cast), **fresh()),
            lambda r: None if _same(r, reference) else f"{cast.dtype} input: another answer than its float64 values",
        )
    if kind == "complex":
        return expect_clear(
            lambda: function(*_replace(args, recipe.tensor, x.to(torch.complex128)), **kwargs),
            accepted="accepted a complex input",
        )
    if kind == "list":
        reference = function(*args, **fresh())
        return expect_right_or_clear(
            lambda: function(*_replace(args, recipe.tensor, x.tolist()), **fresh()),
            lambda r: None if _same(r, reference) else "a list input gave another answer than the tensor",
        )
    if kind == "scalar":
        return expect_clear(
            lambda: function(*_replace(args, recipe.tensor, x.reshape(-1)[0]), **kwargs),
            accepted="accepted a 0-d input",
        )
    raise AssertionError(kind)


def _keyword_attack(function, recipe: Recipe, parameter: inspect.Parameter, value: object, refuse: bool) -> Result:
    args, kwargs = recipe.make()
    names = list(inspect.signature(function).parameters)
    position = names.index(parameter.name)
    if position < len(args):
        args = _replace(args, position, value)
    else:
        kwargs = {**kwargs, parameter.name: value}
    call = lambda: function(*args, **kwargs)  # noqa: E731
    if refuse:
        return expect_clear(call, names=(parameter.name,), accepted=f"accepted {parameter.name}={value!r}")
    return expect_right_or_clear(call, lambda r: None, names=(parameter.name,))


# -- metrics ---------------------------------------------------------------------------------------


def _chains(draws: int = 60, chains: int = 3, event: tuple[int, ...] = (2,)) -> Tensor:
    return torch.randn(draws, chains, *event, generator=_gen(1), dtype=torch.float64)


def _metric_recipes() -> dict[str, Recipe]:
    from flows import Affine, Flow, StandardNormal
    from flows.targets import Gaussian

    def log_w(n: int = 40) -> Tensor:
        return torch.randn(n, generator=_gen(2), dtype=torch.float64)

    def points(n: int = 40) -> Tensor:
        return torch.randn(n, 2, generator=_gen(3), dtype=torch.float64)

    def angles(n: int = 40) -> Tensor:
        return (torch.rand(n, 2, generator=_gen(6), dtype=torch.float64) * 2 - 1) * math.pi

    means = torch.tensor([[-1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    return {
        "acceptance_rate": Recipe(lambda: ([torch.rand(20, 3, generator=_gen(4), dtype=torch.float64)], {})),
        "bits_per_dim": Recipe(lambda: ([log_w(), 4, 256], {}), any_rank=True),
        "effective_sample_size": Recipe(lambda: ([_chains()], {}), chains=True),
        "integrated_autocorr_time": Recipe(lambda: ([_chains()], {}), chains=True),
        "split_rhat": Recipe(lambda: ([_chains()], {}), chains=True),
        "free_energy_profile": Recipe(lambda: ([log_w(200)], {"bins": 5})),
        "kish_ess": Recipe(lambda: ([log_w()], {})),
        "log_z_estimate": Recipe(lambda: ([log_w()], {})),
        "log_importance_weights": Recipe(lambda: ([log_w(), log_w().flip(0)], {}), any_rank=True),
        "reweighted_mean": Recipe(lambda: ([log_w().exp(), log_w()], {})),
        "mode_weights": Recipe(lambda: ([points(), means], {})),
        "mode_weight_error": Recipe(lambda: ([points(), means], {})),
        "sliced_wasserstein": Recipe(lambda: ([points(), points(30) + 1], {"projections": 16, "generator": _gen(5)})),
        "tweedie_denoise": Recipe(lambda: ([Flow(Affine(2), StandardNormal(2)).double(), points(), 0.5], {}), tensor=1),
        "sample_log_weights": Recipe(
            lambda: ([Flow(Affine(2), StandardNormal(2)), Gaussian(2), 8], {"batch_size": 4}), tensor=None
        ),
        "histogram_kl": Recipe(lambda: ([angles(), angles(30)], {"bins": 8})),
        "torsion_periodic_distance": Recipe(lambda: ([angles(), angles().flip(0)], {}), any_rank=True),
        "state_free_energy": Recipe(lambda: ([angles()[:, 0] > 0, log_w()], {}), tensor=1),
    }


# -- particles -------------------------------------------------------------------------------------


def _particle_recipes() -> dict[str, Recipe]:
    from flows import Affine, Flow
    from flows.particles import MeanFreeNormal
    from flows.targets import DW4

    def configurations(rows: int = 3, seed: int = 6) -> Tensor:
        return torch.randn(rows, 8, generator=_gen(seed), dtype=torch.float64)

    def flow() -> Flow:
        return Flow(Affine(8), MeanFreeNormal(4, 2)).double()

    return {
        "align": Recipe(lambda: ([configurations(), configurations(seed=7), 4, 2], {})),
        "aligned_distances": Recipe(lambda: ([configurations(), configurations(seed=7), 4, 2], {})),
        "best_permutation": Recipe(lambda: ([configurations(1).reshape(4, 2), configurations(1, 7).reshape(4, 2)], {})),
        "kabsch": Recipe(lambda: ([configurations().reshape(3, 4, 2), configurations(seed=7).reshape(3, 4, 2)], {})),
        "path_lengths": Recipe(lambda: ([configurations(8), configurations(8, 7), 4, 2], {"batch_size": 4})),
        "remove_mean": Recipe(lambda: ([configurations(), 4, 2], {})),
        "nll_conventions": Recipe(lambda: ([7.2, 4, 2], {}), tensor=None),
        "subspace_basis": Recipe(lambda: ([4, 2], {}), tensor=None),
        "particle_nll": Recipe(lambda: ([flow(), configurations()], {"batch_size": 2}), tensor=1),
        "boltzmann_evaluation": Recipe(lambda: ([flow(), DW4(), 4], {"batch_size": 2}), tensor=None),
    }


# -- distributions as bases ------------------------------------------------------------------------


def _family_names() -> list[str]:
    import torch.distributions as td

    abstract = {"Distribution", "ExponentialFamily"}
    return sorted(
        n
        for n in td.__all__
        if inspect.isclass(getattr(td, n)) and issubclass(getattr(td, n), td.Distribution) and n not in abstract
    )


def _instance(name: str):
    """A small instance of the family ``name`` over two entries, parameters from ``transform_to`` of zeros."""
    import torch.distributions as td
    from torch.distributions import transforms as T

    two, eye = torch.ones(2), torch.eye(2)
    special = {
        "Independent": lambda: td.Independent(td.Normal(torch.zeros(2), two), 1),
        "MixtureSameFamily": lambda: td.MixtureSameFamily(td.Categorical(two), td.Normal(torch.zeros(2), two)),
        "TransformedDistribution": lambda: td.TransformedDistribution(
            td.Normal(torch.zeros(2), two), [T.AffineTransform(0.0, 2.0)]
        ),
        "LKJCholesky": lambda: td.LKJCholesky(2, 1.0),
        "Wishart": lambda: td.Wishart(torch.tensor(3.0), covariance_matrix=eye),
        "MultivariateNormal": lambda: td.MultivariateNormal(torch.zeros(2), eye),
        "LowRankMultivariateNormal": lambda: td.LowRankMultivariateNormal(torch.zeros(2), torch.ones(2, 1), two),
        "Uniform": lambda: td.Uniform(torch.zeros(2), two),
        "Pareto": lambda: td.Pareto(two, two),
        "GeneralizedPareto": lambda: td.GeneralizedPareto(torch.zeros(2), two, torch.zeros(2)),
        "RelaxedBernoulli": lambda: td.RelaxedBernoulli(torch.tensor(1.0), probs=0.5 * two),
        "RelaxedOneHotCategorical": lambda: td.RelaxedOneHotCategorical(torch.tensor(1.0), probs=0.5 * two),
    }
    if name in special:
        return special[name]()
    cls = getattr(td, name)
    kwargs = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in ("self", "validate_args") or p.default is not inspect.Parameter.empty:
            continue
        kwargs[p.name] = td.transform_to(cls.arg_constraints[p.name])(torch.zeros(2))
    if "probs" in cls.arg_constraints and not {"probs", "logits"} & set(kwargs):
        kwargs["probs"] = 0.5 * two
    return cls(**kwargs)


def _acceptable(d) -> bool:
    """The oracle: a continuous density on all of R^d (declared support holds the probes; scalar
    events: the density integrates to one over R)."""
    try:
        support = d.support
    except NotImplementedError:
        return False
    if support.is_discrete:
        return False
    probes = 10 * torch.randn(64, *d.batch_shape, *d.event_shape, generator=_gen(8))
    if not bool(torch.as_tensor(support.check(probes)).all()):
        return False
    if len(d.event_shape) == 0:
        grid = torch.linspace(-200.0, 200.0, 400_001, dtype=torch.float64)
        shape = (-1, *(1,) * len(d.batch_shape))
        density = d.log_prob(grid.reshape(shape).to(torch.get_default_dtype())).double().exp()
        mass = torch.trapezoid(density, grid, dim=0)
        return bool(((mass > 0.97) & (mass < 1.03)).all())
    return True


def _base_attack(name: str) -> Result:
    from flows import Affine, Flow

    d = _instance(name)
    features = int(torch.Size((*d.batch_shape, *d.event_shape)).numel())
    shape = (*d.batch_shape, *d.event_shape)
    if len(shape) != 1:  # a matrix-valued family (Wishart, LKJ): a flow on vectors cannot take it
        return expect_clear(lambda: Flow(Affine(features), d), accepted=f"accepted {name} with event {shape}")
    if not _acceptable(d):
        return expect_clear(lambda: Flow(Affine(features), d), accepted=f"accepted {name} (support {d.support})")

    def check(flow) -> str | None:
        z = torch.randn(5, features, generator=_gen(9))
        with torch.no_grad():
            reference = d.log_prob(z)
            reference = reference.sum(-1) if reference.dim() > 1 else reference
            got = flow.log_prob(z)
        return None if _same(got, reference) else f"the flow's log_prob differs from {name}'s"

    return expect_right_or_clear(lambda: Flow(Affine(features), d), check)


def _distribution_attacks() -> list[Attack]:
    out = [
        Attack(f"distribution/base/{name}", "distribution", functools.partial(_base_attack, name))
        for name in _family_names()
    ]

    def flow_distribution(conditional: bool):
        from flows import MAF, Affine, DiagNormal, Flow

        torch.manual_seed(0)
        if conditional:
            return MAF(2, 3, transforms=1, hidden=(4,))(torch.randn(4, 3))
        return Flow(Affine(2), DiagNormal(2))()

    def member(attribute: str, conditional: bool) -> Result:
        d = flow_distribution(conditional)
        value = torch.zeros(2)
        calls = {
            "mean": lambda: d.mean,
            "mode": lambda: d.mode,
            "variance": lambda: d.variance,
            "stddev": lambda: d.stddev,
            "entropy": lambda: d.entropy(),
            "perplexity": lambda: d.perplexity(),
            "cdf": lambda: d.cdf(value),
            "icdf": lambda: d.icdf(value),
            "enumerate_support": lambda: d.enumerate_support(),
        }
        return expect_clear(calls[attribute], accepted=f"FlowDistribution.{attribute} answered")

    def shapes(kind: str, conditional: bool) -> Result:
        from flows.flow import FlowDistribution

        d = flow_distribution(conditional)
        if kind.startswith("expand-"):
            bad = {
                "expand-negative": (-2,),
                "expand-fraction": (2.5,),
                "expand-string": "ab",
                "expand-narrower": (1,),
                "expand-other": (3,),
                "expand-trailing": (4, 2),
            }[kind]
            if not conditional and kind in ("expand-narrower", "expand-other", "expand-trailing"):
                return expect_right_or_clear(  # an unconditional distribution has batch (): any batch is an expansion
                    lambda: d.expand(bad).sample(),
                    lambda s: None if s.shape == (*bad, 2) else f"expand({bad}) gave samples {tuple(s.shape)}",
                )
            return expect_clear(lambda: d.expand(bad).sample(), accepted=f"expand({bad!r}) accepted")
        if kind == "batch-shape-negative":
            return expect_clear(lambda: FlowDistribution(d.flow, d.context, batch_shape=(-2,)))
        if kind == "sample-negative":
            return expect_clear(lambda: d.sample((-1,)))
        if kind == "log-prob-wrong-event":
            return expect_clear(lambda: d.log_prob(torch.zeros(4, 3)))
        if kind == "log-prob-nan":
            x = torch.zeros(4, 2)
            x[1, 0] = math.nan
            return expect_right_or_clear(lambda: d.log_prob(x), lambda r: None if _has_nan(r) else "NaN gave finite")
        if kind == "log-prob-int":
            reference = d.log_prob(torch.ones(4, 2))
            return expect_right_or_clear(
                lambda: d.log_prob(torch.ones(4, 2, dtype=torch.long)),
                lambda r: None if _same(r, reference) else "an integer value gave another log_prob",
            )
        raise AssertionError(kind)

    for conditional in (False, True):
        tag = "conditional" if conditional else "unconditional"
        for attribute in ("mean", "mode", "variance", "stddev", "entropy", "perplexity", "cdf", "icdf"):
            out.append(
                Attack(
                    f"distribution/{tag}/{attribute}",
                    "distribution",
                    functools.partial(member, attribute, conditional),
                )
            )
        out.append(
            Attack(
                f"distribution/{tag}/enumerate_support",
                "distribution",
                functools.partial(member, "enumerate_support", conditional),
            )
        )
        kinds = [
            "expand-negative",
            "expand-fraction",
            "expand-string",
            "expand-narrower",
            "expand-other",
            "expand-trailing",
            "batch-shape-negative",
            "sample-negative",
            "log-prob-wrong-event",
            "log-prob-nan",
            "log-prob-int",
        ]
        for kind in kinds:
            out.append(
                Attack(f"distribution/{tag}/{kind}", "distribution", functools.partial(shapes, kind, conditional))
            )

    def unused_context() -> Result:
        from flows import Affine, DiagNormal, Flow

        return expect_clear(lambda: Flow(Affine(2), DiagNormal(2), context=3), accepted="a context no layer reads")

    out.append(Attack("distribution/flow/context-unused", "distribution", unused_context))

    def degenerate_transform(label: str) -> Result:
        from torch.distributions import transforms as T

        from flows import TorchTransform

        make = {
            "power-zero": lambda: T.PowerTransform(0.0),
            "affine-zero-scale": lambda: T.AffineTransform(0.0, 0.0),
            "not-bijective": lambda: T.AbsTransform(),
        }[label]
        return expect_clear(lambda: TorchTransform(make(), 2), accepted=f"wrapped {label}")

    for label in ("power-zero", "affine-zero-scale", "not-bijective"):
        out.append(
            Attack(
                f"distribution/torch-transform/{label}", "distribution", functools.partial(degenerate_transform, label)
            )
        )
    return out


def _own_distribution_recipes() -> dict[str, Callable[[], object]]:
    import torch.distributions as td

    from flows.distributions import DiagNormal, Mixture, StandardNormal, TorchDistribution

    return {
        "StandardNormal": lambda: StandardNormal(2),
        "DiagNormal": lambda: DiagNormal(2),
        "Mixture": lambda: Mixture([DiagNormal(2), StandardNormal(2)], [0.3, 0.7]),
        "TorchDistribution": lambda: TorchDistribution(td.Independent(td.Normal(torch.zeros(2), torch.ones(2)), 1)),
    }


OWN_DISTRIBUTION_ATTACKS = (
    "construct",
    "nan-row",
    "huge-row",
    "empty",
    "wrong-event",
    "int",
    "sample",
    "sample-empty",
    "sample-negative",
)


def _own_distribution_attack(name: str, kind: str) -> Result:
    """``flows.distributions.<name>``: its ``log_prob`` and ``sample`` against bad rows, shapes and dtypes."""
    recipe = _own_distribution_recipes().get(name)
    if recipe is None:
        raise AttackFailed(Outcome.RAW_CRASH, f"no recipe builds {name}: add one to tests/robustness/values.py")
    d = recipe()
    if kind == "construct":
        return Result(Outcome.OK, "built")
    x = torch.randn(4, 2, generator=_gen(3))
    if kind in ("nan-row", "huge-row"):
        reference = d.log_prob(x)
        bad = x.clone()
        bad[1, 0] = math.nan if kind == "nan-row" else 1e30

        def check(lp: Tensor) -> str | None:
            if not _same(lp[[0, 2, 3]], reference[[0, 2, 3]]):
                return "clean rows changed"
            if kind == "nan-row":
                return None if bool(torch.isnan(lp[1])) else "a NaN row got a number"
            return None if bool(lp[1] < 0) and not bool(torch.isnan(lp[1])) else f"log_prob at 1e30 is {float(lp[1])}"

        return expect_right_or_clear(lambda: d.log_prob(bad), check)
    if kind == "empty":
        return expect_right_or_clear(
            lambda: d.log_prob(torch.zeros(0, 2)), lambda lp: None if lp.shape == (0,) else f"shape {tuple(lp.shape)}"
        )
    if kind == "wrong-event":
        return expect_clear(lambda: d.log_prob(torch.zeros(4, 3)), accepted="accepted 3 entries for an event of 2")
    if kind == "int":
        reference = d.log_prob(torch.ones(4, 2))
        return expect_right_or_clear(
            lambda: d.log_prob(torch.ones(4, 2, dtype=torch.long)),
            lambda lp: None if _same(lp, reference) else "an integer value gave another log_prob",
        )
    if kind in ("sample", "sample-empty"):
        n = 3 if kind == "sample" else 0
        return expect_right_or_clear(
            lambda: d.sample((n,)),
            lambda s: None if s.shape == (n, 2) and bool(torch.isfinite(s).all()) else f"samples {tuple(s.shape)}",
        )
    if kind == "sample-negative":
        return expect_clear(lambda: d.sample((-1,)), accepted="sample((-1,)) answered")
    raise AssertionError(kind)


def _own_distribution_attacks() -> list[Attack]:
    """Every member of ``flows.distributions.__all__`` but the abstract base (discovered, not listed)."""
    import flows.distributions

    names = sorted(set(flows.distributions.__all__) - {"Distribution"})
    return [
        Attack(f"distribution/{name}/{kind}", "distribution", functools.partial(_own_distribution_attack, name, kind))
        for name in names
        for kind in OWN_DISTRIBUTION_ATTACKS
    ]


def attacks() -> list[Attack]:
    """The metric, particle and distribution families of the table."""
    import flows.metrics
    import flows.particles

    try:
        metric_recipes, particle_recipes = _metric_recipes(), _particle_recipes()
    except Exception as error:  # a recipe that cannot be built is an attack failure, not a collection error
        raise AttackFailed(Outcome.RAW_CRASH, f"recipes: {error}") from error
    return [
        *_function_attacks("metric", flows.metrics, metric_recipes),
        *_function_attacks("particles", flows.particles, particle_recipes),
        *_distribution_attacks(),
        *_own_distribution_attacks(),
    ]
