"""API attacks: every registry transform, every paper-named builder, every energy target, every MCMC kernel.

The lists are discovered, not written out: transforms come from ``tests/registry`` (which fails
when an exported transform has no case), builders from the public registry
(:func:`flows.architectures.registry.builders`; the builder family attacks those of the
``(features, context, ...)`` shape, the others are listed with the family that attacks them),
targets from ``flows.targets.__all__`` and kernels from ``flows.mcmc.__all__``. A new member of
any of them is attacked by every attack of its family without a new test; a target or kernel that
cannot be built from the recipes below fails its ``construct`` attack until a recipe is added.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from tests.robustness.table import Attack, AttackFailed, Outcome, Result, expect_clear, expect_right_or_clear

__all__ = ["attacks"]

BATCH = 4
BAD_ROW = 1


# -- helpers ---------------------------------------------------------------------------------------


def _same(a: Tensor, b: Tensor, atol: float = 1e-6) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=atol, equal_nan=True))


def _poisoned_rows_check(reference: tuple[Tensor, Tensor], value: float, finite_input: bool):
    """Check a ``(z, ladj)`` of a batch whose row ``BAD_ROW`` was poisoned: the other rows are unchanged;
    a NaN row stays visible (non-finite); a finite input never turns into NaN."""

    def check(result) -> str | None:
        z, ladj = result
        z_ref, ladj_ref = reference
        keep = [i for i in range(BATCH) if i != BAD_ROW]
        if z.shape != z_ref.shape or ladj.shape != ladj_ref.shape:
            expected = f"{tuple(z_ref.shape)}/{tuple(ladj_ref.shape)}"
            return f"expected shapes {expected}, got {tuple(z.shape)}/{tuple(ladj.shape)}"
        if not (_same(z[keep], z_ref[keep]) and _same(ladj[keep], ladj_ref[keep])):
            return f"the clean rows changed when row {BAD_ROW} held {value}"
        bad_z, bad_ladj = z[BAD_ROW], ladj[BAD_ROW]
        if value != value and bool(torch.isfinite(bad_z).all() and torch.isfinite(bad_ladj).all()):
            return "a NaN input row came out finite"
        if finite_input and bool(torch.isnan(bad_z).any() or torch.isnan(bad_ladj).any()):
            return f"a finite input ({value:g}) came out NaN"
        return None

    return check


@functools.cache
def _prepared(name: str):
    """The registry case ``name``, built in float64 like ``tests/test_registry.py``, in eval mode."""
    from flows.testing import perturb_parameters
    from tests.registry import all_cases

    case = next(c for c in all_cases() if c.name == name)
    torch.manual_seed(0)
    t = case.make().double()
    gen = torch.Generator().manual_seed(1)
    if case.warmup:
        t.train()
        with torch.no_grad():
            t(case.inputs((16,), gen), case.contexts((16,), gen))
    perturb_parameters(t, case.perturb, generator=torch.Generator().manual_seed(2))
    return case, t.eval()


def _inputs(case, batch=(BATCH,)):
    gen = torch.Generator().manual_seed(3)
    return case.inputs(batch, gen), case.contexts(batch, gen)


def _fused(t, direction: str):
    return t.forward_and_log_det if direction == "forward" else t.inverse_and_log_det


def _side_inputs(case, t, direction: str, batch=(BATCH,)):
    """Valid inputs of the given direction: data for forward, latents (the image of data) for inverse."""
    x, c = _inputs(case, batch)
    if direction == "inverse":
        with torch.no_grad():
            x = t.forward_and_log_det(x, c)[0]
    return x, c


# -- transforms (the registry) ---------------------------------------------------------------------


def _transform_attacks(name: str, context: int, event_shape: tuple[int, ...]) -> list[Attack]:
    out: list[Attack] = []

    def add(attack: str, fn: Callable[[], Result], timeout: float = 30.0) -> None:
        out.append(Attack(f"api/{name}/{attack}", "api", fn, timeout))

    for direction in ("forward", "inverse"):

        def empty(direction=direction) -> Result:
            case, t = _prepared(name)
            x, c = _side_inputs(case, t, direction, (0,))
            shape_out = t.event_shape_out if direction == "forward" else t.event_shape

            def check(result) -> str | None:
                z, ladj = result
                if z.shape[0] != 0 or ladj.shape != (0,):
                    return (
                        f"expected an empty output (0, ...) and ladj (0,), got {tuple(z.shape)} and {tuple(ladj.shape)}"
                    )
                if len(z.shape) != 1 + len(shape_out):
                    return f"expected output of rank {1 + len(shape_out)}, got {tuple(z.shape)}"
                return None

            with torch.no_grad():
                return expect_right_or_clear(lambda: _fused(t, direction)(x, c), check)

        add(f"{direction}-empty-batch", empty)

        def wrong_event(direction=direction, size_one: bool = False) -> Result:
            case, t = _prepared(name)
            x, c = _side_inputs(case, t, direction)
            n = x.shape[1]
            if size_one and n == 1:
                return Result(Outcome.OK, "the first event axis already has size 1")
            new = 1 if size_one else n + 1
            bad = torch.cat([x, x[:, :1]], dim=1) if new > n else x[:, :1].contiguous()
            with torch.no_grad():
                return expect_clear(
                    lambda: _fused(t, direction)(bad, c), accepted=f"accepted an event axis of size {new}"
                )

        add(f"{direction}-wrong-event-size", wrong_event)
        add(f"{direction}-broadcastable-event", functools.partial(wrong_event, size_one=True))

        def missing_batch(direction=direction) -> Result:
            case, t = _prepared(name)
            x, c = _side_inputs(case, t, direction)
            bad = x[0, 0]  # a vector event loses its axis (a scalar); an image event loses its channels
            with torch.no_grad():
                return expect_clear(
                    lambda: _fused(t, direction)(bad, c), accepted="accepted an input missing event axes"
                )

        add(f"{direction}-missing-event-axis", missing_batch)

    def dtype_attack(dtype: torch.dtype) -> Result:
        case, t = _prepared(name)
        x, c = _inputs(case)
        if dtype.is_complex:
            with torch.no_grad():
                return expect_clear(lambda: t.forward_and_log_det(x.to(dtype), c), accepted=f"accepted {dtype} input")
        cast = x.round() if not dtype.is_floating_point else x
        cast = cast.to(dtype)
        try:
            with torch.no_grad():
                z_ref, ladj_ref = t.forward_and_log_det(cast.double(), c)
        except ValueError:  # the values themselves are out of the domain: the cast input must be refused too
            with torch.no_grad():
                return expect_clear(lambda: t.forward_and_log_det(cast, c), accepted=f"accepted {dtype} input")

        def check(result) -> str | None:
            z, ladj = result
            if not (z.is_floating_point() and ladj.is_floating_point()):
                return f"{dtype} input gave {z.dtype}/{ladj.dtype} outputs (fractions dropped)"
            tol = 5e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
            if not (_same(z, z_ref, tol) and _same(ladj, ladj_ref, tol)):
                return f"{dtype} input gave values that differ from the float64 computation"
            return None

        with torch.no_grad():
            return expect_right_or_clear(lambda: t.forward_and_log_det(cast, c), check)

    add("int-input", lambda: dtype_attack(torch.int64))
    add("complex-input", lambda: dtype_attack(torch.complex128))
    add("float16-input", lambda: dtype_attack(torch.float16))
    add("float32-input", lambda: dtype_attack(torch.float32))

    def poisoned(value: float) -> Result:
        case, t = _prepared(name)
        x, c = _inputs(case)
        with torch.no_grad():
            reference = t.forward_and_log_det(x, c)
            bad = x.clone()
            bad[BAD_ROW].view(-1)[0] = value
            return expect_right_or_clear(
                lambda: t.forward_and_log_det(bad, c), _poisoned_rows_check(reference, value, value == 1e30)
            )

    add("nan-row", lambda: poisoned(float("nan")))
    add("inf-row", lambda: poisoned(float("inf")))
    add("huge-row", lambda: poisoned(1e30))

    if context:

        def context_attack(kind: str) -> Result:
            case, t = _prepared(name)
            x, c = _inputs(case)
            if kind == "nan":
                with torch.no_grad():
                    reference = t.forward_and_log_det(x, c)
                    bad = c.clone()
                    bad[BAD_ROW, 0] = float("nan")
                    return expect_right_or_clear(
                        lambda: t.forward_and_log_det(x, bad), _poisoned_rows_check(reference, float("nan"), False)
                    )
            if kind in ("batch-broadcast", "int"):  # right result: the expanded / float context's
                same = c[:1].expand_as(c) if kind == "batch-broadcast" else c.round()
                bad = c[:1] if kind == "batch-broadcast" else c.round().long()
                with torch.no_grad():
                    reference = t.forward_and_log_det(x, same)
                    return expect_right_or_clear(
                        lambda: t.forward_and_log_det(x, bad),
                        lambda r: (
                            None
                            if _same(r[0], reference[0]) and _same(r[1], reference[1])
                            else f"a {kind} context gave a different result from its explicit form"
                        ),
                    )
            bad = {"missing": None, "wrong-width": torch.cat([c, c[:, :1]], dim=-1), "batch-mismatch": c[:-1]}[kind]
            with torch.no_grad():
                return expect_clear(lambda: t.forward_and_log_det(x, bad), accepted=f"accepted a {kind} context")

        for kind in ("missing", "wrong-width", "batch-mismatch", "batch-broadcast", "int", "nan"):
            add(f"context-{kind}", functools.partial(context_attack, kind))
    else:

        def unexpected_context() -> Result:
            case, t = _prepared(name)
            x, _ = _inputs(case)
            with torch.no_grad():
                reference = t.forward_and_log_det(x)
            return expect_right_or_clear(
                lambda: t.forward_and_log_det(x, torch.randn(BATCH, 2, dtype=x.dtype)),
                lambda r: (
                    None if _same(r[0], reference[0]) and _same(r[1], reference[1]) else "a context changed the output"
                ),
            )

        add("context-unexpected", unexpected_context)

    if event_shape and len(event_shape) >= 1:

        def fresh_train_nan() -> Result:
            """A fresh layer's first train-mode batch holds a NaN row: data-dependent state must stay finite."""
            case, _ = _prepared(name)
            if not case.warmup:
                return Result(Outcome.OK, "no data-dependent initialisation")
            torch.manual_seed(0)
            t = case.make().double().train()
            x, c = _inputs(case, (16,))
            x[BAD_ROW].view(-1)[0] = float("nan")

            def check(_) -> str | None:
                state = [*t.parameters(), *(b for b in t.buffers() if b.is_floating_point())]
                if not all(bool(torch.isfinite(p).all()) for p in state):
                    return "a NaN in the first batch left non-finite parameters or buffers behind"
                return None

            with torch.no_grad():
                return expect_right_or_clear(lambda: t.forward_and_log_det(x, c), check)

        add("fresh-train-nan-batch", fresh_train_nan)
    return out


