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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from flows.bijections.base import Bijection, Chain
from flows.flow import Flow
from flows.train.batching import batch_size_of, split_batch
from flows.train.objectives import Objective, ObjectiveOutput
from flows.train.pairs import ot_assignment

if TYPE_CHECKING:
    from flows.bijections.continuous import CNF

__all__ = ["COUPLINGS", "FlowMatching", "flow_matching_parts", "independent_coupling", "ot_coupling"]

COUPLINGS = ("independent", "ot")

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

    Validation (:meth:`evaluate`) reports ``loss`` (the flow-matching loss, with the noise of a
    fixed seed so that successive validations are comparable) and, with ``eval_nll=True``,
    ``nll``, the mean negative log-likelihood by the ODE (costly: a solve with the trace).

    References:
        Lipman, Chen, Ben-Hamu, Nickel, Le (2023), "Flow Matching for Generative Modeling",
        ICLR, arXiv:2210.02747.
        Tong, Fatras, Malkin, Huguet, Zhang, Rector-Brooks, Wolf, Bengio (2024), "Improving and
        generalizing flow-based generative models with minibatch optimal transport", TMLR,
        arXiv:2302.00482.

    Args:
        sigma: noise level ``σ >= 0`` of the path.
        coupling: ``"independent"``, ``"ot"`` or a callable ``(x, z) -> (x', z')``.
        eval_seed: seed of the base samples, times and noise during :meth:`evaluate`.
        eval_nll: also report the ODE negative log-likelihood in :meth:`evaluate`.
        time_power: exponent ``p > 0`` of the times ``s = u^p``, ``u ~ U(0, 1)``.

    Raises:
        ValueError: for a negative or non-finite ``sigma``, a ``time_power`` that is not finite and
            positive, or an unknown coupling name.
        TypeError: when called on a model that is not a ``Flow`` with one CNF, or when a coupling
            returns tensors of other shapes.

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
    ) -> None:
        if not (isinstance(time_power, (int, float)) and 0 < time_power < float("inf")):
            raise ValueError(f"FlowMatching: expected a finite time_power > 0, got {time_power!r}")
        if not (isinstance(sigma, (int, float)) and sigma >= 0 and sigma < float("inf")):
            raise ValueError(f"FlowMatching: expected a finite sigma >= 0, got {sigma!r}")
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

    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:
        front, cnf = flow_matching_parts(model)
        x, context = split_batch(batch)
        if not x.is_floating_point():
            raise TypeError(f"FlowMatching: expected floating-point data, got dtype {x.dtype}")
        with torch.no_grad():
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
            x_t = (1 - s.reshape(shape)) * x + s.reshape(shape) * z
            if self.sigma:
                x_t = x_t + self.sigma * torch.randn_like(x_t)
            target = (z - x) / span
        if context is not None and cnf.context_features:
            context = context.expand(n, cnf.context_features)
            f = cnf.field(t, x_t, context)
        else:
            f = cnf.field(t, x_t)
        return (f - target).square().reshape(n, -1).sum(-1).mean()

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
        return f"FlowMatching(sigma={self.sigma:g}, coupling={self.coupling_name!r}{power}, eval_nll={self.eval_nll})"
