"""Input checks shared by transforms, distributions and flows: clear "expected ..., got ..." errors."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "Shape",
    "as_sample_shape",
    "as_shape",
    "check_context",
    "check_context_like",
    "check_event",
    "check_finite",
    "check_like",
    "check_real",
    "format_shape",
    "shapes_match",
    "under_differentiation_transform",
    "under_vmap",
]


Shape = tuple[int | None, ...]


def as_shape(shape: int | Sequence[int | None], name: str = "shape", *, allow_none: bool = True) -> Shape:
    """Normalise an ``int`` or a sequence of sizes to a tuple of positive ints.

    ``None`` entries (when allowed) stand for "any size", e.g. the height and width of a
    convolutional layer's ``(C, None, None)`` event.

    Raises:
        ValueError: if an entry is not a positive integer (or ``None`` when allowed).
    """
    if isinstance(shape, int):
        shape = (shape,)
    try:
        out = tuple(None if (s is None and allow_none) else int(s) for s in shape)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be an int or a sequence of ints, got {shape!r}") from error
    if any(s is not None and s <= 0 for s in out):
        raise ValueError(f"{name} must contain positive sizes, got {out}")
    return out


def shapes_match(a: Sequence[int | None], b: Sequence[int | None]) -> bool:
    """Whether two event shapes agree, ``None`` matching any size."""
    return len(a) == len(b) and all(p is None or q is None or p == q for p, q in zip(a, b, strict=True))


def format_shape(shape: Sequence[int | None]) -> str:
    """``(3, None, None)`` → ``"(3, H, W)"``-style text for messages (``*`` for free sizes)."""
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_event(x: Tensor, event_shape: Sequence[int | None], who: str, what: str = "input") -> None:
    """Raise if the trailing dimensions of ``x`` are not ``event_shape`` (``None`` = any size).

    Args:
        x: tensor of shape ``(*batch, *event_shape)``.
        event_shape: the expected event shape.
        who: name of the object doing the check, used in the message.
        what: name of the argument, used in the message.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected {what} to be a torch.Tensor, got {type(x).__name__}")
    n = len(event_shape)
    if x.dim() >= n and tuple(x.shape[x.dim() - n :]) == tuple(event_shape):  # fast path: every call of every layer
        return
    if x.dim() < n or not shapes_match(x.shape[x.dim() - n :], event_shape):
        expected = ", ".join("*" if s is None else str(s) for s in event_shape)
        raise ValueError(f"{who}: expected {what} of shape (*batch, {expected}), got {tuple(x.shape)}")


def under_vmap(x: object) -> bool:
    """Whether ``x`` is a tensor batched by :func:`torch.func.vmap` (at any level of functorch wrapping).

    A value check that reads a tensor into Python (``bool(x.all())``) cannot run on a batched tensor:
    vmap refuses data-dependent control flow, and one row cannot raise for the others. The input checks
    skip such checks under vmap (see :func:`check_finite`); shapes, dtypes and devices are still checked.
    Tensors of ``torch.func.grad``/``jacrev``/``jvp`` alone are not batched: the checks run there.
    """
    if not isinstance(x, Tensor) or torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(x):
        if functorch.is_batchedtensor(x):
            return True
        x = functorch.get_unwrapped(x)
    return False


def under_differentiation_transform() -> bool:
    """Whether a :mod:`torch.func` ``grad``/``vjp``/``jacrev``/``jacfwd``/``jvp`` transform is running.

    Custom autograd functions with hand-written in-place backward passes cannot run
    their backward under such transforms (``jacrev`` vmaps it); layers switch to their autograd
    formulation there. Pure :func:`torch.func.vmap` is not counted (the functions have vmap rules).
    """
    if torch.compiler.is_compiling():
        return False
    stack = torch._C._functorch.get_interpreter_stack()
    vmap = torch._C._functorch.TransformType.Vmap
    return bool(stack) and any(level.key() != vmap for level in stack)


NON_FINITE_MESSAGE = "expected no NaN/Inf values in the"
"""Text of the compiled-mode error of :func:`check_finite` (matched by the Trainer)."""