def _registry_attacks() -> list[Attack]:
    from tests.registry import all_cases

    attacks: list[Attack] = []
    for case in all_cases():
        attacks += _transform_attacks(case.name, case.context, case.event_shape)
    return attacks


# -- builders (paper-named flows) ------------------------------------------------------------------

_SMALL = {"transforms": 1, "hidden": (8,)}
_BUILDER_ARGS: dict[str, tuple[tuple, dict]] = {
    "Glow": (((1, 4, 4),), {"scales": 1, "steps": 1, "hidden": (4, 4)}),
    "FFJORD": ((3,), {"hidden": (8,), "rtol": 1e-3, "atol": 1e-3, "trace": "exact"}),
    "FreeFormInjectiveFlow": ((3,), {"latent_features": 2, "hidden": (8,)}),
}


def _builders() -> dict[str, type]:
    """Every builder of the public registry, sorted by name."""
    from flows.architectures.registry import builders

    return builders()


def _dependent(context: int = 0, **override):
    from flows import RealNVP
    from flows.architectures.dependent import DependentFlow

    relationship = torch.eye(6, dtype=torch.float64) * 0.8 + 0.2
    # as built: a float32 flow over a float64 base (the model file records "dtype": null for it)
    return DependentFlow(RealNVP(2, **{**_SMALL, **override}), relationship, lam=0.3)


