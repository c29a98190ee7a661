r"""Flow matching: train a continuous normalizing flow by regressing its vector field, without solving the ODE.

A :class:`~flows.CNF` maps data at ``t0`` to latent at ``t1`` by :math:`\dot z = f(t, z; c)`.
Maximum likelihood solves that ODE, with its trace, at every step. Conditional flow matching
(Lipman et al. 2023; Tong et al. 2023) instead picks a path between each data point ``x`` and a
base sample ``z`` and regresses the field onto the path's velocity, one network evaluation per
sample and no solver:

.. math::
    s = \frac{t - t_0}{t_1 - t_0} \sim \mathcal U(0, 1), \qquad
    x_t = (1 - s)\,x + s\,z + \sigma\varepsilon, \qquad
    u = \frac{z - x}{t_1 - t_0}, \qquad
    L = \mathbb E\,\bigl\|f(t, x_t; c) - u\bigr\|^2 ,

with :math:`\varepsilon \sim \mathcal N(0, I)` and ``σ`` the noise level of Tong et al. (``σ = 0``:
the straight paths of Lipman et al.'s optimal-transport conditional path with
:math:`\sigma_{\min} = 0`, also Liu et al.'s rectified flow). The minimiser is the *marginal*
field :math:`f^*(t, y) = \mathbb E[u \mid x_t = y]`, whose flow carries the data distribution
(convolved with :math:`\mathcal N(0, \sigma^2 I)`) at ``t0`` to the base at ``t1``; the trained CNF
is an ordinary normalizing flow, and :meth:`~flows.Flow.log_prob` still solves the ODE with the
exact (or Hutchinson) trace.

The pairs ``(x, z)`` may be drawn independently (``coupling="independent"``) or re-paired on each
batch by exact minibatch optimal transport (``coupling="ot"``, Tong et al. 2023; Pooladian et al.
2023): the permutation minimising :math:`\sum_i \|x_i - z_{\pi(i)}\|^2`, found by
:func:`scipy.optimize.linear_sum_assignment` through :func:`flows.train.pairs.ot_assignment`. OT pairs
cross less, so the marginal field is straighter and the ODE needs fewer steps.

The regression target may also be the *stable target* (``velocity="stable"``, Xu et al. 2023): in
place of one pair's velocity, its posterior average over a reference set of data rows, which has
the same minimiser (exactly so as the reference grows) and a far smaller variance. See
:class:`FlowMatching`.

References:
    Lipman, Chen, Ben-Hamu, Nickel, Le (2023), "Flow Matching for Generative Modeling", ICLR,
    arXiv:2210.02747.
    Tong, Fatras, Malkin, Huguet, Zhang, Rector-Brooks, Wolf, Bengio (2024), "Improving and
    generalizing flow-based generative models with minibatch optimal transport", TMLR,
    arXiv:2302.00482.
    Pooladian, Ben-Hamu, Domingo-Enrich, Amos, Lipman, Chen (2023), "Multisample Flow Matching:
    Straightening Flows with Minibatch Couplings", ICML, arXiv:2304.14772.
    Liu, Gong, Liu (2023), "Flow Straight and Fast: Learning to Generate and Transfer Data with
    Rectified Flow", ICLR, arXiv:2209.03003.
    Xu, Tong, Jaakkola (2023), "Stable Target Field for Reduced Variance Score
    Estimation in Diffusion Models", ICLR, arXiv:2302.00670.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from flows._validation import (
    check_context,
    check_count,
    check_flow_inputs,
    check_number,
    check_objective_batch,
)
from flows.bijections.base import Bijection, Chain
from flows.flow import Flow
from flows.train.batching import batch_size_of, split_batch
from flows.train.objectives import Objective, ObjectiveOutput
from flows.train.pairs import ot_assignment

if TYPE_CHECKING:
    from flows.bijections.continuous import CNF

__all__ = ["COUPLINGS", "VELOCITIES", "FlowMatching", "flow_matching_parts", "independent_coupling", "ot_coupling"]

COUPLINGS = ("independent", "ot")
VELOCITIES = ("conditional", "stable")
MAX_SIGMA = 1e150
"""The largest noise level accepted (``σ²`` must be finite in float64)."""

Coupling = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def independent_coupling(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """The independent coupling: the pairs as drawn, ``(x, z)`` unchanged."""
    return x, z


def ot_coupling(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    r"""Exact minibatch optimal transport: ``(x, z[π])`` with ``π`` minimising :math:`\sum_i \|x_i - z_{\pi(i)}\|^2`.

    The data rows keep their order (so a context stays with its row); the base samples are
    permuted. Uses :func:`flows.train.pairs.ot_assignment` (Jonker–Volgenant, float64 costs).

    Args:
        x: data, shape ``(N, *event)``.
        z: base samples, the same shape.

    Returns:
        ``(x, z[π])``.

    Example:
        >>> import torch
        >>> x = torch.tensor([[0.0], [1.0], [2.0]])
        >>> ot_coupling(x, torch.tensor([[2.5], [-0.5], [1.5]]))[1].flatten().tolist()
        [-0.5, 1.5, 2.5]
    """
    return x, z[ot_assignment(x, z)]


def flow_matching_parts(model: nn.Module) -> tuple[list[Bijection], CNF]:
    """The bijections in front of the CNF, and the CNF, of a flow that flow matching can train.

    The model must be a :class:`~flows.Flow` whose transform is one :class:`~flows.CNF`, possibly
    preceded (in a :class:`~flows.bijections.Chain`) by layers without trainable parameters, such
    as the :class:`~flows.bijections.Standardize` that ``flows fit`` puts in front: the data are
    mapped through those first, and the CNF's field is regressed on the result.

    Raises:
        TypeError: for a model that is not a ``Flow`` with such a transform.
    """
    from flows.bijections.continuous import CNF  # here, so that importing flows.train does not load torchdiffeq

    if not isinstance(model, Flow):
        raise TypeError(f"FlowMatching: expected a Flow whose transform is a CNF, got {type(model).__name__}")
    layers: list[Bijection] = []
    pending: list[Bijection] = [model.transform]
    while pending:
        layer = pending.pop(0)
        if isinstance(layer, Chain):
            pending = [*layer, *pending]
        else:
            layers.append(layer)
    names = ", ".join(type(layer).__name__ for layer in layers[:6]) + (
        f", ... ({len(layers)} layers)" if len(layers) > 6 else ""
    )
    if not isinstance(layers[-1], CNF) or any(isinstance(layer, CNF) for layer in layers[:-1]):
        raise TypeError(
            f"FlowMatching: expected a Flow whose transform is one CNF (after fixed preprocessing), got [{names}]"
        )
    front = layers[:-1]
    trainable = [type(layer).__name__ for layer in front if any(p.requires_grad for p in layer.parameters())]
    if trainable:
        raise TypeError(
            "FlowMatching: expected the layers before the CNF to have no trainable parameters, got "
            f"{', '.join(trainable)}; freeze them (requires_grad_(False)) or train the flow by maximum likelihood"
        )
    return front, layers[-1]


class FlowMatching(Objective):
    r"""Conditional flow matching of a :class:`~flows.CNF`, with noise level ``σ`` and minibatch couplings.

    Each batch: ``x`` = the data rows (mapped through any fixed preprocessing in front of the CNF),
    ``z = model.base.sample((N,))`` (one draw per row, with the row's context when the base is
    conditional), ``x, z = coupling(x, z)``, times ``t = t0 + s (t1 - t0)`` with ``s ~ U(0, 1)``
    per sample, and the loss (the mean over the batch of the squared error summed over the event)

    .. math::
        L = \frac1N \sum_i \bigl\| f(t_i, (1 - s_i) x_i + s_i z_i + \sigma \varepsilon_i; c_i)
        - \frac{z_i - x_i}{t_1 - t_0} \bigr\|^2 .

    The field is called with per-sample times, ``field(t, x_t)`` (``field(t, x_t, context)``),
    ``t`` of shape ``(N,)``: :class:`~flows.nn.TimeMLP` accepts them, and so must a custom field.
    The direction matches the library's CNF: data at ``t0``, latent at ``t1``; sampling integrates
    the CNF backwards and ``log_prob`` forwards, both by the ODE solver.

    Couplings: ``"independent"`` (the pairs as drawn), ``"ot"`` (exact minibatch optimal
    transport, :func:`ot_coupling`), or any callable ``(x, z) -> (x', z')`` returning paired
    batches of the same shapes (e.g. an equivariant alignment before the assignment). With a
    context, the coupling is applied separately within each group of rows sharing the same
    context value, so each row's base sample stays a draw from the base given that context
    (exact OT per class for discrete labels; for continuous contexts, where every row differs,
    this is the independent coupling).

    Times: ``s = u^p`` with ``u ~ U(0, 1)`` and ``p = time_power`` (``p = 1``: uniform). Any
    density of ``s`` that is positive on ``(0, 1)`` leaves the minimiser, the marginal field, unchanged
    (the loss is minimised pointwise in ``t``); it only reweights the regression over time.
    ``p > 1`` spends more of it near the data end ``t0`` (``s`` has density
    :math:`s^{1/p - 1}/p`), where the field of thin, low-noise data is sharpest and where
    the likelihood is most sensitive to its errors.

    Targets: ``"conditional"`` regresses onto each pair's own velocity ``(z_i - x_i)/(t1 - t0)``;
    ``"stable"`` onto its average over the data rows that could have produced the same
    state (the stable target of Xu et al. 2023, written here for the straight paths): for a
    reference set of data rows :math:`r_1, \dots, r_M`, the batch's own rows among them, and
    :math:`v = s^2 + \sigma^2`,

    .. math::
        w_{ij} \propto \exp\Bigl(-\frac{\|x_{t,i} - (1 - s_i) r_j\|^2}{2 v_i}\Bigr), \qquad
        \bar r_i = \sum_j w_{ij} r_j, \qquad
        u_i = \frac{1}{t_1 - t_0}\Bigl(\frac{s_i}{v_i}\bigl(x_{t,i} - (1 - s_i)\bar r_i\bigr)
        - \bar r_i\Bigr),

    the posterior mean of the velocity given the state when the data are the reference rows
    (``x_t`` given a data row ``r`` is :math:`\mathcal N((1 - s) r, v I)` under a standard normal
    base). Its minimiser is the marginal field of the reference rows' distribution: with the
    whole training set as ``reference``, the conditional target's minimiser up to the batch's
    rows counting twice (a ``N/M`` effect); with a sampled reference, within a bias that
    vanishes as the reference grows (Xu et al. 2023). Its variance is far smaller, most of all
    at ``s`` near 1 where many data rows reach the same state. It
    costs ``N x M`` distances a step. The reference is the batch itself, plus ``reference_size``
    rows drawn (uniformly, with replacement, by the global generator) each step from
    ``reference`` when one is given (all of its rows when ``reference_size`` is ``None``). The
    stable target needs the independent coupling, a :class:`~flows.StandardNormal` base (for
    which the posterior above is exact) and no context.

    Validation (:meth:`evaluate`) reports ``loss`` (the flow-matching loss, with the noise of a
    fixed seed so that successive validations are comparable) and, with ``eval_nll=True``,
    ``nll``, the mean negative log-likelihood by the ODE (costly: a solve with the trace).

    References:
        Lipman, Chen, Ben-Hamu, Nickel, Le (2023), "Flow Matching for Generative Modeling",
        ICLR, arXiv:2210.02747.
        Tong, Fatras, Malkin, Huguet, Zhang, Rector-Brooks, Wolf, Bengio (2024), "Improving and
        generalizing flow-based generative models with minibatch optimal transport", TMLR,
        arXiv:2302.00482.
        Xu, Tong, Jaakkola (2023), "Stable Target Field for Reduced Variance Score Estimation in
        Diffusion Models", ICLR, arXiv:2302.00670.

    Args:
        sigma: noise level ``σ >= 0`` of the path.
        coupling: ``"independent"``, ``"ot"`` or a callable ``(x, z) -> (x', z')``.
        eval_seed: seed of the base samples, times and noise during :meth:`evaluate`.
        eval_nll: also report the ODE negative log-likelihood in :meth:`evaluate`.
        time_power: exponent ``p > 0`` of the times ``s = u^p``, ``u ~ U(0, 1)``.
        velocity: the regression target of the field, ``"conditional"`` (the conditional velocity of
            each pair) or ``"stable"`` (the stable target field, Xu et al. 2023).
        reference: data rows (as the model takes them, before any fixed preprocessing), shape
            ``(M, *event)``, added to the batch as the stable target's reference set.
        reference_size: rows drawn from ``reference`` each step (``None``: all of them).

    Inputs are checked as maximum likelihood checks them: every batch goes through
    :func:`flows._validation.check_flow_inputs`, the checks of :meth:`~flows.Flow.log_prob` (event
    shape, dtype, finite values with the first bad row named, the context: present exactly when
    the flow or its CNF takes one, floating-point, of the right width, finite), plus one batch
    dimension with at least one row. A NaN row is therefore an error, never a NaN loss that the
    trainer's guard would drop as a "non-finite step". RNODE penalties (``CNF(kinetic=...)``,
    ``jacobian=...``) regularise an ODE solve, and flow matching solves none: a CNF with a positive
    weight is refused rather than trained without its penalty.

    Raises:
        ValueError: for a ``sigma`` that is negative, NaN, infinite or above :data:`MAX_SIGMA`, a
            ``time_power`` that is not finite and positive, an unknown coupling or velocity name, a
            ``reference`` or ``reference_size`` without ``velocity="stable"``, a ``reference_size``
            without a ``reference``, a stable target with a coupling other than the independent
            one, an empty or non-finite ``reference``, a ``reference_size`` that is not a positive
            integer; when called, a batch that :meth:`~flows.Flow.log_prob` would refuse (wrong
            event shape, NaN/Inf values, a missing, unexpected or non-finite context), an empty
            batch or one without its batch dimension, a CNF with RNODE weights, path points that
            overflow the dtype (a ``sigma`` too large for the data's precision), a stable target
            with a context or with ``reference`` rows of another event shape than the data.
        TypeError: for non-numeric ``sigma``/``time_power``, a non-bool ``eval_nll``, a non-integer
            ``eval_seed``; when called on a model that is not a ``Flow`` with one CNF, on integer
            data or an integer context, when a coupling returns tensors of other shapes, a
            ``reference`` that is not a floating-point tensor, or (stable target) a base that is not
            a ``StandardNormal``.

    Example:
        >>> import torch
        >>> from flows import CNF, Flow, StandardNormal
        >>> flow = Flow(CNF(2, hidden=(16,)), StandardNormal(2))
        >>> loss = FlowMatching(sigma=0.1, coupling="ot")(flow, (torch.randn(8, 2),))
        >>> loss.shape, bool(loss > 0)
        (torch.Size([]), True)
    """

    def __init__(
        self,
        *,
        sigma: float = 0.0,
        coupling: str | Coupling = "independent",
        eval_seed: int = 0,
        eval_nll: bool = False,
        time_power: float = 1.0,
        velocity: str = "conditional",
        reference: Tensor | None = None,
        reference_size: int | None = None,
    ) -> None:
        time_power = check_number("FlowMatching", "time_power", time_power, minimum=0, strict=True)
        # sigma**2 enters the stable target's variance: past MAX_SIGMA it overflows even in float64
        sigma = check_number("FlowMatching", "sigma", sigma, minimum=0, maximum=MAX_SIGMA)
        if not isinstance(eval_nll, bool):
            raise TypeError(f"FlowMatching: expected eval_nll to be a bool, got {eval_nll!r}")
        eval_seed = check_count("FlowMatching", "eval_seed", eval_seed, minimum=None)
        if isinstance(coupling, str):
            if coupling not in COUPLINGS:
                raise ValueError(f"FlowMatching: expected coupling in {COUPLINGS} or a callable, got {coupling!r}")
            self.coupling_name = coupling
            self.coupling: Coupling = ot_coupling if coupling == "ot" else independent_coupling
        elif callable(coupling):
            self.coupling_name = getattr(coupling, "__name__", type(coupling).__name__)
            self.coupling = coupling
        else:
            raise ValueError(f"FlowMatching: expected coupling in {COUPLINGS} or a callable, got {coupling!r}")
        if velocity not in VELOCITIES:
            raise ValueError(f"FlowMatching: expected velocity in {VELOCITIES}, got {velocity!r}")
        if velocity != "stable" and (reference is not None or reference_size is not None):
            raise ValueError(
                'FlowMatching: reference and reference_size are for velocity="stable", got velocity=' + repr(velocity)
            )
        if velocity == "stable" and self.coupling is not independent_coupling:
            raise ValueError(
                'FlowMatching: velocity="stable" needs coupling="independent" (its posterior assumes '
                f"base samples drawn independently of the data), got coupling={self.coupling_name!r}"
            )
        if reference is not None:
            if not (isinstance(reference, Tensor) and reference.is_floating_point()):
                kind = f"dtype {reference.dtype}" if isinstance(reference, Tensor) else type(reference).__name__
                raise TypeError(f"FlowMatching: expected reference to be a floating-point tensor, got {kind}")
            if reference.dim() < 2 or len(reference) == 0:
                raise ValueError(
                    f"FlowMatching: expected reference rows of shape (M >= 1, *event), got {tuple(reference.shape)}"
                )
            bad = int((~torch.isfinite(reference)).reshape(len(reference), -1).any(-1).sum())
            if bad:
                raise ValueError(f"FlowMatching: expected finite reference rows, got {bad} with NaN or Inf")
            reference = reference.detach()
        if reference_size is not None and not (
            isinstance(reference_size, int) and not isinstance(reference_size, bool) and reference_size >= 1
        ):
            raise ValueError(f"FlowMatching: expected reference_size to be an integer >= 1, got {reference_size!r}")
        if reference_size is not None and reference is None:
            raise ValueError(
                "FlowMatching: reference_size draws rows from reference, got reference_size="
                f"{reference_size} and no reference; expected a reference tensor too (or no reference_size)"
            )
        self.velocity = velocity
        self.reference = reference
        self.reference_size = reference_size
        self.sigma = float(sigma)
        self.eval_seed = eval_seed
        self.eval_nll = bool(eval_nll)
        self.time_power = float(time_power)

    def _couple(self, x: Tensor, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.coupling is independent_coupling:
            return x, z
        if context is None:
            return self._checked(x, z, self.coupling(x, z))
        _, groups = torch.unique(context.reshape(len(context), -1), dim=0, return_inverse=True)
        x, z = x.clone(), z.clone()
        for group in groups.unique():
            rows = (groups == group).nonzero().squeeze(1)
            if len(rows) > 1:
                x[rows], z[rows] = self._checked(x[rows], z[rows], self.coupling(x[rows], z[rows]))
        return x, z

    @staticmethod
    def _checked(x: Tensor, z: Tensor, out: object) -> tuple[Tensor, Tensor]:
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, Tensor) for o in out)):
            raise TypeError(f"FlowMatching: expected the coupling to return (x, z) tensors, got {type(out).__name__}")
        if out[0].shape != x.shape or out[1].shape != z.shape:
            raise TypeError(
                f"FlowMatching: expected the coupling to return shapes {tuple(x.shape)} and {tuple(z.shape)}, "
                f"got {tuple(out[0].shape)} and {tuple(out[1].shape)}"
            )
        return out

    def _inputs(self, model: nn.Module, batch: object) -> tuple[list[Bijection], CNF, Tensor, Tensor | None]:
        """The layers in front, the CNF, and the batch, checked exactly as :meth:`Flow.log_prob` checks it."""
        front, cnf = flow_matching_parts(model)
        x, context = split_batch(batch)
        who = "FlowMatching"
        check_objective_batch(model, x, context, who)
        check_flow_inputs(model, x, context, who)
        check_context(context, cnf.context_features, who)  # what the CNF's own solve refuses
        if cnf.kinetic or cnf.jacobian:
            raise ValueError(
                "FlowMatching: the CNF has RNODE weights (kinetic="
                f"{cnf.kinetic:g}, jacobian={cnf.jacobian:g}), which flow matching does not add (they "
                "regularise the ODE solve, and flow matching solves none); expected kinetic=0 and jacobian=0, "
                "or train by maximum likelihood"
            )
        if self.velocity == "stable" and context is not None:
            raise ValueError('FlowMatching: velocity="stable" does not support a context; use velocity="conditional"')
        return front, cnf, x, context

    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:
        front, cnf, x, context = self._inputs(model, batch)
        with torch.no_grad():
            data = x
            for layer in front:
                x = layer(x, context)
            n = x.shape[0]
            base = model.base
            if context is not None and getattr(base, "context_features", 0):
                z = base.sample((), context)
            else:
                z = base.sample((n,))
            z = z.to(x.dtype)
            x, z = self._couple(x, z, context)
            s = torch.rand(n, dtype=x.dtype, device=x.device)
            if self.time_power != 1.0:
                s = s.pow(self.time_power)
            span = cnf.t1 - cnf.t0
            t = cnf.t0 + s * span
            shape = (n,) + (1,) * (x.dim() - 1)
            shift = s.reshape(shape) * z  # x_t - (1 - s) x, kept apart for the stable target's precision
            if self.sigma:
                shift = shift + self.sigma * torch.randn_like(x)
            x_t = (1 - s.reshape(shape)) * x + shift
            self._check_path(x_t, z, cnf)
            if self.velocity == "stable":
                target = self._stable_target(model, front, x, z, shift, s, data) / span
            else:
                target = (z - x) / span
        if context is not None and cnf.context_features:
            context = context.expand(n, cnf.context_features)
            f = cnf.field(t, x_t, context)
        else:
            f = cnf.field(t, x_t)
        return (f - target).square().reshape(n, -1).sum(-1).mean()

    def _check_path(self, x_t: Tensor, z: Tensor, cnf: CNF) -> None:
        """Raise if the path points or velocities overflow (the inputs are finite: σ or the scale is too large)."""
        if not (bool(torch.isfinite(x_t).all()) and bool(torch.isfinite(z).all())):
            raise ValueError(
                f"FlowMatching: the path points x_t = (1 - s) x + s z + sigma eps overflow {x_t.dtype} with "
                f"sigma={self.sigma:g}; expected a sigma (and data) small enough to keep them finite"
            )
        if not math.isfinite(1.0 / (cnf.t1 - cnf.t0)):
            raise ValueError(f"FlowMatching: expected a CNF interval with finite 1/(t1 - t0), got [{cnf.t0}, {cnf.t1}]")

    def _stable_target(
        self, model: nn.Module, front: list[Bijection], x: Tensor, z: Tensor, shift: Tensor, s: Tensor, data: Tensor
    ) -> Tensor:
        """The stable target times ``t1 - t0``; ``shift = x_t - (1 - s) x``, ``data`` the batch as given."""
        from flows.distributions.normal import StandardNormal

        if not isinstance(model.base, StandardNormal):
            raise TypeError(
                'FlowMatching: velocity="stable" needs a StandardNormal base (its posterior is written for '
                f"N(0, I)), got {type(model.base).__name__}"
            )
        n = len(x)
        own = x.reshape(n, -1)
        rows = [own]
        if self.reference is not None:
            reference = self.reference
            if reference.shape[1:] != data.shape[1:]:
                raise ValueError(
                    f"FlowMatching: expected reference rows of event shape {tuple(data.shape[1:])} (as the data), "
                    f"got {tuple(reference.shape[1:])}"
                )
            if self.reference_size is not None:
                reference = reference[torch.randint(len(reference), (self.reference_size,), device=reference.device)]
            reference = reference.to(device=data.device, dtype=data.dtype)
            for layer in front:
                reference = layer(reference)
            rows.append(reference.to(x.dtype).reshape(len(reference), -1))
        r = torch.cat(rows)
        keep = (1 - s)[:, None]
        v = (s * s + self.sigma**2)[:, None]
        shift = shift.reshape(n, -1)
        x_t = keep * own + shift
        # log-weights -|x_t - (1 - s) r|^2 / 2v, less the row's constant |x_t|^2 / 2v (softmax drops it):
        # (1 - s)(x_t . r - (1 - s)|r|^2 / 2) / v, one (N, M) product and no |x_t|^2 - 2ab cancellation
        inverse = torch.where(v > 0, 1 / v.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(v))
        logits = (x_t @ r.T - 0.5 * keep * r.square().sum(-1)) * (keep * inverse)
        delta = torch.softmax(logits, dim=-1) @ r - own  # r_bar - x
        # (s / v)(x_t - (1 - s) r_bar) - r_bar, where x_t - (1 - s) r_bar = shift - (1 - s) delta
        u = s[:, None] * inverse * (shift - keep * delta) - own - delta
        # s = 0 with sigma = 0 (v = 0, a row of probability ~2^-24; its weights above are uniform, not
        # used): the limit, where all weight is on the row itself, is the pair's own z - x
        u = torch.where(v > 0, u, z.reshape(n, -1) - own)
        return u.reshape(x.shape)

    def evaluate(self, model: nn.Module, batches: Iterable[object]) -> dict[str, float]:
        batches = list(batches)
        devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.eval_seed)
            out = super().evaluate(model, batches)
        if self.eval_nll and batches:
            total, count = 0.0, 0
            for batch in batches:
                x, context = split_batch(batch)
                log_p = model.log_prob(x, context) if context is not None else model.log_prob(x)
                total += float(-log_p.sum())
                count += batch_size_of(batch)
            out["nll"] = total / count
        return out

    def __repr__(self) -> str:
        power = f", time_power={self.time_power:g}" if self.time_power != 1.0 else ""
        stable = ""
        if self.velocity == "stable":
            size = "all" if self.reference_size is None else self.reference_size
            rows = (
                f", reference={len(self.reference)} rows, reference_size={size}" if self.reference is not None else ""
            )
            stable = f", velocity='stable'{rows}"
        return (
            f"FlowMatching(sigma={self.sigma:g}, coupling={self.coupling_name!r}{power}{stable}, "
            f"eval_nll={self.eval_nll})"
        )
