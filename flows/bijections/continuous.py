r"""Continuous normalizing flows: :class:`CNF`, an ODE solved with torchdiffeq, with exact or Hutchinson traces."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._functorch import with_vmap_folded
from flows._validation import check_context, check_count, check_event, check_number, format_shape
from flows.bijections._cnf_dynamics import (
    ADAPTIVE_ORDER,
    MAX_EVALUATIONS,
    Dynamics,
    EvaluationLimitExceeded,
    check_interval,
    error_norm,
    initial_step,
    solver_options,
)
from flows.bijections.auxiliary import add_auxiliary_loss, collecting_auxiliary_losses
from flows.bijections.base import Bijection
from flows.nn import TimeMLP

__all__ = ["CNF", "MAX_EVALUATIONS", "SOLVERS", "TRACES", "total_nfe"]

TRACES = ("exact", "hutchinson")
PROBES = ("rademacher", "gaussian")
SOLVERS = (
    *("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun"),  # adaptive: rtol, atol
    *("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams", "fixed_adams"),  # step_size
)


class CNF(Bijection):
    r"""Continuous normalizing flow: the solution map of :math:`\dot z = f(t, z; c)` from ``t0`` to ``t1``.

    Forward (data → latent) integrates the augmented system from :math:`z(t_0) = x` to ``t1``:

    .. math::
        \frac{d}{dt}\begin{bmatrix} z \\ \ell \end{bmatrix}
        = \begin{bmatrix} f(t, z; c) \\ \operatorname{tr} \frac{\partial f}{\partial z} \end{bmatrix},
        \qquad \ell(t_1) = \log\left|\det \frac{\partial z(t_1)}{\partial x}\right|
        = \int_{t_0}^{t_1} \operatorname{tr} \frac{\partial f}{\partial z(t)}\, dt

    (the instantaneous change of variables). The inverse integrates the same system backwards,
    from ``t1`` to ``t0``, and returns :math:`-\ell`. ``ladj`` is therefore the integrated trace,
    exact up to the solver tolerance with ``trace="exact"`` (``D`` Jacobian-vector products per
    evaluation) or an unbiased Hutchinson estimate with ``trace="hutchinson"``:
    :math:`\operatorname{tr} J = \mathbb E[\varepsilon^\top J \varepsilon]`, one product per
    evaluation, with :math:`\varepsilon` (Rademacher or Gaussian, ``E[εεᵀ] = I``) drawn **once per
    solve** so the integrand stays smooth in :math:`t`.

    The field is any ``nn.Module`` called as ``field(t, z)`` (``field(t, z, context)`` when
    ``context > 0``) with ``t`` a scalar tensor and ``z`` of shape ``(N, *event_shape)``; by
    default a :class:`~flows.nn.TimeMLP`. If the field has a method
    ``jvp(t, z, tangents[, context]) -> (f, J v)`` (tangents ``(K, N or 1, *event)``), it is used
    to compute the traces in forward mode; otherwise they come from reverse-mode autograd. A
    field with ``divergence(t, z[, context]) -> (f, tr J)`` (``(N, *event)`` and ``(N,)``) gives
    the exact trace directly, e.g. by exploiting its own sparsity
    (:meth:`flows.particles.EGNN.divergence`); it is used for the exact trace when no Jacobian
    Frobenius norm is asked for.

    RNODE regularisers (Finlay et al. 2020) are integrated as extra state when their weight is
    positive *and* an :class:`~flows.bijections.auxiliary.AuxiliaryLosses` collector is open: the kinetic
    energy :math:`\int \|f\|^2 dt` and the Jacobian Frobenius norm :math:`\int \|J\|_F^2 dt`
    (exact with the exact trace, :math:`\|J\varepsilon\|^2` with Hutchinson), per sample, averaged
    over the batch and multiplied by their weights, are handed over as ``"rnode_kinetic"`` and
    ``"rnode_jacobian"``.

    :meth:`forward` and :meth:`inverse` (the tensor-only calls, e.g. sampling) integrate ``z``
    alone, without the trace: they agree with the fused methods to the solver tolerance.
    The number of evaluations of the field in the last solve is :attr:`nfe` (and, with the
    adjoint, :attr:`nfe_backward` for the backward pass that followed).

    References:
        Chen, Rubanova, Bettencourt, Duvenaud (2018), "Neural Ordinary Differential Equations",
        NeurIPS, arXiv:1806.07366.
        Grathwohl, Chen, Bettencourt, Sutskever, Duvenaud (2019), "FFJORD: Free-form Continuous
        Dynamics for Scalable Reversible Generative Models", ICLR, arXiv:1810.01367.
        Finlay, Jacobsen, Nurbekyan, Oberman (2020), "How to train your neural ODE: the world of
        Jacobian and kinetic regularization", ICML, arXiv:2002.02798.
        Kidger, Chen, Lyons (2021), "'Hey, that's not an ODE': Faster ODE Adjoints via Seminorms",
        ICML, arXiv:2009.09457 (the adjoint's default error norm).

    Args:
        features: event size ``D`` (or an event shape, with a ``field`` that accepts it).
        context: context width (0 for an unconditional transform).
        field: the vector field; default ``TimeMLP(features, context, hidden=..., activation=..., freqs=...)``.
        hidden: hidden widths of the default field.
        activation: nonlinearity of the default field (smooth; see :class:`~flows.nn.TimeMLP`).
        freqs: time frequencies of the default field (0: ``t`` itself).
        trace: ``"exact"`` or ``"hutchinson"``.
        eval_trace: the trace used in eval mode (``None``: the same as ``trace``), e.g. train with
            ``"hutchinson"`` and evaluate exact log-likelihoods.
        probe: the law of the Hutchinson probe vectors, ``"rademacher"`` (lower variance) or ``"gaussian"``.
        seed: if given, every solve draws its Hutchinson probes from a generator seeded with it,
            so the estimate is a deterministic function of the input (otherwise: the global RNG).
        t0: start time (the data side).
        t1: end time (the latent side).
        method: torchdiffeq solver (one of :data:`SOLVERS`).
        rtol: relative tolerance of adaptive solvers (raised to ``10·eps`` of the dtype if below).
        atol: absolute tolerance of adaptive solvers (likewise).
        options: extra solver options (e.g. ``{"step_size": 0.1}`` for fixed-step solvers).
        adjoint: backpropagate with the adjoint method (``odeint_adjoint``: memory independent
            of the number of steps, gradients carry the error of the backward solve) instead of
            through the solver's operations.
        adjoint_options: options of the backward solve (default: Kidger et al.'s seminorm).
        kinetic: weight of the RNODE kinetic-energy regulariser (a finite number >= 0).
        jacobian: weight of the RNODE Jacobian-Frobenius regulariser (a finite number >= 0).
        max_evaluations: the most field evaluations one solve may take (the forward solve, and
            separately the adjoint's backward solve); beyond it the solve stops with
            :class:`~flows.bijections._cnf_dynamics.EvaluationLimitExceeded` (a
            ``FloatingPointError``) naming the limit and the interval. Default
            :data:`MAX_EVALUATIONS` (10 000).

    Fixed-step solvers (``"euler"``, ``"rk4"``, ...) without ``options={"step_size": h}`` take
    ``h = |t1 - t0| / 100`` (:data:`~flows.bijections._cnf_dynamics.DEFAULT_STEPS`), not
    torchdiffeq's one step over the whole interval. A field that does not depend on ``z``
    (``f(t, z) = c(t)``) has a zero divergence, which both traces return.

    Raises:
        ValueError: for invalid sizes, names, tolerances (``rtol`` in ``(0, 1]``, ``atol > 0``,
            finite), weights, step sizes, an interval whose ends are equal or not finite in float32
            (or, when called, in the input's dtype), and, when called, inputs or contexts of the
            wrong shape.
        TypeError: if ``field`` is not an ``nn.Module``, for numbers that are not numbers, a
            non-bool ``adjoint``, ``options`` that are not a dict.
        FloatingPointError: when called, if the solve fails (non-finite field or input, step-size
            underflow).

    Example:
        >>> import torch
        >>> cnf = CNF(2, hidden=(16,), rtol=1e-6, atol=1e-6)
        >>> x = torch.randn(5, 2)
        >>> z, ladj = cnf.forward_and_log_det(x)
        >>> z.shape, ladj.shape, cnf.nfe > 0
        (torch.Size([5, 2]), torch.Size([5]), True)
        >>> x_back, ladj_back = cnf.inverse_and_log_det(z)
        >>> torch.allclose(x_back, x, atol=1e-4), torch.allclose(ladj_back, -ladj, atol=1e-4)
        (True, True)
    """

    def __init__(
        self,
        features: int | Sequence[int],
        context: int = 0,
        *,
        field: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.Tanh,
        freqs: int = 1,
        trace: str = "exact",
        eval_trace: str | None = None,
        probe: str = "rademacher",
        seed: int | None = None,
        t0: float = 0.0,
        t1: float = 1.0,
        method: str = "dopri5",
        rtol: float = 1e-5,
        atol: float = 1e-5,
        options: dict | None = None,
        adjoint: bool = False,
        adjoint_options: dict | None = None,
        kinetic: float = 0.0,
        jacobian: float = 0.0,
        max_evaluations: int = MAX_EVALUATIONS,
    ) -> None:
        super().__init__(features)
        check_count("CNF", "context", context, minimum=0)
        for name, value in (("trace", trace), ("eval_trace", eval_trace)):
            if value is not None and not (isinstance(value, str) and value in TRACES):
                raise ValueError(f"CNF: expected {name} in {TRACES}, got {value!r}")
        if not (isinstance(probe, str) and probe in PROBES):
            raise ValueError(f"CNF: expected probe in {PROBES}, got {probe!r}")
        if not (isinstance(method, str) and method in SOLVERS):
            raise ValueError(f"CNF: expected method in {SOLVERS}, got {method!r}")
        if seed is not None:
            seed = check_count("CNF", "seed", seed, minimum=None)
        rtol = check_number("CNF", "rtol", rtol, minimum=0, strict=True, maximum=1)
        atol = check_number("CNF", "atol", atol, minimum=0, strict=True)
        t0, t1 = check_number("CNF", "t0", t0), check_number("CNF", "t1", t1)
        check_interval(t0, t1)
        kinetic = check_number("CNF", "kinetic", kinetic, minimum=0)
        jacobian = check_number("CNF", "jacobian", jacobian, minimum=0)
        for name, value in (("adjoint", adjoint),):
            if not isinstance(value, bool):
                raise TypeError(f"CNF: expected {name} to be a bool, got {type(value).__name__} {value!r}")
        for name, value in (("options", options), ("adjoint_options", adjoint_options)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"CNF: expected {name} to be a dict or None, got {type(value).__name__} {value!r}")
        options = solver_options(method, options, t0, t1)
        max_evaluations = check_count("CNF", "max_evaluations", max_evaluations)
        if field is None:
            if len(self.event_shape) != 1:
                raise ValueError(
                    f"CNF: the default field needs vector events, got event shape {format_shape(self.event_shape)}; "
                    "pass field=..."
                )
            field = TimeMLP(self.event_shape[0], context, hidden=hidden, activation=activation, freqs=freqs)
        elif not isinstance(field, nn.Module):
            raise TypeError(f"CNF: expected field to be an nn.Module, got {type(field).__name__}")
        if any(s is None for s in self.event_shape):
            raise ValueError(f"CNF: expected a fixed event shape, got {format_shape(self.event_shape)}")
        self.field = field
        self.context_features = context
        self.trace, self.eval_trace, self.probe, self.seed = trace, eval_trace, probe, seed
        self.t0, self.t1 = t0, t1
        self.method, self.rtol, self.atol = method, rtol, atol
        self.options = options
        self.max_evaluations = max_evaluations
        self.adjoint = adjoint
        self.adjoint_options = {"norm": "seminorm"} if adjoint_options is None else dict(adjoint_options)
        self.kinetic, self.jacobian = float(kinetic), float(jacobian)
        self.nfe = 0
        self.nfe_backward = 0

    # -- solving ------------------------------------------------------------------------------
    def _probe(self, shape: torch.Size, like: Tensor) -> Tensor:
        generator = None
        if self.seed is not None:
            generator = torch.Generator(device=like.device).manual_seed(self.seed)
        if self.probe == "gaussian":
            return torch.randn(shape, generator=generator, dtype=like.dtype, device=like.device)
        bits = torch.randint(0, 2, shape, generator=generator, device=like.device)
        return bits.to(like.dtype).mul_(2).sub_(1)

    def _solve(self, x: Tensor, context: Tensor | None, reverse: bool, log_det: bool) -> tuple[Tensor, Tensor]:
        # under torch.func.vmap the adaptive solve (one step sequence for the batch) runs on the
        # unwrapped batch with the mapped dimension in front: vmap cannot branch on step errors
        return with_vmap_folded(lambda x, c: self._solve_batch(x, c, reverse, log_det), x, context)

    def _solve_batch(self, x: Tensor, context: Tensor | None, reverse: bool, log_det: bool) -> tuple[Tensor, Tensor]:
        who = type(self).__name__
        event = self.event_shape_out if reverse else self.event_shape
        check_event(x, event, who, "latent input" if reverse else "input")
        check_context(context, self.context_features, who)
        batch = x.shape[: x.dim() - len(event)]
        n, features = math.prod(batch), math.prod(event)
        if n == 0:
            return x, x.new_zeros(batch)
        if context is not None:
            context = context.expand(*batch, self.context_features).reshape(n, self.context_features)
        trace = self.trace if self.training or self.eval_trace is None else self.eval_trace
        regularise = collecting_auxiliary_losses()
        kinetic, frobenius = regularise and self.kinetic > 0, regularise and self.jacobian > 0
        probe = None
        if (log_det or frobenius) and trace == "hutchinson":
            probe = self._probe(torch.Size((n, *event)), x)
        # RNODE integrands get the sign that makes their integrals positive in either direction.
        sign = math.copysign(1.0, self.t1 - self.t0) * (-1.0 if reverse else 1.0)
        dynamics = Dynamics(self.field, event, context, probe, log_det, kinetic, frobenius, sign)
        if x.dtype != torch.float32:
            check_interval(self.t0, self.t1, x.dtype)
        dynamics.limit, dynamics.interval = self.max_evaluations, f"[{self.t0:g}, {self.t1:g}]"
        state = torch.cat((x.reshape(n, features), x.new_zeros(n, 1 + kinetic + frobenius)), -1)
        start, end = (self.t1, self.t0) if reverse else (self.t0, self.t1)
        times = torch.tensor((start, end), dtype=x.dtype, device=x.device)
        # Below ~10 eps the error estimate is rounding noise and the step size collapses (scipy's
        # solve_ivp clips rtol at 100 eps for the same reason).
        floor = 10 * torch.finfo(x.dtype).eps
        rtol, atol = max(self.rtol, floor), max(self.atol, floor)
        norm = error_norm(features)
        options = {"norm": norm, **self.options}
        self.nfe_backward = 0
        try:
            if self.method in ADAPTIVE_ORDER and "first_step" not in options:
                order = ADAPTIVE_ORDER[self.method]
                options["first_step"] = initial_step(dynamics, times, state, order, rtol, atol, norm)
            solve = dict(rtol=rtol, atol=atol, method=self.method, options=options)
            if self.adjoint:
                params = tuple(p for p in self.field.parameters() if p.requires_grad)
                if context is not None and context.requires_grad:
                    params = (*params, context)
                from torchdiffeq import odeint_adjoint  # imported on first use: keeps `import flows` fast

                out = odeint_adjoint(
                    dynamics, state, times, adjoint_params=params, adjoint_options=self.adjoint_options, **solve
                )
                dynamics.on_call = self._count_backward  # every later call belongs to the backward pass
            else:
                from torchdiffeq import odeint  # imported on first use: keeps `import flows` fast

                out = odeint(dynamics, state, times, **solve)
        except AssertionError as error:  # torchdiffeq's checks: non-finite state, step underflow, step limit
            raise FloatingPointError(
                f"{who}: the ODE solve failed after {dynamics.calls} evaluations ({error}); expected a finite, "
                "non-stiff field: check the inputs, lower the learning rate or loosen the tolerances"
            ) from error
        self.nfe = dynamics.calls
        out = out[-1]
        z = out[:, :features].reshape(*batch, *event)
        ladj = out[:, features].reshape(batch)
        if kinetic:
            add_auxiliary_loss("rnode_kinetic", self.kinetic * out[:, features + 1].mean())
        if frobenius:
            add_auxiliary_loss("rnode_jacobian", self.jacobian * out[:, -1].mean())
        return z, ladj

    def _count_backward(self) -> None:
        self.nfe_backward += 1
        if self.nfe_backward > self.max_evaluations:
            raise EvaluationLimitExceeded(
                f"CNF: the adjoint's backward solve over [{self.t0:g}, {self.t1:g}] needed more than "
                f"max_evaluations={self.max_evaluations} field evaluations; expected a solve within the limit: "
                "loosen adjoint_options' tolerances or raise max_evaluations"
            )

    # -- the contract -------------------------------------------------------------------------
    def forward_and_log_det(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._solve(x, context, reverse=False, log_det=True)

    def inverse_and_log_det(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._solve(z, context, reverse=True, log_det=True)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Map data to latent without the trace (the state alone is integrated)."""
        return self._solve(x, context, reverse=False, log_det=False)[0]

    def inverse(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """Map latent to data without the trace (the state alone is integrated)."""
        return self._solve(z, context, reverse=True, log_det=False)[0]

    def extra_repr(self) -> str:
        trace = self.trace if self.eval_trace in (None, self.trace) else f"{self.trace}/{self.eval_trace} (eval)"
        text = (
            f"event_shape={format_shape(self.event_shape)}, context={self.context_features}, trace={trace}, "
            f"t=[{self.t0:g}, {self.t1:g}], method={self.method}, rtol={self.rtol:g}, atol={self.atol:g}"
        )
        if self.adjoint:
            text += ", adjoint=True"
        if self.kinetic or self.jacobian:
            text += f", kinetic={self.kinetic:g}, jacobian={self.jacobian:g}"
        return text


def total_nfe(module: nn.Module) -> int:
    """Field evaluations of the last solve of every :class:`CNF` inside ``module``, summed.

    Example:
        >>> import torch
        >>> from flows import FFJORD
        >>> flow = FFJORD(2, transforms=2, hidden=(8,))
        >>> _ = flow.log_prob(torch.randn(3, 2))
        >>> total_nfe(flow) == sum(block.nfe for block in flow.transform)
        True
    """
    return sum(m.nfe for m in module.modules() if isinstance(m, CNF))
