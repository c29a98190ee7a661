r"""A flow as a Pyro distribution: :class:`PyroFlowDistribution` and :func:`distribution`.

``pyro.sample`` needs Pyro's ``TorchDistributionMixin`` (``__call__``, ``expand_by``,
``to_event``, ``mask``); :class:`PyroFlowDistribution` is a :class:`~flows.FlowDistribution` with
it, so a flow works wherever Pyro takes a distribution:

* as an SVI guide (register the flow's parameters with ``pyro.module(name, flow)``; the samples
  are reparameterised, so ``Trace_ELBO`` differentiates through them);
* as a prior under ``NUTS``/``HMC``: Pyro maps the site to the real space with
  ``biject_to(d.support)``, and ``support`` is the flow's (the unit interval behind a sigmoid
  layer), so a bounded flow is sampled inside its support;
* as a likelihood, ``pyro.sample("x", distribution(flow, theta), obs=x)`` for a conditional flow
  (the batch shape is the context's, so it sits inside ``pyro.plate``);
* under ``pyro.infer.Predictive``.

Pyro is imported by this module only: ``import flows`` does not import it.

Example:
    >>> import pyro, torch
    >>> import flows
    >>> from flows.interop.pyro import distribution
    >>> flow = flows.MAF(2, transforms=1, hidden=(8,))
    >>> def guide():
    ...     pyro.module("flow", flow)
    ...     return pyro.sample("w", distribution(flow))
    >>> guide().shape
    torch.Size([2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyro.distributions.torch_distribution import TorchDistributionMixin
from torch import Tensor

from flows.flow import Flow, FlowDistribution

__all__ = ["PyroFlowDistribution", "distribution"]


class PyroFlowDistribution(FlowDistribution, TorchDistributionMixin):
    """A :class:`~flows.FlowDistribution` that Pyro accepts at ``pyro.sample`` sites.

    Same arguments, shapes and methods as :class:`~flows.FlowDistribution` (``sample``,
    ``rsample``, ``log_prob``, ``support``, ``batch_shape``, ``event_shape``); ``expand`` (which
    ``pyro.plate`` calls) returns a :class:`PyroFlowDistribution` again.

    Args:
        flow: the flow.
        context: ``(*batch, context_features)`` for a conditional flow, or ``None``.
    """

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> PyroFlowDistribution:
        expanded = super().expand(batch_shape)
        return PyroFlowDistribution(expanded.flow, expanded.context, batch_shape=expanded.batch_shape)


def distribution(flow: Flow, context: Tensor | None = None) -> PyroFlowDistribution:
    """``flow(context)`` as a Pyro distribution (``flow()`` for an unconditional flow).

    Args:
        flow: the flow; in a guide, register it with ``pyro.module(name, flow)`` first.
        context: ``(*batch, context_features)`` for a conditional flow, or ``None``.

    Returns:
        a :class:`PyroFlowDistribution` sharing the flow's parameters.
    """
    return PyroFlowDistribution(flow, context)