def _equivariant(context: int = 0, **override):
    from flows.particles import EquivariantCNF

    return EquivariantCNF(3, 2, **{"hidden": (8,), "rtol": 1e-5, "atol": 1e-5, **override})


#: Builders whose constructor is not ``(features or shape, context, ...)``: how to build a tiny one, and the family
#: that attacks them (the builder family's bad ``features``/``context``/``transforms`` attacks do not apply).
_OTHER_SHAPES: dict[str, tuple[Callable[..., object], str]] = {
    "DependentFlow": (_dependent, "model-file (its arguments are a flow and a relationship matrix)"),
    "EquivariantCNF": (_equivariant, "model-file and particles (its arguments are particle counts)"),
}


def _builder_shaped() -> tuple[list[str], list[str]]:
    """The registered builders the builder family attacks, and those of another shape that have no recipe."""
    shaped, missing = [], []
    for name, cls in _builders().items():
        first = [p for p in inspect.signature(cls.__init__).parameters if p != "self"][:2]
        if first in (["features", "context"], ["shape", "context"]):
            shaped.append(name)
        elif name not in _OTHER_SHAPES:
            missing.append(name)
    return shaped, missing


def _build(name: str, context: int = 0, **override):
    if name in _OTHER_SHAPES:
        torch.manual_seed(0)
        return _OTHER_SHAPES[name][0](context, **override)
    cls = _builders()[name]
    args, kwargs = _BUILDER_ARGS.get(name, ((3,), dict(_SMALL)))
    kwargs = {**kwargs, **override}
    torch.manual_seed(0)
    return cls(*args, context, **kwargs) if context else cls(*args, **kwargs)


