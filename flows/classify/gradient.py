r"""FlowBack's training-free classifier: :func:`gradient_classifier`, one forward and one backward pass."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["gradient_classifier"]


def gradient_classifier(flow: nn.Module, x: Tensor, num_classes: int) -> Tensor:
    r"""Class scores :math:`\partial_\lambda \log p(x \mid \mathrm{softmax}(\lambda)^\top E)` at :math:`\lambda = 0`.

    The class embedding is relaxed to the mixture :math:`e = \mathrm{softmax}(\lambda)^\top E` of
    the class table :math:`E` (every TarFlow block's table, one shared :math:`\lambda`); at
    :math:`\lambda = 0` it is the mean embedding :math:`\bar E` (TarFlow's unconditional model)
    and, with :math:`g = \nabla_e \log p(x \mid e)|_{\bar E}`,

    .. math:: \frac{\partial \log p}{\partial \lambda_k} = \frac1K \langle g, E_k - \bar E \rangle,

    the first-order Taylor estimate of :math:`(\log p(x \mid E_k) - \log p(x \mid \bar E)) / K`.
    The predicted class is the ``argmax`` of the scores: a linearised Bayes rule (uniform prior)
    for one backward pass instead of ``K`` forward passes
    (:func:`~flows.classify.bayes_classifier`). It equals the Bayes ``argmax`` when
    :math:`\log p(x \mid e)` is affine along the class directions, e.g. class Gaussians
    :math:`\mathcal N(x; A e, I)` whose means :math:`A E_k` have equal norms and equal products
    with :math:`A \bar E`; in general it may differ.

    References:
        Chen et al. (2025), "Flowing Backwards: Improving Normalizing Flows via Reverse
        Representation Alignment", arXiv:2511.22345 (the training-free classifier).

    Args:
        flow: a flow with a class-embedding table, i.e. a method ``log_prob_class_weights(x, weights)``
            (:class:`~flows.TarFlow` with ``num_classes``).
        x: data ``(*batch, *event_shape)`` (scored as given: noise it the way the flow was
            trained, as for the Bayes classifier).
        num_classes: ``K``, the flow's number of classes.

    Returns:
        ``(*batch, K)`` scores (without gradient history); ``scores.argmax(-1)`` is the prediction.

    Raises:
        TypeError: for a flow without a class-embedding table.
        ValueError: for ``num_classes`` other than the flow's.

    Example:
        >>> import torch
        >>> from flows import TarFlow
        >>> flow = TarFlow(4, transforms=1, hidden=(8,), num_classes=3)
        >>> gradient_classifier(flow, torch.randn(5, 4), 3).shape
        torch.Size([5, 3])
    """
    soft = getattr(flow, "log_prob_class_weights", None)
    if not callable(soft) or not getattr(flow, "num_classes", 0):
        raise TypeError(
            "gradient_classifier: expected a class-conditional flow with a class-embedding table "
            f"(log_prob_class_weights, e.g. TarFlow(num_classes=K)), got {type(flow).__name__}"
            + ("" if not callable(soft) else " without classes")
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes != flow.num_classes:
        raise ValueError(
            f"gradient_classifier: expected num_classes equal to the flow's ({flow.num_classes}), got {num_classes!r}"
        )
    event = len(getattr(flow, "event_shape", ()))
    batch = x.shape[: x.dim() - event]
    logits = x.new_zeros(*batch, num_classes, requires_grad=True)
    with torch.enable_grad():
        (scores,) = torch.autograd.grad(soft(x.detach(), logits.softmax(-1)).sum(), logits)
    return scores.detach()
