r"""Trainer objective for free-form injective flows: :class:`FreeFormInjectiveObjective`.

Training minimises the FIF surrogate loss (see
:class:`~flows.architectures.injective.FreeFormInjectiveFlow`); its value is not a likelihood, so
validation reports the **exact** objective on clean data instead:
:math:`\beta\,\|x - g(f(x))\|^2 - \log p(x)` with the exact on-manifold :math:`\log p`.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from flows._validation import check_objective_batch
from flows.train.batching import batch_size_of, split_batch
from flows.train.objectives import Objective

__all__ = ["FreeFormInjectiveObjective"]


class FreeFormInjectiveObjective(Objective):
    r"""The FIF loss for the trainer; validation with the exact on-manifold likelihood.

    Training: the mean of :meth:`~flows.architectures.injective.FreeFormInjectiveFlow.loss` over the
    batch (with the model's training noise), logging the metrics ``reconstruction`` and
    ``nll_surrogate``. Validation (:meth:`evaluate`, on clean data): ``loss`` =
    :math:`\beta\,\text{reconstruction} + \text{nll}`, ``reconstruction`` =
    :math:`\|x - g(f(x))\|^2` and ``nll`` = :math:`-\log p(x)` (exact, on the manifold), so that
    early stopping and checkpoints select on a real likelihood.

    References:
        Sorrenson, Draxler, Rousselot, Hummerich, Zimmermann, Köthe (2024), "Lifting Architectural
        Constraints of Injective Flows", ICLR, arXiv:2306.01843.

    Example:
        >>> import torch
        >>> from flows import FreeFormInjectiveFlow
        >>> from flows.train import Trainer
        >>> model = FreeFormInjectiveFlow(2, latent_features=1, hidden=(8,))
        >>> data = torch.randn(64, 2)
        >>> history = Trainer(model, FreeFormInjectiveObjective(), progress=False).fit(
        ...     data[:48], data[48:], epochs=1, batch_size=16
        ... )
        >>> sorted(k for k in history.last() if k.startswith("val_"))
        ['val_loss', 'val_nll', 'val_reconstruction']
    """

    def __call__(self, model: nn.Module, batch: object) -> tuple[Tensor, dict[str, Tensor]]:
        x, context = split_batch(batch)
        check_objective_batch(model, x, context, "FreeFormInjectiveObjective")  # as MaximumLikelihood's
        terms = model.loss_terms(x, context)
        metrics = {name: terms[name].detach().mean() for name in ("reconstruction", "nll_surrogate")}
        return terms["loss"].mean(), metrics

    def evaluate(self, model: nn.Module, batches: Iterable[object]) -> dict[str, float]:
        totals = {"loss": 0.0, "reconstruction": 0.0, "nll": 0.0}
        count = 0
        for batch in batches:
            x, context = split_batch(batch)
            reconstruction = (x - model.reconstruct(x, context)).square().sum(-1)
            nll = -model.log_prob(x, context)
            for name, value in (
                ("loss", model.beta * reconstruction + nll),
                ("reconstruction", reconstruction),
                ("nll", nll),
            ):
                totals[name] += float(value.detach().sum())
            count += batch_size_of(batch)
        return {name: total / count for name, total in totals.items()} if count else {}