@functools.cache
def _built(name: str, context: int):
    return _build(name, context).double().eval()


def _data(model, batch=(BATCH,), context: int = 0):
    gen = torch.Generator().manual_seed(5)
    shape = (*batch, *model.event_shape) if hasattr(model, "event_shape") else (*batch, 3)
    x = 0.05 + 0.9 * torch.rand(shape, generator=gen, dtype=torch.float64)
    c = torch.randn((*batch, context), generator=gen, dtype=torch.float64) if context else None
    return x, c


def _builder_attacks() -> list[Attack]:
    out: list[Attack] = []
    shaped, missing = _builder_shaped()
    for name in missing:  # a registered builder of another shape fails here until it has a recipe

        def no_recipe(name=name) -> Result:
            return Result(
                Outcome.RAW_CRASH, f"no recipe builds {name}: add one to _OTHER_SHAPES in tests/robustness/api.py"
            )

        out.append(Attack(f"builder/{name}/recipe", "builder", no_recipe))
    for name in shaped:

        def add(attack: str, fn, name=name, timeout: float = 60.0) -> None:
            out.append(Attack(f"builder/{name}/{attack}", "builder", fn, timeout))

        first = "shape" if name == "Glow" else "features"
        bad_firsts = {"zero": 0, "negative": -1, "fraction": 2.5, "string": "3"}
        if name == "Glow":
            bad_firsts = {"zero": (0, 4, 4), "negative": (1, -4, 4), "vector": (3,), "odd": (1, 3, 3)}
        for label, value in bad_firsts.items():

            def ctor(value=value, name=name, first=first) -> Result:
                cls = _builders()[name]
                kwargs = _BUILDER_ARGS.get(name, ((3,), dict(_SMALL)))[1]
                return expect_clear(
                    lambda: cls(value, **kwargs), names=(first,), accepted=f"built with {first}={value!r}"
                )

            add(f"construct-{first}-{label}", ctor)
        for option, values in (("context", (-1,)), ("transforms", (0, -1)), ("hidden", ((0,), (-1,)))):
            if name == "Glow" and option == "transforms":
                option, values = "steps", (0, -1)
            for value in values:

                def ctor_option(option=option, value=value, name=name) -> Result:
                    def call():
                        if option == "context":
                            args, kwargs = _BUILDER_ARGS.get(name, ((3,), dict(_SMALL)))
                            return _builders()[name](*args, value, **kwargs)
                        return _build(name, **{option: value})

                    if value == 0 and option in ("transforms", "steps"):

                        def check(model) -> str | None:  # zero layers: the flow is its base distribution
                            x, _ = _data(model.double())
                            lp = model.log_prob(x)
                            return (
                                None
                                if bool(torch.isfinite(lp).all())
                                else "a flow without layers gave non-finite log_prob"
                            )

                        return expect_right_or_clear(call, check, names=(option,))
                    return expect_clear(call, names=(option,), accepted=f"built with {option}={value!r}")

                add(f"construct-{option}-{value!s}".replace(" ", ""), ctor_option)

        for context in (0, 2):
            tag = "cond-" if context else ""

            def log_prob_attack(kind: str, name=name, context=context) -> Result:
                model = _built(name, context)
                x, c = _data(model, context=context)
                with torch.no_grad():
                    if kind == "empty":
                        x0, c0 = _data(model, (0,), context)
                        return expect_right_or_clear(
                            lambda: model.log_prob(x0, context=c0),
                            lambda lp: (
                                None if lp.shape == (0,) else f"expected log_prob of shape (0,), got {tuple(lp.shape)}"
                            ),
                        )
                    if kind in ("nan-row", "inf-row"):
                        bad = x.clone()
                        bad[BAD_ROW].view(-1)[0] = float("nan" if kind == "nan-row" else "inf")
                        reference = model.log_prob(x, context=c)

                        def check(lp) -> str | None:
                            keep = [i for i in range(BATCH) if i != BAD_ROW]
                            if not _same(lp[keep], reference[keep]):
                                return "clean rows changed"
                            if bool(torch.isfinite(lp[BAD_ROW])) and kind == "nan-row":
                                return "a NaN row got a finite log_prob"
                            return None

                        return expect_right_or_clear(lambda: model.log_prob(bad, context=c), check)
                    if kind == "wrong-event":
                        bad = torch.cat([x, x[:, :1]], dim=1)
                        return expect_clear(lambda: model.log_prob(bad, context=c))
                    if kind == "int":
                        return expect_right_or_clear(
                            lambda: model.log_prob((x * 2).round().long(), context=c),
                            lambda lp: (
                                None
                                if _same(lp, model.log_prob((x * 2).round().double(), context=c))
                                else "integer input gave a different log_prob"
                            ),
                        )
                    if kind == "sample-empty":
                        c0 = None if not context else torch.randn(0, context, dtype=torch.float64)
                        return expect_right_or_clear(
                            lambda: model.sample((0,), context=c0) if context else model.sample((0,)),
                            lambda s: None if s.shape[0] == 0 else f"expected 0 samples, got {tuple(s.shape)}",
                        )
                    if kind == "sample-negative":
                        return expect_clear(lambda: model.sample((-1,)))
                    bad_context = {
                        "context-missing": None,
                        "context-wrong-width": None if c is None else torch.cat([c, c[:, :1]], dim=-1),
                        "context-batch-mismatch": None if c is None else c[:-1],
                        "context-unexpected": torch.randn(BATCH, 2, dtype=torch.float64),
                    }[kind]
                    if kind == "context-unexpected":
                        reference = model.log_prob(x)
                        return expect_right_or_clear(
                            lambda: model.log_prob(x, context=bad_context),
                            lambda lp: None if _same(lp, reference) else "a context changed an unconditional log_prob",
                        )
                    return expect_clear(lambda: model.log_prob(x, context=bad_context))

            kinds = ["empty", "nan-row", "inf-row", "wrong-event", "int", "sample-empty"]
            kinds += (
                ["context-missing", "context-wrong-width", "context-batch-mismatch"]
                if context
                else [
                    "sample-negative",
                    "context-unexpected",
                ]
            )
            for kind in kinds:
                add(f"{tag}{kind}", functools.partial(log_prob_attack, kind))
    return out


