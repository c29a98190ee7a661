r"""Free-form injective flows (FIF): a manifold and a density on it from any encoder/decoder pair.

The model is a :class:`~flows.flow.Flow` whose transform is
``Chain(FreeFormInjective(encoder, decoder), *latent_bijections)``: ``log_prob`` is the exact
density on the decoder's manifold, ``sample`` decodes latent samples, and :meth:`FreeFormInjectiveFlow.loss`
is the FIF maximum-likelihood surrogate used for training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import check_builder, check_event, check_finite, check_like, check_nonnegative
from flows.architectures.registry import register
from flows.bijections.base import Chain
from flows.bijections.injective import FreeFormInjective
from flows.bijections.standardize import Standardize
from flows.distributions import StandardNormal
from flows.flow import Flow, _as_size

__all__ = ["FreeFormInjectiveFlow"]


@register
class FreeFormInjectiveFlow(Flow):
    r"""Free-form injective flow: an encoder/decoder pair, an optional latent flow, and the FIF loss.

    Density (exact, on the manifold :math:`g(\mathbb R^d)`, by :meth:`log_prob`):

    .. math:: \log p(x) = \log p_Z(z) - \tfrac12\log\det(J_g(z)^\top J_g(z)),\qquad z = f(x),

    where :math:`p_Z` is a standard normal or the density of a bijective ``latent`` flow on
    :math:`\mathbb R^d`. Sampling decodes latent samples, so samples lie exactly on the manifold.

    Training loss (by :meth:`loss`, per sample), on noisy data :math:`\tilde x = x + \sigma\varepsilon`:

    .. math:: \mathcal L = \beta\,\|\tilde x - g(f(\tilde x))\|^2 - \log p_Z(f(\tilde x))
              - v^\top J_f(\tilde x)\,\mathrm{SG}\big(J_g(f(\tilde x))\,v\big),

    with Hutchinson probes :math:`E[vv^\top] = I` (:func:`~flows.bijections.injective.orthogonal_probes`).
    The last term's gradient estimates that of the volume term (see
    :meth:`~flows.bijections.injective.FreeFormInjective.surrogate`); the encoder Jacobian is taken at
    the data point, which is what keeps the manifold's curvature in check. One training step costs
    about one encoder double-backward and one forward-mode decoder pass, instead of the O(d) passes
    and O(d³) of the exact volume term.

    References:
        Sorrenson, Draxler, Rousselot, Hummerich, Zimmermann, Köthe (2024), "Lifting Architectural
        Constraints of Injective Flows", ICLR, arXiv:2306.01843. Draxler, Sorrenson, Zimmermann,
        Rousselot, Köthe (2024), "Free-form Flows: Make Any Architecture a Normalizing Flow",
        AISTATS, arXiv:2310.16624.

    Args:
        features: data dimension ``D``.
        context: context width (0 for an unconditional model).
        latent_features: manifold dimension ``d`` (``1 ≤ d ≤ D``), required.
        latent: optional bijective :class:`~flows.flow.Flow` on ``R^d`` used as the latent density
            (its transform and base are adopted); a standard normal by default.
        encoder: network ``(*batch, D) -> (*batch, d)``; default an MLP.
        decoder: network ``(*batch, d) -> (*batch, D)``; default an MLP.
        hidden: hidden widths of the default MLPs.
        activation: nonlinearity of the default MLPs.
        beta: weight :math:`\beta` of the reconstruction term (10 in the paper's toy and tabular runs).
        noise_std: standard deviation :math:`\sigma` of the training noise (0.1 on toys, 0.01 on tabular).
        hutchinson_samples: number ``K ≤ d`` of orthogonal probes per sample.
        jvp: how the decoder JVP of the surrogate is computed (``"double_backward"`` or
            ``"forward"``; see :class:`~flows.bijections.injective.FreeFormInjective`).
        standardize: data ``(N, D)`` or a fitted :class:`~flows.bijections.Standardize` layer, put in
            front of the flow so that raw data is modelled in data units (see :class:`~flows.flow.Flow`).

    Example:
        >>> import torch
        >>> model = FreeFormInjectiveFlow(2, latent_features=1, hidden=(16,))
        >>> x = torch.randn(8, 2)
        >>> model.loss(x).mean().backward()  # one training step's gradient
        >>> model.log_prob(x).shape, model.sample((3,)).shape
        (torch.Size([8]), torch.Size([3, 2]))
    """

    #: Trained by the FIF surrogate (``flows.train.FreeFormInjectiveObjective``), not by maximum likelihood.
    likelihood_trainable = False

    def __init__(
        self,
        features: int,
        context: int = 0,
        *,
        latent_features: int,
        latent: Flow | None = None,
        encoder: nn.Module | None = None,
        decoder: nn.Module | None = None,
        hidden: Sequence[int] = (256, 256),
        activation: Callable[[], nn.Module] = nn.SiLU,
        beta: float = 10.0,
        noise_std: float = 0.01,
        hutchinson_samples: int = 1,
        jvp: str = "double_backward",
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        name = type(self).__name__
        check_builder(name, features, context, hidden=hidden, activation=activation)
        beta, noise_std = check_nonnegative(name, "beta", beta), check_nonnegative(name, "noise_std", noise_std)
        if isinstance(latent_features, int) and not (
            isinstance(hutchinson_samples, int) and 1 <= hutchinson_samples <= latent_features
        ):
            raise ValueError(
                f"{name}: expected 1 <= hutchinson_samples <= latent_features = {latent_features}, "
                f"got {hutchinson_samples!r}"
            )
        injective = FreeFormInjective(
            features,
            latent_features,
            context,
            encoder=encoder,
            decoder=decoder,
            hidden=hidden,
            activation=activation,
            jvp=jvp,
        )
        if latent is None:
            transform, base = Chain(injective), StandardNormal(latent_features)
        else:
            if not isinstance(latent, Flow):
                raise TypeError(
                    f"{name}: expected latent to be a Flow on R^{latent_features}, got {type(latent).__name__}"
                )
            if tuple(latent.event_shape) != (latent_features,):
                raise ValueError(
                    f"{name}: expected a latent flow with event shape ({latent_features},), "
                    f"got {tuple(latent.event_shape)}"
                )
            transform, base = Chain(injective, latent.transform), latent.base
        super().__init__(transform, base, context=context, standardize=standardize)
        self.beta, self.noise_std, self.hutchinson_samples = beta, noise_std, hutchinson_samples

    @property
    def injective(self) -> FreeFormInjective:
        """The encoder/decoder pair (first member of the builder's transform, after any preprocessing)."""
        return self.core[0]

    def _latent_log_prob(self, z: Tensor, context: Tensor | None) -> Tensor:
        """Exact log-density of the latent (bijective) part at ``z``."""
        if len(self.core) == 1:
            return self.base.log_prob(z, context)
        u, ladj = self.core[1].forward_and_log_det(z, context)
        return self.base.log_prob(u, context) + ladj

    def _preprocess(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        """The :attr:`preprocessing` layers (e.g. ``standardize=``) and their log-determinant (0 without)."""
        if not self.preprocessing:
            return x, x.new_zeros(x.shape[:-1])
        return self.transform[: len(self.preprocessing)].forward_and_log_det(x, context)

    def _postprocess(self, x: Tensor, context: Tensor | None) -> Tensor:
        for layer in reversed(list(self.transform)[: len(self.preprocessing)]):
            x = layer.inverse(x, context)
        return x

    def _check_input(self, x: Tensor, context: Tensor | None) -> None:
        name = type(self).__name__
        check_event(x, self.event_shape, name)
        check_like(x, self._anchor, name)
        if self.check_finite:
            check_finite(x, name)
        self._check_context(context)

    def loss_terms(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        noise_std: float | None = None,
        generator: torch.Generator | None = None,
    ) -> dict[str, Tensor]:
        r"""The FIF training loss and its parts, per sample (each of shape ``batch``).

        Args:
            x: data ``(*batch, D)``.
            context: context ``(*batch, context_features)`` or ``None``.
            noise_std: override the configured training noise (e.g. 0 to evaluate the loss on clean data).
            generator: random generator for the noise and the probes.

        Returns:
            ``"loss"`` (β·reconstruction + surrogate NLL, the quantity to minimise),
            ``"reconstruction"`` (:math:`\|\tilde x - g(f(\tilde x))\|^2`), ``"nll_surrogate"``
            (:math:`-\log p_Z(z) - \text{surrogate}`, not an NLL value: only its gradient is
            meaningful), ``"log_prob_latent"`` and ``"surrogate"``.
        """
        self._check_input(x, context)
        x, ladj_pre = self._preprocess(x, context)
        sigma = self.noise_std if noise_std is None else float(noise_std)
        if sigma > 0:
            x = x + sigma * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        z, x_rec, surrogate = self.injective.surrogate(x, context, samples=self.hutchinson_samples, generator=generator)
        log_pz = self._latent_log_prob(z, context) + ladj_pre
        reconstruction = (x - x_rec).square().sum(-1)
        nll = -log_pz - surrogate
        return {
            "loss": self.beta * reconstruction + nll,
            "reconstruction": reconstruction,
            "nll_surrogate": nll,
            "log_prob_latent": log_pz,
            "surrogate": surrogate,
        }

    def loss(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        noise_std: float | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """The per-sample FIF training loss (shape ``batch``); see :meth:`loss_terms`."""
        return self.loss_terms(x, context, noise_std=noise_std, generator=generator)["loss"]

    def encode(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Manifold coordinates ``z = f(x)`` (``(*batch, d)``)."""
        self._check_input(x, context)
        return self.injective.encode(self._preprocess(x, context)[0], context)

    def reconstruct(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """``g(f(x))``: the point of the manifold that ``x`` is mapped to (``(*batch, D)``)."""
        self._check_input(x, context)
        u = self._preprocess(x, context)[0]
        return self._postprocess(self.injective.decode(self.injective.encode(u, context), context), context)

    def rsample(self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None) -> Tensor:
        """Differentiable samples on the manifold (decodes latent samples; no Jacobian is formed)."""
        self._check_context(context)
        shape = _as_size(sample_shape)
        z = self.base.rsample(shape, context)
        latent_context = self._latent_context(shape, context)
        if len(self.core) > 1:
            z = self.core[1].inverse(z, latent_context)
        return self._postprocess(self.injective.decode(z, latent_context), latent_context)

    def extra_repr(self) -> str:
        return f"beta={self.beta:g}, noise_std={self.noise_std:g}, hutchinson_samples={self.hutchinson_samples}"