def check_finite(
    x: Tensor, who: str, what: str = "input", *, hint: str | None = "pass check_finite=False to skip this check"
) -> None:
    """Raise if ``x`` holds NaN or infinite values, naming how many and where the first one is.

    Under ``torch.compile`` the check stays in the graph as an asynchronous assertion (no graph
    break): it raises a ``RuntimeError`` carrying :data:`NON_FINITE_MESSAGE`, without the count and
    location, which eager mode gives (:class:`~flows.train.Trainer` re-runs such a step eagerly to
    raise the full ``ValueError``).

    Under :func:`torch.func.vmap` (:func:`under_vmap`) the check is skipped: a batched tensor cannot
    be branched on, and a NaN/Inf row then gives a NaN/Inf result for that row instead of an error.
    """
    if torch.compiler.is_compiling():  # first: dynamo cannot trace the functorch queries of under_vmap
        torch._assert_async(torch.isfinite(x).all(), f"{who}: {NON_FINITE_MESSAGE} {what} (under torch.compile)")
        return
    if under_vmap(x):
        return
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        raise ValueError(
            f"{who}: expected a finite {what}, got {bad.shape[0]} NaN/Inf value(s), "
            f"the first at index {tuple(bad[0].tolist())}" + (f"; {hint}" if hint else "")
        )