# -- energy targets --------------------------------------------------------------------------------


def _target_recipes() -> dict[str, Callable[[], object]]:
    import flows.targets as targets

    return {
        "Gaussian": lambda: targets.Gaussian(2),
        "GaussianMixture": lambda: targets.GaussianMixture(torch.tensor([[-2.0, 0.0], [2.0, 0.0]])),
        "InterpolatedEnergy": lambda: targets.InterpolatedEnergy(targets.Gaussian(2), targets.DoubleWell(), 0.5),
        "TemperedEnergy": lambda: targets.TemperedEnergy(targets.DoubleWell(), 2.0),
        "TransformedTarget": lambda: targets.TransformedTarget(targets.DoubleWell(), _affine(2)),
        "PhiFour": lambda: targets.PhiFour(4),
        "OpenMMTarget": lambda: targets.OpenMMTarget(targets.AlanineDipeptide().system, 300.0),
    }


# the protocol, the base classes and the adapter
_ABSTRACT_TARGETS = {"Energy", "EnergyTarget", "ParticleSystem", "ProtocolTarget", "as_target"}


def _affine(features: int):
    from flows import Affine

    return Affine(features)


def _make_target(name: str):
    import flows.targets as targets

    recipe = _target_recipes().get(name)
    if recipe is not None:
        return recipe()
    cls = getattr(targets, name)
    for args in ((), (2,)):
        try:
            return cls(*args)
        except TypeError:
            continue
    raise AttackFailed(Outcome.RAW_CRASH, f"no recipe builds {name}: add one to tests/robustness/api.py")


