r"""flows' builders as density estimators of `sbi <https://sbi-dev.github.io/sbi/>`_'s NPE and NLE.

``NPE(prior, density_estimator=builder("maf", transforms=5, hidden=(50, 50)))`` trains a flows
:class:`~flows.MAF` as the posterior estimator :math:`q(\theta \mid x)`; with
``estimate="likelihood"`` the same builder gives NLE's :math:`q(x \mid \theta)`. sbi calls the
returned function once with a batch of simulations ``(theta, x)``; it builds the flow for the
input (``theta`` for a posterior, ``x`` for a likelihood) conditioned on the other, and z-scores
both from that batch, as sbi's own builders do:

* the input through a :class:`~flows.bijections.Standardize` layer in front of the flow, so
  :math:`\log q(\theta \mid x) = \log q_{\text{flow}}((\theta - \mu)/\sigma \mid x) - \sum_i \log \sigma_i`
  stays a density in the data's units (and the statistics are buffers, saved with the weights);
* the condition by :math:`(x - \mu_x)/\sigma_x` before the (optional) embedding network.

``"independent"`` z-scores each dimension, ``"structured"`` uses one mean and one spread for all
dimensions (time series, images), ``"none"`` leaves the values alone. Statistics are computed on
the rows that are finite in both tensors.

References:
    Papamakarios, Murray (2016), "Fast ε-free Inference of Simulation Models with Bayesian
    Conditional Density Estimation", NeurIPS, arXiv:1605.06376.
    Tejero-Cantero, Boelts, Deistler, Lueckmann, Durkan, Gonçalves, Greenberg, Macke (2020),
    "sbi: A toolkit for simulation-based inference", JOSS 5(52), 2505.

Example:
    >>> import torch
    >>> from flows.interop.sbi import builder
    >>> build = builder("maf", transforms=1, hidden=(8,))
    >>> estimator = build(torch.randn(50, 2), torch.randn(50, 3))  # what NPE calls
    >>> estimator.input_shape, estimator.condition_shape
    (torch.Size([2]), torch.Size([3]))
    >>> estimator.sample((4,), torch.randn(1, 3)).shape
    torch.Size([4, 1, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from sbi.neural_nets.estimators.base import ConditionalDensityEstimator
from torch import Tensor, nn

from flows.architectures.registry import builders
from flows.bijections.standardize import Standardize
from flows.flow import Flow

__all__ = ["FlowEstimator", "builder"]

_Z_SCORES = ("independent", "structured", "none")
_ESTIMATES = ("posterior", "likelihood")


def _builder_name(model: str) -> str:
    names = list(builders())
    if not isinstance(model, str):
        raise TypeError(f"flows.interop.sbi.builder: expected a builder name (a str), got {type(model).__name__}")
    match = [n for n in names if n.lower() == model.lower()]
    if not match:
        raise ValueError(f"flows.interop.sbi.builder: expected one of {names} (any case), got {model!r}")
    return match[0]


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value is None:
        value = "none"
    if value not in choices:
        raise ValueError(f"flows.interop.sbi.builder: expected {name} to be one of {list(choices)}, got {value!r}")
    return value


def _statistics(batch: Tensor, rows: Tensor, how: str, what: str) -> tuple[Tensor, Tensor]:
    """Mean and spread of ``batch[rows]`` per dimension (``independent``) or over all (``structured``)."""
    event = batch.shape[1:]
    if how == "none":
        return torch.zeros(event, dtype=batch.dtype), torch.ones(event, dtype=batch.dtype)
    valid = batch[rows]
    if valid.shape[0] < 2:
        raise ValueError(
            f"flows.interop.sbi.builder: expected at least 2 finite rows of {what} to z-score, got {valid.shape[0]}"
        )
    if how == "structured":
        loc = valid.mean().expand(event)
        scale = valid.flatten(1).std(1).mean().expand(event)
    else:
        loc, scale = valid.mean(0), valid.std(0)
    return loc.clone(), scale.clamp_min(1e-7).clone()


class FlowEstimator(ConditionalDensityEstimator):
    """A conditional :class:`~flows.Flow` as sbi's ``ConditionalDensityEstimator``.

    Shapes follow sbi's contract: :meth:`log_prob` takes inputs ``(sample, batch, *input_shape)``
    or ``(batch, *input_shape)`` and conditions ``(batch, *condition_shape)`` (or with a sample
    dimension) and returns ``(sample, batch)``; :meth:`sample` returns
    ``(*sample_shape, batch, *input_shape)``; :meth:`loss` is the negative log-likelihood per row.

    Args:
        flow: a conditional flow over the (flattened) input with context width the embedded
            condition's.
        input_shape: the event shape of the input (``(D,)``).
        condition_shape: the event shape of the raw condition.
        condition_loc: the condition's z-score mean, ``condition_shape``.
        condition_scale: the condition's z-score spread, ``condition_shape``.
        embedding_net: applied to the z-scored condition (default: identity); its output is
            flattened into the flow's context.
    """

    def __init__(
        self,
        flow: Flow,
        input_shape: torch.Size,
        condition_shape: torch.Size,
        condition_loc: Tensor,
        condition_scale: Tensor,
        embedding_net: nn.Module | None = None,
    ) -> None:
        super().__init__(flow, input_shape, condition_shape)
        self._embedding_net = nn.Identity() if embedding_net is None else embedding_net
        self.register_buffer("condition_loc", condition_loc)
        self.register_buffer("condition_scale", condition_scale)

    @property
    def embedding_net(self) -> nn.Module:
        return self._embedding_net

    def _context(self, condition: Tensor) -> Tensor:
        """Z-scored, embedded and flattened conditions ``(*batch, C)`` from ``(*batch, *condition_shape)``."""
        self._check_condition_shape(condition)
        n = len(self.condition_shape)
        batch = condition.shape[: condition.dim() - n]
        flat = ((condition - self.condition_loc) / self.condition_scale).reshape(-1, *self.condition_shape)
        return self._embedding_net(flat).reshape(*batch, -1)

    def log_prob(self, input: Tensor, condition: Tensor, **kwargs: Any) -> Tensor:
        self._check_input_shape(input)
        self._check_condition_shape(condition)
        input, condition, _ = self._broadcast_and_align(input, condition)
        return self.net.log_prob(input, self._context(condition))

    def loss(self, input: Tensor, condition: Tensor, **kwargs: Any) -> Tensor:
        return -self.log_prob(input.unsqueeze(0), condition)[0]

    def sample(self, sample_shape: torch.Size, condition: Tensor, **kwargs: Any) -> Tensor:
        return self.net.sample(torch.Size(sample_shape), self._context(condition))

    def sample_and_log_prob(self, sample_shape: torch.Size, condition: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return self.net.sample_and_log_prob(torch.Size(sample_shape), self._context(condition))


def builder(
    model: str = "maf",
    *,
    estimate: str = "posterior",
    z_score_theta: str | None = "independent",
    z_score_x: str | None = "independent",
    embedding_net: nn.Module | None = None,
    **options: Any,
) -> Callable[[Tensor, Tensor], FlowEstimator]:
    """A ``density_estimator`` for sbi's ``NPE(...)`` (``estimate="posterior"``) or ``NLE(...)`` (``"likelihood"``).

    Args:
        model: a builder name of ``flows.architectures.registry.builders()`` (``"maf"``, ``"nsf"``,
            ``"RealNVP"``, ``"FFJORD"``, a :func:`~flows.train.register_model` name; any case),
            called as ``Builder(D, C, **options)`` with ``D`` the input's and ``C`` the embedded
            condition's width.
        estimate: ``"posterior"`` (input ``theta``, condition ``x``) or ``"likelihood"``
            (input ``x``, condition ``theta``).
        z_score_theta: ``"independent"``, ``"structured"`` or ``"none"``: z-scoring of ``theta``.
        z_score_x: the same for ``x``.
        embedding_net: a network applied to the (z-scored) condition, trained with the flow.
        **options: keyword options of the builder (``transforms``, ``hidden``, ``bins``, ...).

    Returns:
        ``build(batch_theta, batch_x) -> FlowEstimator``, the signature sbi calls.

    Raises:
        ValueError: for an unknown builder, estimate or z-score option (at once), and, when sbi
            calls the function, for inputs that are not vectors or batches of different sizes.
    """
    name = _builder_name(model)
    estimate = _check_choice("estimate", estimate, _ESTIMATES)
    z_theta = _check_choice("z_score_theta", z_score_theta, _Z_SCORES)
    z_x = _check_choice("z_score_x", z_score_x, _Z_SCORES)

    def build(batch_theta: Tensor, batch_x: Tensor) -> FlowEstimator:
        for what, batch in (("theta", batch_theta), ("x", batch_x)):
            if not isinstance(batch, Tensor) or not batch.is_floating_point() or batch.dim() < 2:
                raise ValueError(f"flows.interop.sbi: expected a float batch of {what} (N, ...), got {batch!r:.80}")
        if batch_theta.shape[0] != batch_x.shape[0]:
            raise ValueError(
                f"flows.interop.sbi: expected batches of theta and x of equal size, got {batch_theta.shape[0]} "
                f"and {batch_x.shape[0]}"
            )
        posterior = estimate == "posterior"
        inputs, conditions = (batch_theta, batch_x) if posterior else (batch_x, batch_theta)
        z_input, z_condition = (z_theta, z_x) if posterior else (z_x, z_theta)
        if inputs.dim() != 2:
            raise ValueError(
                f"flows.interop.sbi: expected vector inputs (N, D) for the {estimate}, got shape {tuple(inputs.shape)}"
            )
        rows = torch.isfinite(inputs.flatten(1)).all(1) & torch.isfinite(conditions.flatten(1)).all(1)
        loc, scale = _statistics(conditions, rows, z_condition, "the condition")
        net = nn.Identity() if embedding_net is None else embedding_net
        with torch.no_grad():
            width = net((conditions[:2] - loc) / scale).reshape(2, -1).shape[-1]
        flow = builders()[name](inputs.shape[1], width, **options)
        if not isinstance(flow, Flow):
            raise TypeError(f"flows.interop.sbi: expected builder {name!r} to build a Flow, got {type(flow).__name__}")
        if z_input != "none":
            mean, spread = _statistics(inputs, rows, z_input, "the input")
            flow.prepend(Standardize(inputs.shape[1], loc=mean, scale=spread))
        flow = flow.to(inputs.device)
        return FlowEstimator(flow, inputs.shape[1:], conditions.shape[1:], loc, scale, embedding_net).to(inputs.device)

    return build