def check_real(x: Tensor, who: str, what: str = "input") -> None:
    """Raise unless ``x`` is a real floating-point tensor (integer, bool and complex inputs are refused).

    Integer inputs would be silently truncated by in-place updates and complex ones would give
    complex "energies" or drop the imaginary part: both are clear errors instead.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected {what} to be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{who}: expected a real floating-point {what}, got dtype {x.dtype}")


def check_like(x: Tensor, reference: Any, who: str, what: str = "input") -> None:
    """Raise if ``x`` does not have the dtype and device of ``reference``.

    ``reference`` is anything with ``dtype`` and ``device`` (a tensor, or a :class:`~flows.Flow`),
    or ``None`` to check nothing.
    """
    if reference is None:
        return
    if not x.is_floating_point():
        raise TypeError(f"{who}: expected a floating-point {what}, got dtype {x.dtype}")
    if x.dtype != reference.dtype or x.device != reference.device:
        raise TypeError(
            f"{who}: expected {what} with dtype {reference.dtype} on {reference.device} "
            f"(the module's), got dtype {x.dtype} on {x.device}; "
            "move the data or the module with .to(...)"
        )


def check_context(context: Tensor | None, features: int, who: str) -> None:
    """Raise if a context is missing, unexpected or of the wrong width."""
    if features == 0:
        if context is not None:
            raise ValueError(f"{who}: this module is unconditional (context=0), got a context tensor")
        return
    if context is None:
        raise ValueError(f"{who}: expected a context of shape (*batch, {features}), got None")
    if not isinstance(context, Tensor):
        raise TypeError(f"{who}: expected context to be a torch.Tensor, got {type(context).__name__}")
    if context.dim() == 0 or context.shape[-1] != features:
        raise ValueError(f"{who}: expected a context of shape (*batch, {features}), got {tuple(context.shape)}")


def check_context_like(context: Tensor, x: Tensor, event_ndim: int, who: str, features: int | None = None) -> None:
    """Raise unless ``context`` fits the input ``x`` of shape ``(*batch, *event)``.

    The context must be a real floating-point tensor with the dtype and device of ``x`` (any
    floating dtype under ``torch.autocast``, where layers change the precision of their outputs),
    either a vector context ``(*c_batch, C)`` or, for image inputs ``(*batch, C_x, H, W)``, a map
    ``(*c_batch, C, H, W)`` with the input's ``H, W`` (as the convolutional conditioners take it),
    and ``c_batch`` must broadcast to ``batch`` (``Tensor.expand`` semantics: equal sizes or 1, no
    more dimensions than ``batch``) so that every input row is paired with the context row meant
    for it.

    Args:
        context: the context tensor.
        x: the input the context goes with.
        event_ndim: number of event dimensions of ``x``.
        who: name of the object doing the check, used in the message.
        features: the expected width ``C``; ``None`` (a module that only passes the context on,
            such as a chain) checks the dtype and device only, the conditional layers inside check
            the rest.
    """
    if not isinstance(context, Tensor):
        raise TypeError(f"{who}: expected context to be a torch.Tensor, got {type(context).__name__}")
    if not context.is_floating_point():
        raise TypeError(f"{who}: expected a real floating-point context, got dtype {context.dtype}")
    if context.device != x.device or (
        # under autocast, layer outputs change precision while the context keeps its own
        context.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type)
    ):
        raise TypeError(
            f"{who}: expected a context with the input's dtype {x.dtype} on {x.device}, "
            f"got dtype {context.dtype} on {context.device}"
        )
    image = event_ndim >= 3
    is_map = image and context.dim() == x.dim() and context.shape[-2:] == x.shape[-2:]
    context_ndim = 3 if is_map else 1
    if features is None:  # the layout is unknown here (a chain passing the context on): its users check it
        return
    if context.dim() == 0 or context.shape[-context_ndim] != features:
        maps = f" or (*batch, {features}, {x.shape[-2]}, {x.shape[-1]})" if image else ""
        raise ValueError(f"{who}: expected a context of shape (*batch, {features}){maps}, got {tuple(context.shape)}")
    batch = x.shape[: x.dim() - event_ndim]
    c_batch = context.shape[: max(context.dim() - context_ndim, 0)]
    if c_batch == batch and context.dim():
        return
    if (
        context.dim() == 0
        or len(c_batch) > len(batch)
        or any(c != 1 and c != b for c, b in zip(reversed(c_batch), reversed(batch), strict=False))
    ):
        raise ValueError(
            f"{who}: expected a context of shape (*batch, C) with batch shape {tuple(batch)} (or one that "
            f"broadcasts to it) for an input of shape {tuple(x.shape)}, got {tuple(context.shape)}"
        )


def as_sample_shape(sample_shape: Sequence[int] | int) -> torch.Size:
    """``sample_shape`` (an int or a sequence of ints) as a ``torch.Size``, refusing negative or non-integer sizes.

    Raises:
        TypeError: for sizes that are not integers.
        ValueError: for negative sizes.
    """
    try:
        if isinstance(sample_shape, Sequence):
            shape = tuple(operator.index(n) for n in sample_shape)
        else:
            shape = (operator.index(sample_shape),)
    except TypeError:
        raise TypeError(f"sample: expected a sample shape of integers, got {sample_shape!r}") from None
    if any(n < 0 for n in shape):
        raise ValueError(f"sample: expected a non-negative sample shape (integers >= 0), got {sample_shape!r}")
    return torch.Size(shape)


def check_samples(
    x: object,
    who: str,
    what: str = "samples",
    *,
    layout: str | None = None,
    ndim: int | None = None,
    min_ndim: int = 0,
    nan: str = "propagate",
    inf: str = "allow",
    empty_batch: bool = False,
    event_ndim: int = 1,
) -> Tensor:
    """The shared input check of the metric and particle functions; returns ``x`` as a real floating tensor.

    One rule for every public function of :mod:`flows.metrics` and :mod:`flows.particles`:

    * a ``torch.Tensor`` (else ``TypeError``), real (complex is a ``TypeError``);
    * bool and integer tensors are promoted to float64 (exact for integers below :math:`2^{53}`),
      floating ones kept as they are: no caller ever sees its weights or values cast to an integer;
    * of rank ``ndim`` (or at least ``min_ndim``), named by ``layout`` in the message (``ValueError``);
    * non-empty along every dimension (``ValueError``): a statistic of no draws, chains or
      coordinates has no value (``empty_batch=True`` lets the batch dimensions, all but the
      last ``event_ndim``, be 0, for functions that map rows to rows);
    * NaN: ``"propagate"`` (returned as it is; the caller documents that NaN in gives NaN out) or
      ``"refuse"`` (``ValueError`` with the count and the first index); infinite values likewise
      with ``inf="allow"`` / ``"refuse"``.

    Args:
        x: the input.
        who: the function's name, used in messages.
        what: the argument's name, used in messages.
        layout: the expected layout for messages, e.g. ``"(draws, chains, *event)"``.
        ndim: the exact rank required (``None``: any rank of at least ``min_ndim``).
        min_ndim: the smallest rank accepted.
        nan: ``"propagate"`` or ``"refuse"``.
        inf: ``"allow"`` or ``"refuse"``.
        empty_batch: accept zero-sized batch dimensions (all but the last ``event_ndim``), not
            zero-sized event dimensions.
        event_ndim: how many trailing dimensions are the event (with ``empty_batch``).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected {what} to be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{who}: expected real {what}, got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float64)
    shape_text = layout or (f"a tensor of rank {ndim}" if ndim is not None else f"rank >= {min_ndim}")
    if (ndim is not None and x.dim() != ndim) or x.dim() < min_ndim:
        raise ValueError(f"{who}: expected {what} of shape {shape_text}, got {tuple(x.shape)}")
    event = x.shape[max(x.dim() - event_ndim, 0) :]
    if x.numel() == 0 and not (empty_batch and x.dim() > event_ndim and 0 not in event):
        raise ValueError(
            f"{who}: expected non-empty {what} of shape {shape_text} (at least one entry along every "
            f"dimension), got {tuple(x.shape)}"
        )
    checks = ((nan == "refuse", torch.isnan, "NaN"), (inf == "refuse", torch.isinf, "infinite"))
    for refuse, test, label in checks:
        if refuse:
            bad = test(x)
            if bool(bad.any()):
                where = bad.nonzero()
                raise ValueError(
                    f"{who}: expected {what} without {label} values, got {where.shape[0]}, "
                    f"the first at index {tuple(where[0].tolist())}"
                )
    return x


