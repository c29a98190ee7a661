"""Objective and option attacks: every training objective of ``flows.train``, every numeric CNF and spline option.

Two families, both discovered rather than listed:

* ``objective``: every :class:`~flows.train.Objective` subclass exported by ``flows.train`` is fed
  the batches maximum likelihood refuses (an empty batch, an event without its batch dimension,
  the wrong event width, integer data, a NaN or infinite row, a NaN or integer context, a context
  for an unconditional flow, no context for a conditional one). Each must be a clear error; a NaN
  row's error must name the row (a NaN loss would be dropped by the trainer's guard as a
  "non-finite step", silently losing the batch). An objective without a recipe below fails its
  ``construct`` attack until one is added (or it is listed in :data:`NO_DATA` with the reason).
* ``options``: every numeric argument (found by :func:`inspect.signature`: a default that is a
  number, or an ``int``/``float`` annotation) of :class:`~flows.CNF`, the spline and affine
  transformers, every registered builder and the data-free energy objectives (``ReverseKL``,
  ``ImportanceForwardKL``) gets ``inf``, ``NaN``, ``0``, ``-1``, a string
  and ``1e300``. Each must be a clear error or build a model whose outputs are finite.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from tests.robustness.table import Attack, AttackFailed, Outcome, Result, expect_clear, judge_error

__all__ = ["attacks"]

BATCH = 4
BAD_ROW = 1

NO_DATA = {
    "ReverseKL": "draws its own samples from the model; a batch is not its input (WeightedSum may pass one)",
    "ImportanceForwardKL": "draws its own proposal samples from the model and its moves; a batch is not its input",
    "PairRegression": "takes (z, x) latent-data pairs, not (x, context) batches; pair shapes are checked by "
    "pair_regression_loss",
    "Objective": "the abstract base class",
    "RepresentationAlignment": "needs a TarFlow on image tokens and an encoder of those images, not the family's "
    "(N, 2) batches; tests/test_alignment.py checks its bad inputs (a recipe is still owed, see docs/reliability.md)",
}
"""Objectives of ``flows.train`` that take no ``(x, context)`` data batch, with the reason."""


# -- objective recipes: (objective, unconditional model, conditional model with context width 1) ----


def _cnf_flow(context: int = 0):
    from flows import CNF, Flow, StandardNormal

    return Flow(CNF(2, context, hidden=(8,)), StandardNormal(2), context=context or None)


def _affine_flow(context: int = 0):
    from flows import MAF, Affine, Flow, StandardNormal

    if context:
        return MAF(2, context, transforms=1, hidden=(8,))
    return Flow(Affine(2), StandardNormal(2))


def _injective(context: int = 0):
    from flows import FreeFormInjectiveFlow

    return FreeFormInjectiveFlow(2, context, latent_features=1, hidden=(8,))


def _recipes() -> dict[str, tuple[Callable, Callable]]:
    from flows import train

    return {
        "FlowMatching": (lambda: train.FlowMatching(), _cnf_flow),
        "MaximumLikelihood": (lambda: train.MaximumLikelihood(), _affine_flow),
        "ForwardKL": (lambda: train.ForwardKL(), _affine_flow),
        "WeightedSum": (lambda: train.WeightedSum([(1.0, train.MaximumLikelihood())]), _affine_flow),
        "FreeFormInjectiveObjective": (lambda: train.FreeFormInjectiveObjective(), _injective),
    }


def objective_names() -> list[str]:
    """Every ``Objective`` subclass in ``flows.train.__all__`` (the family's discovery)."""
    from flows import train
    from flows.train.objectives import Objective

    return sorted(
        name
        for name in train.__all__
        if inspect.isclass(getattr(train, name, None)) and issubclass(getattr(train, name), Objective)
    )


def _batches() -> dict[str, tuple[bool, Callable[[], tuple]]]:
    """Attack name → (needs the conditional model, the batch)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 2, generator=gen)
    c = torch.randn(BATCH, 1, generator=gen)

    def poisoned(t: Tensor, value: float) -> Tensor:
        t = t.clone()
        t[BAD_ROW, 0] = value
        return t

    return {
        "empty-batch": (False, lambda: (x[:0],)),
        "one-dimensional-data": (False, lambda: (x[0],)),
        "wrong-event-width": (False, lambda: (torch.randn(BATCH, 3, generator=gen),)),
        "integer-data": (False, lambda: (torch.ones(BATCH, 2, dtype=torch.long),)),
        "nan-row": (False, lambda: (poisoned(x, math.nan),)),
        "inf-row": (False, lambda: (poisoned(x, math.inf),)),
        "context-for-unconditional": (False, lambda: (x, c)),
        "nan-context": (True, lambda: (x, poisoned(c, math.nan))),
        "integer-context": (True, lambda: (x, torch.ones(BATCH, 1, dtype=torch.long))),
        "missing-context": (True, lambda: (x,)),
    }


def _objective_attack(name: str, attack: str) -> Result:
    recipe = _recipes().get(name)
    if recipe is None:
        return Result(Outcome.RAW_CRASH, f"no recipe for objective {name}: add one to tests/robustness/objectives.py")
    make_objective, make_model = recipe
    conditional, batch = _batches()[attack]
    torch.manual_seed(0)
    model = make_model(1 if conditional else 0)
    objective = make_objective()
    try:
        objective(model, batch())
    except AttackFailed as failed:
        return Result(failed.outcome, str(failed))
    except Exception as error:
        result = judge_error(error)
        if result.outcome is Outcome.CLEAR_ERROR and attack in ("nan-row", "inf-row", "nan-context"):
            if f"index ({BAD_ROW}," not in str(error):
                return Result(Outcome.SILENT_WRONG, f"the error does not name row {BAD_ROW}: {result.detail}")
        return result
    return Result(Outcome.SILENT_WRONG, f"{attack} accepted (a loss came back)")


def _objective_attacks() -> list[Attack]:
    out: list[Attack] = []
    for name in objective_names():
        if name in NO_DATA:
            continue

        def construct(name=name) -> Result:
            if name not in _recipes():
                return Result(Outcome.RAW_CRASH, f"no recipe for {name}: add one, or list it in NO_DATA with why")
            return Result(Outcome.OK, "has a recipe")

        out.append(Attack(f"objective/{name}/construct", "objective", construct))
        for attack in _batches():
            out.append(
                Attack(
                    f"objective/{name}/{attack}", "objective", functools.partial(_objective_attack, name, attack), 30.0
                )
            )
    return out


# -- option attacks ----------------------------------------------------------------------------------

BAD_VALUES: dict[str, object] = {
    "inf": math.inf,
    "nan": math.nan,
    "zero": 0,
    "negative": -1,
    "string": "1",
    "huge": 1e300,
}


def _cnf_target():
    from flows import CNF

    def build(**options):
        return CNF(2, **{"hidden": (8,), "max_evaluations": 2_000, **options})

    def run(cnf) -> str | None:
        x = torch.randn(BATCH, 2, generator=torch.Generator().manual_seed(1))
        context = torch.randn(BATCH, cnf.context_features) if cnf.context_features else None
        z, ladj = cnf.forward_and_log_det(x, context)
        return None if bool(torch.isfinite(z).all() and torch.isfinite(ladj).all()) else "non-finite output"

    return CNF, build, run


def _transformer_target(cls_name: str):
    from flows.bijections import splines, transformers

    cls = getattr(splines, cls_name, None) or getattr(transformers, cls_name)

    def build(**options):
        return cls(**options)

    def run(tau) -> str | None:
        x = torch.randn(BATCH, 3, generator=torch.Generator().manual_seed(1)) * 3
        params = torch.randn(BATCH, 3, tau.params_per_dim, generator=torch.Generator().manual_seed(2))
        z, ladj = tau.forward_and_log_det(x, params)
        back = tau.inverse_and_log_det(z, params)[0]
        if not bool(torch.isfinite(z).all() and torch.isfinite(ladj).all()):
            return "non-finite output at finite input"
        if not torch.allclose(back, x, atol=1e-3, rtol=1e-3):
            return "the inverse does not invert"
        return None

    return cls, build, run


#: How the option family builds a builder that does not take a plain 2-D table: its event shape, extra
#: arguments, and the positional arguments that replace ``features`` (``None``: the shape).
SHAPES: dict[str, tuple[tuple[int, ...], dict, tuple | None]] = {
    "Glow": ((1, 4, 4), {"scales": 1, "steps": 1}, None),
    "FreeFormInjectiveFlow": ((2,), {"latent_features": 1}, None),
    "EquivariantCNF": ((6,), {}, (3, 2)),  # 3 particles in 2-D
}


def _dependent_target():
    """``DependentFlow`` around a small RealNVP over 6 related samples, scored by index."""
    from flows import DependentFlow, RealNVP

    def build(**options):
        return DependentFlow(RealNVP(2, transforms=1, hidden=(8,)), torch.eye(6), **options)

    def run(model) -> str | None:
        x = torch.randn(3, 2, generator=torch.Generator().manual_seed(1))
        log_p = model.log_prob_batch(x, torch.tensor([0, 4, 5]))
        return None if bool(torch.isfinite(log_p).all()) else "non-finite log_prob at finite data"

    return DependentFlow, build, run


def _builder_target(name: str):
    from flows.architectures.registry import builders

    cls = builders()[name]
    shape, extra, positional = SHAPES.get(name, ((2,), {}, None))
    small = {"hidden": (8,), "transforms": 1, **extra}

    def build(**options):
        args = {k: v for k, v in small.items() if k in inspect.signature(cls).parameters}
        if positional is not None:
            return cls(*positional, **{**args, **options})
        features = options.pop("features", shape if len(shape) > 1 else shape[0])
        return cls(features, **{**args, **options})

    def run(flow) -> str | None:
        rows = torch.rand if name == "Glow" else torch.randn  # Glow takes data in [0, 1) (its logit layer)
        x = rows(BATCH, *shape, generator=torch.Generator().manual_seed(1))
        width = flow.context_features or 0
        context = torch.randn(BATCH, width) if width else None
        log_p = flow.log_prob(x, context) if context is not None else flow.log_prob(x)
        return None if bool(torch.isfinite(log_p).all()) else "non-finite log_prob at finite data"

    return cls, build, run


def _energy_objective_target(name: str):
    """A data-free energy objective (:data:`NO_DATA`) on a 2-D Gaussian: one step and one validation."""
    from flows import Affine, Flow, StandardNormal, train
    from flows.targets import Gaussian

    cls = getattr(train, name)

    def build(**options):
        return cls(Gaussian(2), **{"batch_size": 16, "eval_samples": 16, **options})

    def run(objective) -> str | None:
        flow = Flow(Affine(2), StandardNormal(2))
        loss, _ = objective(flow, None)
        measures = objective.evaluate(flow, [None])
        if not (bool(torch.isfinite(loss)) and math.isfinite(measures["loss"])):
            return "a non-finite loss on a Gaussian"
        return None

    return cls, build, run


ENERGY_OBJECTIVES = ("ImportanceForwardKL", "ReverseKL")
"""The data-free objectives whose numeric options the option family attacks."""


def option_targets() -> dict[str, Callable]:
    """The option family's targets: the CNF, the spline and affine transformers, and every builder on a table."""
    from flows.architectures.registry import builders

    targets: dict[str, Callable] = {
        "CNF": _cnf_target,
        "RationalQuadraticSpline": functools.partial(_transformer_target, "RationalQuadraticSpline"),
        "AffineTransformer": functools.partial(_transformer_target, "AffineTransformer"),
    }
    for name in builders():  # every registered builder
        targets[name] = _dependent_target if name == "DependentFlow" else functools.partial(_builder_target, name)
    for name in ENERGY_OBJECTIVES:
        targets[name] = functools.partial(_energy_objective_target, name)
    return targets


def numeric_options(cls: type) -> list[str]:
    """Constructor arguments of ``cls`` that take a number: a numeric default or an int/float annotation."""
    out = []
    for name, p in inspect.signature(cls).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default_numeric = isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
        annotation = str(p.annotation)
        annotated = (
            any(word in annotation for word in ("int", "float"))
            and "Sequence" not in annotation
            and "Callable" not in annotation
        )
        if default_numeric or annotated:
            out.append(name)
    return out


def _option_attack(target: str, option: str, value: object) -> Result:
    _, build, run = option_targets()[target]()
    torch.manual_seed(0)
    try:
        model = build(**{option: value})
    except Exception as error:
        return judge_error(error, names=(option,))
    try:
        problem = run(model)
    except Exception as error:  # a clear error when used is acceptable too (e.g. the evaluation bound)
        return judge_error(error, names=(option,))
    if problem:
        return Result(Outcome.SILENT_WRONG, f"{option}={value!r} accepted: {problem}")
    return Result(Outcome.OK, f"{option}={value!r} builds a model with finite outputs")


def _option_attacks() -> list[Attack]:
    out: list[Attack] = []
    for target, make in option_targets().items():
        cls = make()[0]
        for option in numeric_options(cls):
            for label, value in BAD_VALUES.items():
                out.append(
                    Attack(
                        f"options/{target}/{option}-{label}",
                        "options",
                        functools.partial(_option_attack, target, option, value),
                        30.0,
                    )
                )
    return out


def _runaway_interval() -> Result:
    """Issue 27's hang: ``t1=1e300`` ran 395,589 evaluations; ``1e30`` (finite in float32) must stop at the bound."""
    _, build, run = _cnf_target()
    # Seeded: for some random fields (2 of 12 seeds) the flow has an attractor, the adaptive steps grow
    # without bound once there, and a solve over [0, 1e30] ends legitimately inside the bound; seed 0's
    # field keeps moving, so the solve must hit max_evaluations.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        cnf = build(t1=1e30)
    return expect_clear(lambda: run(cnf), names=("max_evaluations",), accepted="a solve over [0, 1e30]")


def attacks() -> list[Attack]:
    """The objective and option families."""
    bounded = Attack("options/CNF/t1-runaway-interval", "options", _runaway_interval, 60.0)
    return [*_objective_attacks(), *_option_attacks(), bounded]