def _target_attacks() -> list[Attack]:
    import flows.targets as targets

    out: list[Attack] = []
    for name in sorted(set(targets.__all__) - _ABSTRACT_TARGETS):

        def attack(kind: str, name=name) -> Result:
            target = _make_target(name)
            if kind == "construct":
                return Result(Outcome.OK, "built")
            gen = torch.Generator().manual_seed(7)
            x = torch.randn(BATCH, *target.event_shape, generator=gen)
            if kind in ("huge-row", "nan-row", "minus-huge-row"):
                value = {"huge-row": 1e30, "minus-huge-row": -1e30, "nan-row": float("nan")}[kind]
                reference = target.log_prob(x)
                bad = x.clone()
                bad[BAD_ROW].view(-1)[0] = value

                def check(lp) -> str | None:
                    keep = [i for i in range(BATCH) if i != BAD_ROW]
                    if not _same(lp[keep], reference[keep], 1e-5):
                        return "clean rows changed"
                    if value == value and bool(torch.isnan(lp[BAD_ROW])):
                        return f"log_prob at {value:g} is NaN (expected -inf or a finite value)"
                    if value == value and bool(lp[BAD_ROW] == float("inf")):
                        return f"log_prob at {value:g} is +inf"
                    if value != value and bool(torch.isfinite(lp[BAD_ROW])):
                        return "a NaN row got a finite log_prob"
                    return None

                return expect_right_or_clear(lambda: target.log_prob(bad), check)
            if kind == "empty":
                x0 = torch.randn(0, *target.event_shape)
                return expect_right_or_clear(
                    lambda: target.log_prob(x0),
                    lambda lp: None if lp.shape == (0,) else f"expected shape (0,), got {tuple(lp.shape)}",
                )
            if kind == "wrong-event":
                bad = torch.cat([x, x[:, :1]], dim=1)
                return expect_clear(lambda: target.energy(bad))
            if kind in ("int", "complex"):
                bad = x.round().long() if kind == "int" else x.to(torch.complex64)
                return expect_clear(lambda: target.energy(bad), accepted=f"accepted {bad.dtype} positions")
            if kind == "float64":
                reference = target.log_prob(x)
                return expect_right_or_clear(
                    lambda: target.log_prob(x.double()),
                    lambda lp: (
                        None
                        if lp.dtype == torch.float64 and _same(lp, reference, 1e-4)
                        else f"float64 input gave {lp.dtype} values {lp.tolist()} (float32: {reference.tolist()})"
                    ),
                )
            raise AssertionError(kind)

        for kind in (
            "construct",
            "huge-row",
            "minus-huge-row",
            "nan-row",
            "empty",
            "wrong-event",
            "int",
            "complex",
            "float64",
        ):
            out.append(Attack(f"target/{name}/{kind}", "target", functools.partial(attack, kind)))
    return out