SEED_MAX = 2**63 - 1
"""The largest seed ``torch.manual_seed`` takes (a signed 64-bit integer)."""


def check_count(
    who: str, name: str, value: object, *, minimum: int | None = 1, maximum: int | None = None, why: str = ""
) -> int:
    """``value`` as an ``int`` (not a bool) in ``[minimum, maximum]``: a count, a size, a seed.

    The one integer check of the library (builders, layers, objectives, metrics, samplers).
    ``maximum`` bounds sizes that allocate (bins, projections) before anything is allocated;
    ``minimum=None`` accepts any integer (a seed); ``why`` says why the bound is what it is.

    Raises:
        TypeError: for a non-integer (a float, a string, a bool), naming ``who``, ``name``, the
            bound and the value that came.
        ValueError: for an integer out of range.

    Example:
        >>> check_count("MAF", "transforms", 0)
        Traceback (most recent call last):
        ...
        ValueError: MAF: expected transforms to be an int >= 1, got 0
    """
    bounds = [] if minimum is None else [f">= {minimum}"]
    if maximum is not None:
        bounds = [f"in [{minimum}, {maximum}]"] if minimum is not None else [f"<= {maximum}"]
    wanted = " ".join(["an int", *bounds]) + (f" ({why})" if why else "")
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{who}: expected {name} to be {wanted}, got {value!r}") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ValueError(f"{who}: expected {name} to be {wanted}, got {number}")
    return number


# -- shared checks of numeric options and of objective inputs (appended for issue 27) ---------------


