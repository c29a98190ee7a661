"""The augmented ODE of a continuous normalizing flow, its error norm and its first step, for torchdiffeq."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = [
    "ADAPTIVE_ORDER",
    "DEFAULT_STEPS",
    "MAX_EVALUATIONS",
    "Dynamics",
    "EvaluationLimitExceeded",
    "check_interval",
    "error_norm",
    "initial_step",
    "solver_options",
]

MAX_EVALUATIONS = 10_000
"""Default bound on the field evaluations of one solve (``CNF(max_evaluations=...)``).

A well-posed solve on a unit interval takes tens to a few hundred evaluations (dopri5: six a
step); ten thousand is far above any the library's tests and benchmarks reach, and bounds the
work of a stiff field or an absurd interval (``t1=1e30``) to seconds instead of hours."""

DEFAULT_STEPS = 100
"""Steps over ``[t0, t1]`` of a fixed-step solver given no ``step_size``: ``|t1 - t0| / 100``."""


class EvaluationLimitExceeded(FloatingPointError):
    """A solve needed more field evaluations than ``CNF(max_evaluations=...)`` allows."""


class Dynamics(nn.Module):
    r"""The augmented right-hand side handed to torchdiffeq: ``[z, ℓ, r] ↦ [f, tr J, regularisers]``.

    The state is one tensor ``(N, D + 1 + R)``: the flattened event ``z``, the log-determinant
    ``ℓ`` and the ``R`` RNODE integrands (kinetic energy ``‖f‖²`` and/or ``‖J‖_F²``, integrated
    with a positive sign whatever the direction of time). It is built per solve and holds that
    solve's context and Hutchinson probes, so nothing outlives the call.
    """

    def __init__(
        self,
        field: nn.Module,
        event_shape: tuple[int, ...],
        context: Tensor | None,
        probe: Tensor | None,
        trace: bool,
        kinetic: bool,
        frobenius: bool,
        sign: float,
    ) -> None:
        super().__init__()
        self.field = field
        self.event_shape = event_shape
        self.context = context
        self.probe = probe
        self.trace, self.kinetic, self.frobenius, self.sign = trace, kinetic, frobenius, sign
        self.fused = callable(getattr(field, "jvp", None))
        self.divergence = callable(getattr(field, "divergence", None))
        self.features = math.prod(event_shape)
        self.calls = 0
        self.on_call: Callable[[], None] | None = None
        self.limit: int | None = None
        self.interval = ""

    def _field(self, t: Tensor, z: Tensor) -> Tensor:
        return self.field(t, z) if self.context is None else self.field(t, z, self.context)

    def _tangents(self, z: Tensor) -> Tensor:
        """``(K, M, *event)``: the Hutchinson probes (K = 1) or the basis vectors (K = D, M = 1)."""
        if self.probe is not None:
            return self.probe[None]
        basis = torch.eye(self.features, dtype=z.dtype, device=z.device)
        return basis.reshape(self.features, 1, *self.event_shape)

    def _fused(self, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The field and ``J v`` (``(K, N, *event)``) through the field's own ``jvp``."""
        tangents = self._tangents(z)
        if self.context is None:
            return self.field.jvp(t, z, tangents)
        return self.field.jvp(t, z, tangents, self.context)

    def _autograd(self, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """The field and ``vᵀ J`` (``(K, N, *event)``) by reverse-mode autograd (any field)."""
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            if not (create_graph and z.requires_grad):  # a fresh leaf unless z's history is needed
                z = z.detach().requires_grad_(True)
            f = self._field(t, z)
            tangents = self._tangents(z)
            k = 1 if self.probe is not None else self.features
            if not f.requires_grad:  # a field that depends on nothing with a gradient: J = 0
                return f, z.new_zeros(k, *z.shape)
            # allow_unused: a field that does not depend on z (f(t, z) = c(t)) has J = 0, not an error
            if self.probe is not None:
                rows = torch.autograd.grad(f, z, tangents[0], create_graph=create_graph, allow_unused=True)[0]
                rows = None if rows is None else rows[None]
            else:
                grads = tangents.expand(self.features, *z.shape)
                rows = torch.autograd.grad(
                    f, z, grads, create_graph=create_graph, is_grads_batched=True, allow_unused=True
                )[0]
        if rows is None:
            rows = z.new_zeros(k, *z.shape)
        return f, rows

    def forward(self, t: Tensor, state: Tensor) -> Tensor:
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        elif self.limit is not None and self.calls > self.limit:
            raise EvaluationLimitExceeded(
                f"CNF: the ODE solve over {self.interval} needed more than max_evaluations={self.limit} field "
                f"evaluations (at t = {float(t):.6g}); expected a solve within the limit: check the interval "
                "[t0, t1] and the field's stiffness, loosen rtol/atol, or raise max_evaluations"
            )
        n = state.shape[0]
        z = state[:, : self.features].reshape(n, *self.event_shape)
        products = divergence = None
        if self.trace and self.divergence and self.probe is None and not self.frobenius:
            f, divergence = (
                self.field.divergence(t, z) if self.context is None else self.field.divergence(t, z, self.context)
            )
        elif self.trace or self.frobenius:
            f, products = self._fused(t, z) if self.fused else self._autograd(t, z)
            products = products.reshape(products.shape[0], n, -1)
        else:
            f = self._field(t, z)
        f = f.reshape(n, -1)
        columns = [f]
        if divergence is not None:
            columns.append(divergence.reshape(n, 1))
        elif self.trace:
            if self.probe is not None:
                columns.append((products[0] * self.probe.reshape(n, -1)).sum(-1, keepdim=True))
            else:
                columns.append(products.diagonal(dim1=0, dim2=2).sum(-1, keepdim=True))
        else:
            columns.append(torch.zeros_like(f[:, :1]))
        if self.kinetic:
            columns.append(self.sign * f.square().sum(-1, keepdim=True))
        if self.frobenius:
            columns.append(self.sign * products.square().sum((0, 2))[:, None])
        return torch.cat(columns, -1)


def error_norm(features: int):
    """Error norm of the solver: the larger RMS of the state block and of the log-determinant column.

    The RNODE columns are left out: they are penalties, their accuracy does not matter.
    """

    def norm(error: Tensor) -> Tensor:
        if error.dim() != 2:  # the adjoint pass hands over flattened (time or parameter) tensors
            return error.abs().pow(2).mean().sqrt()
        return torch.maximum(
            error[:, :features].square().mean().sqrt(), error[:, features : features + 1].square().mean().sqrt()
        )

    return norm


ADAPTIVE_ORDER = {"dopri5": 5, "dopri8": 8, "bosh3": 3, "fehlberg2": 2, "adaptive_heun": 2}


@torch.no_grad()
def initial_step(
    func: nn.Module, times: Tensor, y0: Tensor, order: int, rtol: float, atol: float, norm: Callable
) -> Tensor:
    """Hairer, Nørsett, Wanner (1993, §II.4)'s starting step, computed without a graph.

    torchdiffeq's own choice is differentiable, which would make every later time point (and so
    the output of one sample) depend on the whole batch through autograd; choosing it here keeps
    the gradient that of the discretised map with a fixed step sequence. Costs two evaluations.
    """
    t0, direction = times[0], torch.sign(times[1] - times[0])
    f0 = func(t0, y0)
    scale = atol + y0.abs() * rtol
    d0, d1 = norm(y0 / scale), norm(f0 / scale)
    h0 = torch.full_like(d0, 1e-6) if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    f1 = func(t0 + direction * h0, y0 + direction * h0 * f0)
    d2 = norm((f1 - f0) / scale) / h0
    if max(d1, d2) <= 1e-15:
        h1 = torch.clamp(h0 * 1e-3, min=1e-6)
    else:
        h1 = (0.01 / torch.maximum(d1, d2)) ** (1.0 / order)
    return torch.minimum(100 * h0, h1).to(times.dtype)


def check_interval(t0: float, t1: float, dtype: torch.dtype = torch.float32) -> None:
    """Raise unless ``t0`` and ``t1`` are distinct and finite in ``dtype``, with a finite span.

    Checked in float32 at construction (the default dtype: ``t1 = 1 + 1e-9`` equals ``t0 = 1``
    there, and ``t1 = 1e-300`` rounds to 0) and in the input's dtype at every solve.

    Raises:
        ValueError: naming both times and the dtype.
    """
    pair = torch.tensor((t0, t1), dtype=torch.float64).to(dtype)
    a, b = float(pair[0]), float(pair[1])
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(b - a)) or a == b:
        raise ValueError(
            f"CNF: expected t0 and t1 distinct and finite in {dtype} (with a finite t1 - t0), got t0={t0!r}, "
            f"t1={t1!r} (in {dtype}: {a!r}, {b!r})"
        )


def solver_options(method: str, options: dict | None, t0: float, t1: float) -> dict:
    """The solver options, checked, with the default step of a fixed-step solver filled in.

    A fixed-step method (``euler``, ``rk4``, ...) without ``step_size`` (or ``grid_constructor``)
    gets ``step_size = |t1 - t0| / DEFAULT_STEPS``: torchdiffeq's own default is one step over the
    whole interval, which is silently far from the solution.

    Raises:
        ValueError: for a ``step_size`` or ``first_step`` that is not a finite number > 0.
    """
    from flows._validation import check_number

    options = dict(options or {})
    for name in ("step_size", "first_step"):
        if name in options and options[name] is not None:
            options[name] = check_number("CNF", f"options[{name!r}]", options[name], minimum=0, strict=True)
    if method not in ADAPTIVE_ORDER and options.get("step_size") is None and "grid_constructor" not in options:
        options["step_size"] = abs(t1 - t0) / DEFAULT_STEPS
    return options
