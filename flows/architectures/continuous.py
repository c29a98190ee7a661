"""Continuous-time flow builder: FFJORD (stacked CNF blocks with a standard normal base)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from flows._validation import check_builder
from flows.architectures.registry import register
from flows.bijections.base import Chain
from flows.bijections.continuous import CNF, MAX_EVALUATIONS, total_nfe
from flows.bijections.standardize import Standardize
from flows.distributions import StandardNormal
from flows.flow import Flow

__all__ = ["FFJORD"]


@register
class FFJORD(Flow):
    r"""FFJORD: continuous normalizing flow blocks trained with Hutchinson traces.

    ``transforms`` :class:`~flows.CNF` blocks, each integrating its own time-conditioned field
    (:class:`~flows.nn.TimeMLP`) over ``[0, t1]``, then a standard normal base:
    :math:`\log p(x) = \log \mathcal N(z(T); 0, I) + \sum_{\text{blocks}} \int \operatorname{tr}
    \partial f/\partial z \, dt`. As in the paper, training uses the Hutchinson estimator
    (``trace="hutchinson"``, one vector-Jacobian-type product per evaluation); by default
    evaluation (eval mode, see :func:`~flows.evaluating`) uses the exact trace
    (``eval_trace="exact"``, ``D`` products per evaluation: set ``eval_trace=None`` for large
    ``D``). RNODE regularisation (``kinetic``, ``jacobian`` weights, about 0.01 in the paper)
    goes through :class:`~flows.bijections.auxiliary.AuxiliaryLosses`.

    References:
        Grathwohl, Chen, Bettencourt, Sutskever, Duvenaud (2019), "FFJORD: Free-form Continuous
        Dynamics for Scalable Reversible Generative Models", ICLR, arXiv:1810.01367.
        Finlay, Jacobsen, Nurbekyan, Oberman (2020), "How to train your neural ODE: the world of
        Jacobian and kinetic regularization", ICML, arXiv:2002.02798.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional flow).
        transforms: number of CNF blocks.
        hidden: hidden widths of each block's field.
        activation: smooth nonlinearity of the fields (see :class:`~flows.nn.TimeMLP`).
        freqs: time frequencies of the fields (``[cos πkt, sin πkt]``, k = 1..freqs; 0: ``t``).
        trace: trace estimator in train mode (``"hutchinson"`` or ``"exact"``).
        eval_trace: trace estimator in eval mode (``None``: as ``trace``).
        probe: the law of the Hutchinson probe vectors, ``"rademacher"`` or ``"gaussian"``.
        seed: seed of the Hutchinson probes of every solve (``None``: the global generator).
        t1: integration length ``T`` of each block (it integrates over ``[0, t1]``; the name is
            :class:`~flows.CNF`'s).
        method: torchdiffeq solver.
        rtol: relative tolerance.
        atol: absolute tolerance.
        adjoint: backpropagate with the adjoint method.
        kinetic: RNODE kinetic-energy weight.
        jacobian: RNODE Jacobian-Frobenius weight.
        max_evaluations: the most field evaluations one block's solve may take (see :class:`~flows.CNF`).
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

    Example:
        >>> import torch
        >>> flow = FFJORD(2, hidden=(16,))
        >>> flow.log_prob(torch.randn(4, 2)).shape, flow.nfe > 0
        (torch.Size([4]), True)
    """

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        transforms: int = 1,
        hidden: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.Tanh,
        freqs: int = 1,
        trace: str = "hutchinson",
        eval_trace: str | None = "exact",
        probe: str = "rademacher",
        seed: int | None = None,
        t1: float = 1.0,
        method: str = "dopri5",
        rtol: float = 1e-5,
        atol: float = 1e-5,
        adjoint: bool = False,
        kinetic: float = 0.0,
        jacobian: float = 0.0,
        max_evaluations: int = MAX_EVALUATIONS,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        check_builder("FFJORD", features, context, transforms=transforms, hidden=hidden, activation=activation)
        blocks = [
            CNF(
                features,
                context,
                hidden=hidden,
                activation=activation,
                freqs=freqs,
                trace=trace,
                eval_trace=eval_trace,
                probe=probe,
                seed=seed,
                t1=t1,
                method=method,
                rtol=rtol,
                atol=atol,
                adjoint=adjoint,
                kinetic=kinetic,
                jacobian=jacobian,
                max_evaluations=max_evaluations,
            )
            for _ in range(transforms)
        ]
        super().__init__(Chain(*blocks), StandardNormal(features), context=context, standardize=standardize)

    @property
    def nfe(self) -> int:
        """Evaluations of the fields in the last solve of every block, summed."""
        return total_nfe(self)