def check_number(
    who: str,
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a float: a real number (not a bool), finite, within ``[minimum, maximum]``.

    Args:
        who: the object named in the message.
        name: the argument named in the message.
        value: what came.
        minimum: the smallest value allowed (``None``: no bound).
        maximum: the largest value allowed (``None``: no bound).
        strict: the minimum itself is excluded (``value > minimum``).
        finite: refuse ``±inf`` (NaN is always refused).

    Raises:
        TypeError: for a value that is not a real number (a string, a bool, a tensor of several values).
        ValueError: for NaN, an infinity (when ``finite``) or a value out of range.

    Example:
        >>> check_number("CNF", "rtol", float("inf"), minimum=0, strict=True)
        Traceback (most recent call last):
        ...
        ValueError: CNF: expected rtol to be a finite number > 0, got inf
    """
    import numbers

    if isinstance(value, Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{who}: expected {name} to be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if strict else '>='} {minimum:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    wanted = ("a finite number" if finite else "a number") + (" " + " and ".join(bounds) if bounds else "")
    bad = number != number or (finite and number in (float("inf"), float("-inf")))
    if minimum is not None:
        bad = bad or number < minimum or (strict and number == minimum)
    if maximum is not None:
        bad = bad or number > maximum
    if bad:
        raise ValueError(f"{who}: expected {name} to be {wanted}, got {value!r}")
    return number


def check_rows(x: Tensor, event_ndim: int, who: str, what: str = "data") -> int:
    """The number of rows of a training batch ``(N, *event)``: exactly one batch dimension, ``N >= 1``.

    The objectives of :mod:`flows.train` average over the rows of a batch: a batch without a row
    has no mean (it would be a NaN loss), and an event without its batch dimension (``(D,)`` in
    place of ``(1, D)``) would be read as ``D`` rows.

    Raises:
        TypeError: for a non-tensor.
        ValueError: for another number of batch dimensions or an empty batch.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected {what} to be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != event_ndim + 1:
        raise ValueError(
            f"{who}: expected {what} of shape (N, *event) with {event_ndim} event dimension(s), "
            f"got shape {tuple(x.shape)}"
        )
    if x.shape[0] == 0:
        raise ValueError(f"{who}: expected a batch of at least one row, got {what} of shape {tuple(x.shape)}")
    return int(x.shape[0])


def check_flow_inputs(flow: object, x: Tensor, context: Tensor | None, who: str | None = None) -> None:
    """The input checks of :meth:`flows.Flow.log_prob`, for any code that feeds data to a flow.

    In order: the event shape, the dtype and device of the flow (a real floating-point tensor),
    finite values (with the flow's ``check_finite``; the message names the first bad index, so
    the row), and the context: present exactly when the flow declares one, of the declared width,
    floating-point with the flow's dtype, a batch that broadcasts to the data's, and finite. Then
    the outermost transform's own :meth:`~flows.bijections.Bijection.check_call` (what its fused
    call runs first). Training objectives (:class:`~flows.train.FlowMatching`,
    :class:`~flows.train.MaximumLikelihood`) call this so that they refuse exactly what
    maximum likelihood refuses.

    Args:
        flow: a :class:`~flows.Flow` (read through its ``transform``, ``dtype``, ``device``,
            ``context_features`` and ``check_finite``).
        x: the data ``(*batch, *event_shape)``.
        context: the context, or ``None``.
        who: the name in messages (default: the flow's class).
    """
    name = who or type(flow).__name__
    transform = flow.transform  # type: ignore[attr-defined]
    anchor = flow if hasattr(flow, "dtype") and hasattr(flow, "device") else None
    finite = bool(getattr(flow, "check_finite", True))
    check_event(x, transform.event_shape, name)
    check_like(x, anchor, name)
    if finite:
        check_finite(x, name)
    features = getattr(flow, "context_features", None)
    if features is not None:
        check_context(context, features, name)
    if context is not None:
        check_like(context, anchor, name, "context")
        if features:
            check_context_like(context, x, len(transform.event_shape), name, features)
        if finite:
            check_finite(context, name, "context")
    transform.check_call(x, context)


def takes_context(model: object) -> bool:
    """Whether any part of ``model`` (a module, its base distribution) declares a context width > 0."""
    from torch import nn

    modules = model.modules() if isinstance(model, nn.Module) else [model]
    return any(
        isinstance(getattr(m, "context_features", 0), int) and getattr(m, "context_features", 0) > 0 for m in modules
    )


def check_objective_batch(model: object, x: Tensor, context: Tensor | None, who: str) -> None:
    """What a training objective checks before the model sees a batch ``(x, context)``.

    One batch dimension and at least one row (:func:`check_rows`; when the model has an
    ``event_shape``), and no context for a model that takes none: a flow without a declared
    ``context`` width would otherwise pass a context on to layers that ignore it, training an
    unconditional model on data meant to be conditional. The rest (shape, dtype, finite values,
    the context's width and batch) is :meth:`flows.Flow.log_prob`'s (:func:`check_flow_inputs`).

    Raises:
        ValueError: for a batch without rows or without its batch dimension, or a context given to a
            model that takes none.
    """
    event = getattr(model, "event_shape", None)
    if event is not None:
        check_rows(x, len(event), who)
    elif isinstance(x, Tensor) and x.dim() and x.shape[0] == 0:
        raise ValueError(f"{who}: expected a batch of at least one row, got data of shape {tuple(x.shape)}")
    if context is not None and not takes_context(model):
        raise ValueError(
            f"{who}: expected no context for {type(model).__name__}, which takes none (no layer or base declares "
            f"a context width), got a context of shape {tuple(getattr(context, 'shape', ()))}"
        )


# -- the builders' shared arguments (docs/guide/concepts.md): checked before any layer is built -----


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_features(who: str, features: Any, *, minimum: int = 1, why: str = "") -> int:
    """The data dimension: an int ``>= minimum`` (``why`` says what needs more than 1)."""
    return check_count(who, "features", features, minimum=minimum, why=why)


def check_hidden(who: str, hidden: Any, *, minimum_layers: int = 0) -> tuple[int, ...]:
    """Hidden widths: a sequence of positive ints, at least ``minimum_layers`` of them, as a tuple.

    Args:
        who: the builder, named in messages.
        hidden: the value to check.
        minimum_layers: fewest hidden layers the builder's conditioner can take.

    Raises:
        TypeError: for an int, a string or any other non-sequence.
        ValueError: for a width that is not a positive int, or too few layers.

    Example:
        >>> check_hidden("RealNVP", [64, 64])
        (64, 64)
        >>> check_hidden("RealNVP", 64)
        Traceback (most recent call last):
        ...
        TypeError: RealNVP: expected hidden to be a sequence of layer widths such as (64, 64), got 64
    """
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise TypeError(f"{who}: expected hidden to be a sequence of layer widths such as (64, 64), got {hidden!r}")
    if not all(_is_int(h) and h >= 1 for h in hidden) or len(hidden) < minimum_layers:
        layers = (
            f" (at least {minimum_layers} hidden layer{'s' if minimum_layers > 1 else ''})" if minimum_layers else ""
        )
        raise ValueError(f"{who}: expected hidden to be positive int widths{layers}, got {tuple(hidden)!r}")
    return tuple(int(h) for h in hidden)


def check_activation(who: str, activation: Any) -> Callable[[], nn.Module]:
    """The nonlinearity: a zero-argument callable returning a module (a class such as ``nn.ReLU``).

    Raises:
        TypeError: for a module instance (``nn.ReLU()``), a class that is not a module, or a non-callable.
    """
    if isinstance(activation, nn.Module):
        raise TypeError(
            f"{who}: expected activation to be a module class or factory such as nn.ReLU, got the instance "
            f"{activation!r} (drop the parentheses)"
        )
    if not callable(activation) or (isinstance(activation, type) and not issubclass(activation, nn.Module)):
        raise TypeError(
            f"{who}: expected activation to be a module class or factory such as nn.ReLU, got {activation!r}"
        )
    return activation


def check_choice(who: str, name: str, value: Any, choices: Sequence[str]) -> str:
    """One of a few named options.

    Raises:
        ValueError: listing the choices.
    """
    if value not in choices:
        raise ValueError(f"{who}: expected {name} in {list(choices)}, got {value!r}")
    return value


def check_nonnegative(who: str, name: str, value: Any) -> float:
    """A finite number ``>= 0`` (a loss weight, a noise level), as a float.

    Raises:
        ValueError: for anything else.
    """
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < float("inf")):
        raise ValueError(f"{who}: expected {name} to be a finite number >= 0, got {value!r}")
    return float(value)


