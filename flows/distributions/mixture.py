r"""A finite mixture of flows (or any densities with ``log_prob`` and ``sample_and_log_prob``): :class:`Mixture`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import as_sample_shape, check_count

__all__ = ["Mixture"]


def _sampler(component: nn.Module) -> Callable[[tuple[int, ...]], tuple[Tensor, Tensor]] | None:
    """A flow's ``sample_and_log_prob`` or a distribution's ``rsample_and_log_prob`` (``None``: neither)."""
    return getattr(component, "sample_and_log_prob", None) or getattr(component, "rsample_and_log_prob", None)


def _weights(weights: Sequence[float] | Tensor | None, k: int) -> list[float]:
    """``k`` finite positive weights as floats (``None``: equal), or a clear error naming what came."""
    if weights is None:
        return [1.0] * k
    try:
        w = torch.as_tensor(weights, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        w = None
    if w is None or w.shape != (k,):
        raise ValueError(f"Mixture: expected {k} weights (one per component), got {weights!r}")
    if not bool((torch.isfinite(w) & (w > 0)).all()):
        raise ValueError(f"Mixture: expected finite positive weights, got {w.tolist()}")
    return w.tolist()


class Mixture(nn.Module):
    r"""The mixture :math:`r(x) = \sum_k \pi_k\, q_k(x)` of densities with fixed weights, exact in its log-density.

    .. math:: \log r(x) = \operatorname{logsumexp}_k \big(\log \pi_k + \log q_k(x)\big).

    Drawing ``N`` samples draws the component counts from the multinomial
    :math:`(N; \pi_1, \dots, \pi_K)`, samples each component and returns the rows in random order
    with :math:`\log r` of each (every component's ``log_prob`` is evaluated on every row). Used as an
    importance-sampling proposal it is *stratified*: a component per mode of a multimodal target
    (a flow per metastable basin of a molecule, each trained where it is) gives weights
    :math:`e^{-u(x)} / r(x)` that are exact for the whole target, so a mode that holds little mass
    can be sampled more often than its mass (:math:`\pi_k > p_k`) and still be weighted correctly.

    References:
        Hesterberg (1995), "Weighted average importance sampling and defensive mixture
        distributions", Technometrics 37(2).
        Owen, Zhou (2000), "Safe and effective importance sampling", JASA 95(449) (mixture
        proposals, weighted by the whole mixture's density).

    Args:
        components: ``K >= 1`` modules with ``log_prob(x)`` and ``sample_and_log_prob(shape)`` (flows) or
            ``rsample_and_log_prob(shape)`` (base distributions) on the same event shape.
        weights: ``K`` positive weights, normalised here (``None``: equal weights).

    Raises:
        ValueError: for no component, a weight count that is not ``K``, a weight that is not a finite
            positive number, or components of different event shapes.
        TypeError: for a component that cannot be sampled with its log-density.

    Example:
        >>> import torch
        >>> from flows import DiagNormal
        >>> r = Mixture([DiagNormal(1), DiagNormal(1)], weights=[0.25, 0.75])
        >>> x, log_r = r.sample_and_log_prob((5,))
        >>> torch.allclose(log_r, r.log_prob(x))
        True
    """

    def __init__(self, components: Sequence[nn.Module], weights: Sequence[float] | Tensor | None = None) -> None:
        super().__init__()
        components = list(components)
        check_count("Mixture", "number of components", len(components))
        for k, c in enumerate(components):
            if not (isinstance(c, nn.Module) and hasattr(c, "log_prob") and _sampler(c) is not None):
                raise TypeError(
                    "Mixture: expected modules with log_prob and sample_and_log_prob (or rsample_and_log_prob), "
                    f"got {type(c).__name__} at {k}"
                )
        shapes = {tuple(getattr(c, "event_shape", ())) for c in components}
        if len(shapes) > 1:
            raise ValueError(f"Mixture: expected components of one event shape, got {sorted(shapes)}")
        raw = _weights(weights, len(components))
        self.components = nn.ModuleList(components)
        self.event_shape = torch.Size(shapes.pop())
        self.register_buffer("log_weights", torch.tensor(raw, dtype=torch.float64).log() - math.log(sum(raw)))

    @property
    def weights(self) -> Tensor:
        r"""The normalised weights :math:`\pi_k`, ``(K,)``."""
        return self.log_weights.exp()

    def component_log_probs(self, x: Tensor) -> Tensor:
        r"""Every component's :math:`\log \pi_k + \log q_k(x)`, shape ``(*batch, K)``."""
        terms = [c.log_prob(x) for c in self.components]
        return torch.stack(terms, -1) + self.log_weights.to(terms[0].dtype)

    def log_prob(self, x: Tensor) -> Tensor:
        r"""The exact log-density :math:`\log r(x)` of ``x`` (``(*batch, *event_shape)``), of shape ``batch``."""
        return torch.logsumexp(self.component_log_probs(x), -1)

    def responsibilities(self, x: Tensor) -> Tensor:
        r"""The posterior of the component, :math:`\pi_k q_k(x) / r(x)`, shape ``(*batch, K)``."""
        return torch.softmax(self.component_log_probs(x), -1)

    @torch.no_grad()
    def sample_and_log_prob(
        self, sample_shape: Sequence[int] | int = (), generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""Samples ``(*sample_shape, *event_shape)`` in random order and their exact :math:`\log r`.

        Args:
            sample_shape: the shape of the draw.
            generator: random generator of the component counts and the order (the components use
                the global one).

        Returns:
            ``(x, log_r)``.
        """
        shape = as_sample_shape(sample_shape)
        n = shape.numel()
        draw = torch.multinomial(self.weights.float(), n, replacement=True, generator=generator) if n else None
        counts = (
            torch.zeros(len(self.components), dtype=torch.long)
            if draw is None
            else torch.bincount(draw, minlength=len(self.components))
        )
        parts = [_sampler(c)((int(m),))[0] for c, m in zip(self.components, counts.tolist(), strict=True) if m > 0]
        x = torch.cat(parts) if parts else _sampler(self.components[0])((0,))[0]
        x = x[torch.randperm(n, generator=generator, device=x.device)] if n else x
        return x.reshape(*shape, *self.event_shape), self.log_prob(x).reshape(shape)

    @torch.no_grad()
    def sample(self, sample_shape: Sequence[int] | int = (), generator: torch.Generator | None = None) -> Tensor:
        """Samples ``(*sample_shape, *event_shape)`` (see :meth:`sample_and_log_prob`)."""
        return self.sample_and_log_prob(sample_shape, generator)[0]

    def extra_repr(self) -> str:
        return "weights=[" + ", ".join(f"{w:.4g}" for w in self.weights.tolist()) + "]"