# -- MCMC kernels ----------------------------------------------------------------------------------


def _kernel_recipes() -> dict[str, Callable[[object], object]]:
    import flows
    import flows.mcmc as mcmc

    def flow():
        torch.manual_seed(0)
        return flows.RealNVP(2, transforms=1, hidden=(8,))

    return {
        "RandomWalk": lambda t: mcmc.RandomWalk(t),
        "MALA": lambda t: mcmc.MALA(t),
        "HMC": lambda t: mcmc.HMC(t, leapfrog_steps=2),
        "IMH": lambda t: mcmc.IMH(t, flow()),
        "ISIR": lambda t: mcmc.ISIR(t, flow(), n_proposals=2),
        "NeuTra": lambda t: mcmc.NeuTra(t, flow()),
        "GlobalLocal": lambda t: mcmc.GlobalLocal(mcmc.IMH(t, flow()), mcmc.MALA(t), local_steps=1),
    }


def _kernel_names() -> list[str]:
    import flows.mcmc as mcmc
    from flows.mcmc.base import Kernel

    return sorted(
        n
        for n in mcmc.__all__
        if inspect.isclass(getattr(mcmc, n))
        and issubclass(getattr(mcmc, n), Kernel)
        and getattr(mcmc, n) is not Kernel
        and not inspect.isabstract(getattr(mcmc, n))
    )


def _mcmc_attacks() -> list[Attack]:
    out: list[Attack] = []
    for name in _kernel_names():

        def attack(kind: str, name=name) -> Result:
            import flows.targets as targets

            recipe = _kernel_recipes().get(name)
            if recipe is None:
                return Result(Outcome.RAW_CRASH, f"no recipe builds {name}: add one to tests/robustness/api.py")
            target = targets.DoubleWell() if kind == "inf-energy" else targets.Gaussian(2)
            kernel = recipe(target)
            x = torch.randn(BATCH, 2, generator=torch.Generator().manual_seed(9))
            if kind == "construct":
                return Result(Outcome.OK, "built")

            def run(start):
                state = kernel.init(start)
                new, info = kernel.step(state)
                return start, new, info

            if kind == "empty":
                return expect_right_or_clear(
                    lambda: run(x[:0]),
                    lambda r: None if r[1].x.shape == (0, 2) else f"expected (0, 2) states, got {tuple(r[1].x.shape)}",
                )
            if kind == "wrong-event":
                return expect_clear(lambda: run(torch.randn(BATCH, 3)))
            bad = x.clone()
            bad[BAD_ROW, 0] = {"nan-start": float("nan"), "inf-start": float("inf"), "inf-energy": 1e30}[kind]
            return expect_clear(lambda: run(bad), accepted=f"started chains from {bad[BAD_ROW].tolist()}")

        for kind in ("construct", "empty", "wrong-event", "nan-start", "inf-start", "inf-energy"):
            out.append(Attack(f"mcmc/{name}/{kind}", "mcmc", functools.partial(attack, kind)))
    return out


def attacks() -> list[Attack]:
    """The API part of the table."""
    return [*_registry_attacks(), *_builder_attacks(), *_target_attacks(), *_mcmc_attacks()]