_NOT_TAKEN: Any = object()


def check_builder(
    who: str,
    features: Any,
    context: Any,
    *,
    transforms: Any = _NOT_TAKEN,
    hidden: Any = _NOT_TAKEN,
    activation: Any = _NOT_TAKEN,
    minimum_features: int = 1,
    why: str = "",
    minimum_layers: int = 0,
) -> None:
    """The shared arguments of a vector builder, checked in signature order (left out: not taken).

    Args:
        who: the builder, named in messages.
        features: data dimension.
        context: context width.
        transforms: number of layers.
        hidden: hidden widths of the conditioners.
        activation: nonlinearity factory.
        minimum_features: smallest data dimension the builder can model.
        why: why it needs that many (in the message).
        minimum_layers: fewest hidden layers the conditioners take.

    Raises:
        ValueError, TypeError: from the checks above, for the first bad argument.

    Example:
        >>> check_builder("RealNVP", 1, 0, transforms=4, minimum_features=2, why="couplings need two parts")
        Traceback (most recent call last):
        ...
        ValueError: RealNVP: expected features to be an int >= 2 (couplings need two parts), got 1
    """
    check_features(who, features, minimum=minimum_features, why=why)
    check_count(who, "context", context, minimum=0)
    if transforms is not _NOT_TAKEN:
        check_count(who, "transforms", transforms)
    if hidden is not _NOT_TAKEN:
        check_hidden(who, hidden, minimum_layers=minimum_layers)
    if activation is not _NOT_TAKEN:
        check_activation(who, activation)
