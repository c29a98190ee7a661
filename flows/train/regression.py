r"""Regression training of flows onto latent–data pairs (FORT / RegFlow): no log-determinant in the loss.

Given pairs :math:`(x_i, z_i)` from a deterministic coupling of the base distribution and the
target (a trained CNF, or an optimal-transport coupling: :mod:`flows.train.pairs`), an exactly
invertible flow :math:`T` (forward: data → latent, so the sampling map is :math:`T^{-1}`) is
trained by

.. math::
    L(\theta) = \frac1B \sum_b \big\|T_\theta^{-1}(z_b) - x_b\big\|^2
      \;+\; \lambda\, \frac1B \sum_b \big\|T_\theta(x_b) - z_b\big\|^2 ,

squared errors summed over the event dimensions and averaged over the batch. The first term
regresses the sampling map onto the pairs; the second (the forward-backward consistency term,
weight :math:`\lambda`, ``consistency``) regresses the density direction onto the same pairs, so
that the map is fitted where the density is evaluated, :math:`\log q(x) = \log p_Z(T(x)) +
\log|\det J_T(x)|`. Both terms vanish exactly when :math:`T^{-1}` is the coupling's map; neither
needs a log-determinant, so each step costs one pass in each direction (one with
:math:`\lambda = 0`), whatever the transform's Jacobian.

The flow stays a normalizing flow: after training it has an exact :math:`\log q` and serves as a
Boltzmann generator with self-normalised importance weights :math:`\log w = -u(x) - \log q(x)`
(:func:`flows.metrics.sample_log_weights`, :func:`~flows.metrics.kish_ess`,
:func:`~flows.metrics.log_z_estimate`, :func:`~flows.metrics.reweighted_mean`). Its quality as a
sampler is that of the coupling it learned: distilled from a CNF, its density approaches the
CNF's, at the cost of a few coupling layers instead of an ODE solve with a trace.

References:
    Rehman, Davis, Lu, Tang, Bronstein, Bengio, Tong, Bose (2025), "FORT: Forward-Only Regression
    Training of Normalizing Flows" (also "Efficient Regression-based Training of Normalizing Flows
    for Boltzmann Generators", RegFlow), arXiv:2506.01158.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from flows._validation import check_event
from flows.bijections.base import Bijection
from flows.flow import Flow
from flows.train.objectives import Objective

__all__ = ["PairRegression", "pair_regression_loss"]


def _check_consistency(consistency: float, who: str) -> float:
    if not (isinstance(consistency, (int, float)) and math.isfinite(consistency) and consistency >= 0):
        raise ValueError(f"{who}: expected a finite consistency weight >= 0, got {consistency!r}")
    return float(consistency)


def _transform_of(model: nn.Module, who: str) -> Bijection:
    if isinstance(model, Flow):
        return model.transform
    if isinstance(model, Bijection):
        return model
    raise TypeError(f"{who}: expected a Flow or a Bijection, got {type(model).__name__}")


def pair_regression_loss(
    model: Flow | Bijection,
    x: Tensor,
    z: Tensor,
    context: Tensor | None = None,
    *,
    consistency: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Regression loss of a flow on pairs: :math:`\overline{\|T^{-1}(z) - x\|^2} + \lambda\,\overline{\|T(x) - z\|^2}`.

    Args:
        model: the flow (its transform :math:`T` is used) or a transform, data → latent.
        x: data side of the pairs, shape ``(*batch, *event_shape)``.
        z: latent side, shape ``(*batch, *event_shape_out)``.
        context: context of conditional models, ``(*batch, context_features)``.
        consistency: weight :math:`\lambda \ge 0` of the forward-backward consistency term
            (0 skips the forward pass).

    Returns:
        ``(loss, metrics)``: the scalar loss and the detached batch means ``sampling_error``
        (:math:`\|T^{-1}(z) - x\|^2`) and ``consistency_error`` (:math:`\|T(x) - z\|^2`; only
        when :math:`\lambda > 0`).

    Raises:
        TypeError: for a model that is neither a Flow nor a Bijection.
        ValueError: for pairs of the wrong shapes or a negative weight.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> flow = Flow(Affine(2, shift=1.0), StandardNormal(2))  # T(x) = x + 1
        >>> x = torch.randn(8, 2)
        >>> loss, metrics = pair_regression_loss(flow, x, x + 1.0)  # the exact pairs (x, T(x))
        >>> round(loss.item(), 10), sorted(metrics)
        (0.0, ['consistency_error', 'sampling_error'])
    """
    who = "pair_regression_loss"
    transform = _transform_of(model, who)
    consistency = _check_consistency(consistency, who)
    check_event(z, transform.event_shape_out, who, "z")
    check_event(x, transform.event_shape, who, "x")
    batch_z = z.shape[: z.dim() - len(transform.event_shape_out)]
    batch_x = x.shape[: x.dim() - len(transform.event_shape)]
    if batch_z != batch_x:
        raise ValueError(
            f"{who}: expected z and x with the same batch shape, got {tuple(batch_z)} and {tuple(batch_x)}"
        )
    x_dims = tuple(range(len(batch_x), x.dim()))
    z_dims = tuple(range(len(batch_z), z.dim()))
    sampling = (transform.inverse(z, context) - x).square().sum(x_dims).mean()
    metrics = {"sampling_error": sampling.detach()}
    if consistency == 0:
        return sampling, metrics
    backward = (transform(x, context) - z).square().sum(z_dims).mean()
    metrics["consistency_error"] = backward.detach()
    return sampling + consistency * backward, metrics


