r"""Training objectives: what the :class:`~flows.train.Trainer` minimises, one batch at a time.

An objective is the extension point of the trainer, and this is its whole protocol. A training
step makes **one call** into it::

    out = objective(model, batch)    # out: loss, or (loss, metrics)

* ``model``: the model being trained (an ``nn.Module``, in training mode);
* ``batch``: one batch on the model's device, as the data yields it (:mod:`flows.train.batching`
  only shards, shuffles and moves it): ``(x,)`` or ``(x, context)`` from tensor data or a
  :class:`~flows.data.TensorLoader`, with ``x`` of shape ``(B, *event_shape)`` and ``context``
  of shape ``(B, context_features)`` (:func:`split_batch` unpacks both forms, a bare tensor
  too); ``(z, x)`` or ``(z, x, context)`` pairs for :class:`~flows.train.PairRegression`;
  whatever another iterable yields; or ``None`` for objectives that need no data (reverse KL
  on an energy target draws its own samples from the model);
* ``loss``: a scalar tensor (shape ``()``) to minimise, attached to the graph of the model's
  parameters, normally a mean over the batch;
* ``metrics`` (optional): a dict ``{name: value}`` of scalar tensors or numbers to log, detached
  (the trainer averages them over the epoch, weighted by :func:`batch_size_of`, and logs them
  beside ``loss``; validation logs them as ``val_<name>``).

Everything else (auxiliary losses of the model's layers, ``backward``, clipping, the optimizer
step, the NaN guard, gradient averaging across processes, ``torch.compile``) is the trainer's.
Any callable with that signature is an objective; :func:`objective_output` is how the trainer
reads what it returns. Validation calls, when the objective has it,

* ``objective.evaluate(model, batches) -> {name: value}`` with ``batches`` an iterable of batches
  as above (or ``[None]`` for objectives without data), inside ``flows.evaluating(model)`` and
  ``torch.no_grad()``. :meth:`Objective.evaluate`, the default, averages the training loss and
  metrics over the batches, weighted by their sizes.

Objectives that sample or dequantize use the global torch random generator, which checkpoints
save and restore.

:class:`MaximumLikelihood` is forward KL on data; :class:`WeightedSum` mixes objectives (e.g.
maximum likelihood with a reverse-KL objective from :mod:`flows.train.energy`).

Example:
    >>> import torch
    >>> from flows import Affine, Flow, StandardNormal
    >>> def mean_squared_latent(model, batch):  # a custom objective: any callable (model, batch)
    ...     z = model.transform(batch[0])
    ...     return z.square().mean(), {"z_max": z.detach().abs().max()}
    >>> loss, metrics = objective_output(mean_squared_latent(Flow(Affine(2), StandardNormal(2)), (torch.ones(4, 2),)))
    >>> loss.item(), sorted(metrics)
    (1.0, ['z_max'])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import SEED_MAX, check_count, check_objective_batch
from flows.bijections.base import inside, is_real
from flows.data.dequantization import uniform_dequantize
from flows.metrics.density import bits_per_dim
from flows.train.batching import batch_size_of, split_batch

__all__ = [
    "MaximumLikelihood",
    "Objective",
    "ObjectiveOutput",
    "WeightedSum",
    "batch_size_of",
    "objective_output",
    "split_batch",
]

ObjectiveOutput = Tensor | tuple[Tensor, dict[str, Tensor]]
"""What an objective returns: the loss, or ``(loss, metrics)``."""


def _check_in_support(model: nn.Module, x: Tensor, who: str) -> None:
    """Refuse a batch ``(N, *event)`` with rows outside a bounded model's ``support``, naming the first.

    A bounded flow's ``log_prob`` is ``-inf`` there (the right density); as a training loss that
    is a data error, which a clear message serves better than a step the trainer's guard drops.
    """
    support = getattr(model, "support", None)
    if support is None or is_real(support) or x.dim() < 1:
        return
    outside = ~inside(support, x, x.dim() - 1)
    if bool(outside.any()):
        row = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"{who}: expected data inside the model's support {support} (the domain of its data-side layer), "
            f"got row {row} outside it, where the model's log-density is -inf"
        )


def objective_output(out: object) -> tuple[Tensor, dict[str, Tensor]]:
    """``(loss, metrics)`` from what an objective returned (``loss`` alone means no metrics).

    Raises:
        TypeError: for anything but a one-element loss tensor or a ``(loss, dict)`` pair.
    """
    if isinstance(out, Tensor):
        loss, metrics = out, {}
    elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor) and isinstance(out[1], dict):
        loss, metrics = out
    else:
        raise TypeError(f"expected an objective to return a loss tensor or (loss, metrics), got {type(out).__name__}")
    if loss.numel() != 1:
        raise TypeError(f"expected an objective to return a scalar loss (shape ()), got shape {tuple(loss.shape)}")
    return loss, metrics


class Objective:
    """Base class of training objectives (see the module docstring for the protocol).

    Subclasses implement :meth:`__call__`; override :meth:`evaluate` for a validation measure that
    is not the average training loss. Objectives may be :class:`torch.nn.Module` subclasses too
    (their parameters are then not optimised unless passed to the optimizer).
    """

    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:
        """Loss of one batch (a scalar tensor), optionally with a dict of scalar metrics."""
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")

    def evaluate(self, model: nn.Module, batches: Iterable[object]) -> dict[str, float]:
        """Validation measures, by default the sample-weighted means of the loss and metrics.

        Called by the trainer inside ``flows.evaluating(model)`` and ``torch.no_grad()``.
        """
        totals: dict[str, float] = {}
        count = 0
        for batch in batches:
            loss, metrics = objective_output(self(model, batch))
            n = batch_size_of(batch)
            for name, value in {"loss": loss, **metrics}.items():
                totals[name] = totals.get(name, 0.0) + float(value) * n
            count += n
        if count == 0:
            return {}
        return {name: total / count for name, total in totals.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MaximumLikelihood(Objective):
    r"""Maximum likelihood (forward KL) on data: :math:`L = -\frac1B \sum_b \log p(x_b \mid c_b)`.

    With ``levels`` set, the batch holds integer data in ``0..levels-1`` (pixels, counts); it is
    uniformly dequantized, :math:`x = (v + u)/K`, and the metric ``bits_per_dim`` reports the
    dequantization bound :math:`-(\log p(x) - D\log K)/(D \ln 2)`. Validation draws the noise from
    a fixed seed so that successive validations are comparable.

    References:
        Papamakarios, Nalisnick, Rezende, Mohamed, Lakshminarayanan (2021), "Normalizing Flows for
        Probabilistic Modeling and Inference", JMLR, arXiv:1912.02762 (Section 2.3.1).
        Theis, van den Oord, Bethge (2016), "A note on the evaluation of generative models", ICLR,
        arXiv:1511.01844 (dequantization).

    With ``noise_std = σ`` (or, when not given, the ``noise_std`` the model records, as
    :class:`~flows.TarFlow` does), every batch is noise-augmented, :math:`x \leftarrow x + \sigma
    \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, I)`, after any dequantization: the flow
    then models the noised density :math:`p * \mathcal N(0, \sigma^2 I)` (TarFlow's training;
    denoise samples with :func:`flows.tweedie_denoise`). Validation noises with the fixed seed too.

    Args:
        levels: number of discrete levels ``K`` of integer data (``None`` for continuous data).
        eval_seed: seed of the dequantization noise during :meth:`evaluate`.
        noise_std: Gaussian noise augmentation σ >= 0 (``None``: the model's ``noise_std``, if any).

    Raises:
        ValueError: when called, for a batch without rows or without its batch dimension, a context
            given to a model that takes none (:func:`flows._validation.check_objective_batch`), and
            whatever the model's ``log_prob`` refuses (for a :class:`~flows.Flow`: a wrong event
            shape, NaN/Inf values with the first bad row named, a missing or non-finite context),
            and rows outside a bounded model's ``support`` (where ``log_prob`` is ``-inf``).
        TypeError: for integer data without ``levels``, or what ``log_prob`` refuses (an integer
            context, another dtype).

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> flow = Flow(Affine(2), StandardNormal(2))
        >>> loss = MaximumLikelihood()(flow, (torch.zeros(4, 2),))
        >>> round(loss.item(), 4)  # -log N(0; 0, I) in 2-D = log(2π)
        1.8379
    """

    def __init__(self, *, levels: int | None = None, eval_seed: int = 0, noise_std: float | None = None) -> None:
        if levels is not None and (not isinstance(levels, int) or levels < 2):
            raise ValueError(f"MaximumLikelihood: expected levels to be an int >= 2 or None, got {levels!r}")
        if noise_std is not None and (
            isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not 0 <= noise_std < math.inf
        ):
            raise ValueError(
                f"MaximumLikelihood: expected noise_std to be a finite number >= 0 or None, got {noise_std!r}"
            )
        self.levels = levels
        self.eval_seed = check_count("MaximumLikelihood", "eval_seed", eval_seed, minimum=None, maximum=SEED_MAX)
        self.noise_std = noise_std

    def _noise(self, model: nn.Module) -> float:
        sigma = self.noise_std if self.noise_std is not None else getattr(model, "noise_std", None)
        return float(sigma or 0.0)

    def _inputs(self, model: nn.Module, batch: object) -> tuple[Tensor, Tensor | None]:
        x, context = split_batch(batch)
        check_objective_batch(model, x, context, type(self).__name__)
        if self.levels is not None:
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
            x = uniform_dequantize(x, self.levels, dtype=dtype)
        elif not x.is_floating_point():
            raise TypeError(
                f"MaximumLikelihood: expected floating-point data, got dtype {x.dtype}; "
                "for integer data pass levels=K to dequantize it"
            )
        sigma = self._noise(model)
        if sigma:
            x = x + sigma * torch.randn_like(x)
        _check_in_support(model, x, type(self).__name__)
        return x, context

    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:
        x, context = self._inputs(model, batch)
        log_p = model.log_prob(x, context) if context is not None else model.log_prob(x)
        loss = -log_p.mean()
        if self.levels is None:
            return loss
        dims = math.prod(x.shape[1:])
        return loss, {"bits_per_dim": bits_per_dim(-loss.detach(), dims, self.levels)}

    def evaluate(self, model: nn.Module, batches: Iterable[object]) -> dict[str, float]:
        if self.levels is None and not self._noise(model):
            return super().evaluate(model, batches)
        devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.eval_seed)
            return super().evaluate(model, batches)

    def __repr__(self) -> str:
        noise = "" if self.noise_std is None else f", noise_std={self.noise_std}"
        return f"MaximumLikelihood(levels={self.levels}{noise})"


class WeightedSum(Objective):
    r"""A weighted mixture of objectives on the same batch: :math:`L = \sum_k w_k L_k`.

    Every term's loss is also logged as a metric named ``"{name}_loss"`` (and its own metrics as
    ``"{name}_{metric}"``), where ``name`` is given or the term's class name in lower case.

    Args:
        terms: ``(weight, objective)`` or ``(weight, objective, name)`` tuples.

    Example:
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> flow = Flow(Affine(2), StandardNormal(2))
        >>> mix = WeightedSum([(0.5, MaximumLikelihood(), "a"), (0.5, MaximumLikelihood(), "b")])
        >>> loss, metrics = mix(flow, (torch.zeros(4, 2),))
        >>> round(loss.item(), 4), sorted(metrics)
        (1.8379, ['a_loss', 'b_loss'])
    """

    def __init__(self, terms: Sequence[tuple]) -> None:
        if not terms:
            raise ValueError("WeightedSum: expected at least one (weight, objective) term, got none")
        self.terms: list[tuple[float, Objective, str]] = []
        for term in terms:
            if not isinstance(term, tuple) or len(term) not in (2, 3) or not callable(term[1]):
                raise TypeError(f"WeightedSum: expected (weight, objective[, name]) tuples, got {term!r}")
            name = term[2] if len(term) == 3 else type(term[1]).__name__.lower()
            self.terms.append((float(term[0]), term[1], name))
        names = [name for _, _, name in self.terms]
        if len(set(names)) != len(names):
            raise ValueError(f"WeightedSum: expected distinct term names, got {names}; pass names explicitly")

    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:
        total: Tensor | None = None
        logged: dict[str, Tensor] = {}
        for weight, objective, name in self.terms:
            loss, metrics = objective_output(objective(model, batch))
            total = weight * loss if total is None else total + weight * loss
            logged[f"{name}_loss"] = loss.detach()
            logged.update({f"{name}_{key}": value for key, value in metrics.items()})
        return total, logged

    def __repr__(self) -> str:
        inner = ", ".join(f"({w}, {o!r}, {n!r})" for w, o, n in self.terms)
        return f"WeightedSum([{inner}])"
