r"""Bayes-rule classification with a class-conditional flow: :func:`bayes_classifier`."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from flows._validation import check_count

__all__ = ["bayes_classifier"]


def _class_context(x_batch: torch.Size, k: int, num_classes: int, encoding: str, like: Tensor) -> Tensor:
    if encoding == "index":
        return like.new_full((*x_batch, 1), float(k))
    context = like.new_zeros((*x_batch, num_classes))
    context[..., k] = 1.0
    return context


def _noise_level(flow: nn.Module, noise_std: float | str | None) -> float:
    """The σ to noise the inputs with (0 for none)."""
    if noise_std is None:
        return 0.0
    if isinstance(noise_std, str):
        recorded = getattr(flow, "noise_std", None)
        if noise_std != "model" or recorded is None:
            raise ValueError(
                "bayes_classifier: expected noise_std='model' for a flow that records its training noise_std, "
                f"got {noise_std!r} for {type(flow).__name__} with noise_std={recorded!r}"
            )
        return float(recorded)
    if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not 0 <= noise_std < math.inf:
        raise ValueError(
            f"bayes_classifier: expected noise_std None, 'model' or a finite number >= 0, got {noise_std!r}"
        )
    return float(noise_std)


def bayes_classifier(
    flow: nn.Module,
    x: Tensor,
    num_classes: int,
    log_prior: Tensor | None = None,
    *,
    encoding: str | None = None,
    noise_std: float | str | None = None,
    draws: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Class posteriors :math:`\log p(y \mid x)` from a class-conditional flow, by Bayes' rule (``K`` passes).

    .. math:: \log p(y = k \mid x) = \log p(x \mid k) + \log \pi_k
              - \log \sum_j \exp\big(\log p(x \mid j) + \log \pi_j\big),

    with :math:`\log p(x \mid k)` the flow's ``log_prob(x, context=c_k)``. Score the inputs the way
    the flow was trained: a model trained on noise-augmented data :math:`x + \sigma\varepsilon`
    models noisy inputs, so pass ``noise_std="model"`` (the σ the flow records, e.g.
    ``TarFlow(noise_std=σ)``) or a σ: then :math:`\log p(x \mid k)` is the mean over ``draws``
    noise draws of :math:`\log p(x + \sigma\varepsilon_j \mid k)`, the same draws for every
    class. Scoring clean inputs with a noise-trained flow (``noise_std=None``) asks it about data
    it never saw.

    Args:
        flow: a class-conditional flow (``log_prob(x, context=...)``).
        x: data ``(*batch, *event_shape)``.
        num_classes: the number of classes ``K >= 2``.
        log_prior: log prior class probabilities ``(K,)`` (default uniform); normalised here.
        encoding: how a class is passed as the context: ``"index"`` (a float ``(*batch, 1)``
            holding ``k``, as :class:`~flows.TarFlow` takes it) or ``"one_hot"`` (``(*batch, K)``);
            default from the flow's ``context_features`` (1: index, ``K``: one-hot).
        noise_std: ``None`` (score ``x`` as given), ``"model"`` (the flow's recorded ``noise_std``)
            or a σ >= 0 to noise the inputs with.
        draws: the number of noise draws averaged (with a noise σ > 0).
        generator: the random generator of the noise draws (default: torch's global one).

    Returns:
        ``(*batch, K)`` log posterior probabilities (``exp`` sums to 1 over the last axis).

    Raises:
        ValueError: for ``K < 2``, a prior of the wrong shape or not finite, an encoding that
            cannot be inferred or is unknown, ``noise_std="model"`` for a flow that records no
            noise, a bad σ or a bad number of draws.

    Example:
        >>> import torch
        >>> from flows import TarFlow
        >>> flow = TarFlow(4, transforms=1, hidden=(8,), num_classes=3)
        >>> bayes_classifier(flow, torch.randn(5, 4), 3).exp().sum(-1)
        tensor([1.0000, 1.0000, 1.0000, 1.0000, 1.0000], grad_fn=<SumBackward1>)
    """
    check_count("bayes_classifier", "num_classes", num_classes, minimum=2)
    encoding = _encoding(flow, encoding, num_classes)
    sigma = _noise_level(flow, noise_std)
    check_count("bayes_classifier", "draws", draws)
    event = len(getattr(flow, "event_shape", ()))
    batch = x.shape[: x.dim() - event]
    contexts = [_class_context(batch, k, num_classes, encoding, x) for k in range(num_classes)]
    log_p = _class_log_likelihoods(flow, x, contexts, sigma, draws if sigma else 1, generator)
    if log_prior is not None:
        log_prior = torch.as_tensor(log_prior, dtype=log_p.dtype, device=log_p.device)
        if log_prior.shape != (num_classes,) or not torch.isfinite(log_prior).all():
            raise ValueError(
                f"bayes_classifier: expected a finite log_prior of shape ({num_classes},), got {tuple(log_prior.shape)}"
            )
        log_p = log_p + log_prior.log_softmax(-1)
    return log_p.log_softmax(-1)


def _encoding(flow: nn.Module, encoding: str | None, num_classes: int) -> str:
    """The class encoding: as given, or inferred from the flow's ``context_features`` (1: index, K: one-hot)."""
    if encoding is None:
        features = getattr(flow, "context_features", None)
        encoding = "index" if features == 1 else "one_hot" if features == num_classes else None
        if encoding is None:
            raise ValueError(
                f"bayes_classifier: expected a flow with context_features 1 (class index) or {num_classes} "
                f"(one-hot), got {features!r}; pass encoding="
            )
    if encoding not in ("index", "one_hot"):
        raise ValueError(f"bayes_classifier: expected encoding in ['index', 'one_hot'], got {encoding!r}")
    return encoding


def _class_log_likelihoods(
    flow: nn.Module, x: Tensor, contexts: list[Tensor], sigma: float, rounds: int, generator: torch.Generator | None
) -> Tensor:
    r""":math:`\log p(x \mid k)` per class, ``(*batch, K)``: the mean over ``rounds`` noise draws (shared)."""
    log_p = 0.0
    for _ in range(rounds):
        y = x
        if sigma:
            device = generator.device if generator is not None else x.device
            y = x + sigma * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=device).to(x.device)
        log_p = log_p + torch.stack([flow.log_prob(y, context=c) for c in contexts], dim=-1)
    return log_p / rounds