class PairRegression(Objective):
    r"""Objective: regress a flow onto latent–data pairs, :func:`pair_regression_loss` (FORT / RegFlow).

    Batches are ``(x, z)`` or ``(x, z, context)``: train with
    ``trainer.fit((x, z), val=(x_val, z_val), ...)`` on pairs from :func:`flows.train.pairs.teacher_pairs`
    or :func:`flows.train.pairs.ot_pairs`. The metrics ``sampling_error`` and ``consistency_error`` are
    logged (and averaged by :meth:`~flows.train.Objective.evaluate` over validation pairs).

    The forward-backward weight ``consistency`` defaults to 1: the two directions weigh equally
    (the latent and the data are both of order one for standardised targets). With 0 only the
    sampling map is regressed, which is cheaper per step (one pass instead of two) but leaves the
    density direction fitted only through invertibility.

    References:
        Rehman, Davis, Lu, Tang, Bronstein, Bengio, Tong, Bose (2025), "FORT: Forward-Only
        Regression Training of Normalizing Flows", arXiv:2506.01158.

    Args:
        consistency: weight :math:`\lambda \ge 0` of the consistency term :math:`\|T(x) - z\|^2`.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.train import Trainer
        >>> z = torch.randn(256, 2)
        >>> x = 2.0 * z + 1.0  # pairs of the affine map x = 2z + 1
        >>> student = Flow(Affine(2), StandardNormal(2))
        >>> history = Trainer(student, PairRegression(), lr=0.05, progress=False).fit((x, z), epochs=40, batch_size=64)
        >>> student.transform.inverse(torch.zeros(1, 2)).round(decimals=2).tolist()
        [[1.0, 1.0]]
    """

    def __init__(self, consistency: float = 1.0) -> None:
        self.consistency = _check_consistency(consistency, "PairRegression")

    def __call__(self, model: nn.Module, batch: object) -> tuple[Tensor, dict[str, Tensor]]:
        sequence = isinstance(batch, (tuple, list))
        if not (sequence and len(batch) in (2, 3) and all(isinstance(b, Tensor) for b in batch)):
            got = f"a sequence of {len(batch)}" if sequence else type(batch).__name__
            raise TypeError(f"PairRegression: expected a batch (x, z) or (x, z, context) of tensors, got {got}")
        x, z = batch[0], batch[1]
        context = batch[2] if len(batch) == 3 else None
        return pair_regression_loss(model, x, z, context, consistency=self.consistency)

    def __repr__(self) -> str:
        return f"PairRegression(consistency={self.consistency})"
