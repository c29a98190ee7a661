r"""Glow: a multi-scale image flow of ActNorm, invertible channel mixing and affine couplings.

How the multi-scale latent fits the :class:`~flows.flow.Flow` contract: the transform maps an image
to **one flat latent vector** of ``C·H·W`` entries (the factored-out channels of every level, then the
last level, see :class:`~flows.bijections.multiscale.Split`), and the base is a standard normal on
that vector. Glow's learned conditional prior of each factored-out half :math:`z_o` given the kept
half :math:`h` is an affine coupling placed just before the split,
:math:`\varepsilon = (z_o - \mu(h)) \odot e^{-\log\sigma(h)}`, with :math:`\mu, \log\sigma` from a
zero-initialised convolution of :math:`h`. Then

.. math:: \log \mathcal N(z_o; \mu(h), \sigma(h)^2) = \log \mathcal N(\varepsilon; 0, I) - \sum \log\sigma(h),

so the standard normal base plus that coupling's log-determinant *is* Glow's conditional prior,
exactly. ``log_prob``, ``sample`` and ``sample_and_log_prob`` are the ordinary :class:`Flow` methods
and agree exactly; sampling at a temperature :math:`T` scales the base sample by :math:`T`, which
is Glow's :math:`z_o = \mu + T \sigma \varepsilon` at every level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from flows._validation import (
    as_sample_shape,
    check_activation,
    check_choice,
    check_count,
    check_hidden,
    check_number,
    under_vmap,
)
from flows.architectures.registry import register
from flows.bijections.base import Bijection, Chain
from flows.bijections.circulant import CirculantDiagonal2d
from flows.bijections.conv import Invertible1x1Conv
from flows.bijections.coupling import AdditiveCoupling, AffineCoupling, Coupling, half_mask
from flows.bijections.eiw import EIWShuffle
from flows.bijections.elementwise import Logit
from flows.bijections.multiscale import Flatten, Split, Squeeze
from flows.bijections.normalization import ActNorm2d
from flows.bijections.standardize import Standardize
from flows.bijections.transformers import AffineTransformer
from flows.distributions import StandardNormal
from flows.flow import Flow
from flows.nn import ConvNet
from flows.nn.sharing import StepConditioner

__all__ = ["Glow"]

MIXERS = ("1x1", "lu", "circulant")
SPLITS = ("static", "eiw")
COUPLINGS = ("affine", "additive")


@register
class Glow(Flow):
    r"""Glow for ``(C, H, W)`` images: ``scales`` × (squeeze → ``steps`` × step → [EIW shuffle] → split).

    One **step** is ActNorm → channel mixer → coupling:

    * :class:`~flows.bijections.normalization.ActNorm2d` (data-dependent initialisation on the first
      training batch);
    * the mixer: ``"1x1"`` an :class:`~flows.bijections.conv.Invertible1x1Conv` (dense),
      ``"lu"`` the same with the LU parameterisation, ``"circulant"`` a
      :class:`~flows.bijections.circulant.CirculantDiagonal2d` (CDFlow) with ``circulant_factors``
      diagonal factors, a random orthogonal start and no bias;
    * an affine (or additive) coupling of the second half of the channels given the first half,
      with a :class:`~flows.nn.ConvNet` conditioner (``kernel_size`` convolutions first and last,
      1×1 ones between, ``hidden`` channels, zero-initialised output).

    Each level except the last ends with Glow's learned conditional prior (an affine coupling of
    the factored-out half given the kept half, from one zero-initialised 3×3 convolution, see the
    module docstring) and a :class:`~flows.bijections.multiscale.Split` that factors out the last
    ``C - C // 2`` channels. With ``split="eiw"`` an
    :class:`~flows.bijections.eiw.EIWShuffle` (our formulation of Chen et al.'s entropy-informed
    weighting and shuffle) comes before the prior, so that the most Gaussian channels are the ones
    factored out; its regulariser reaches trainers through :mod:`flows.bijections.auxiliary`. The last level
    ends with a per-channel ActNorm (Glow's learned top prior). The data side starts with a
    :class:`~flows.bijections.elementwise.Logit` (``logit_alpha``) for data in ``[0, 1]``
    (dequantized images); its log-determinant is part of ``log_prob``, so
    :func:`flows.metrics.bits_per_dim` of ``log_prob`` is exact.

    Direction: ``log_prob(x) = log N(f(x); 0, I) + log|det J_f(x)|`` with ``f`` the transform
    (image → flat latent of ``C·H·W`` entries); sampling runs ``f⁻¹``.

    Args:
        shape: the image shape ``(C, H, W)``; ``H`` and ``W`` divisible by ``2**scales``.
        context: width of a vector context (e.g. one-hot classes) fed to every conditioner (0 = none).
        scales: number of scales ``L`` (levels of the multi-scale architecture).
        steps: flow steps ``K`` per level.
        hidden: channels of the hidden layers of each coupling network, one entry per hidden layer
            (the default ``(128, 128)`` is Glow's 3×3 → 1×1 → 3×3 network).
        mixer: ``"1x1"``, ``"lu"`` or ``"circulant"``.
        split: ``"static"`` (Glow: keep the first half) or ``"eiw"`` (EIW shuffle before each split).
        coupling: ``"affine"`` (Glow) or ``"additive"`` (NICE-style, volume preserving).
        logit_alpha: ``alpha`` of the logit preprocessing, or ``None`` for inputs on the real line.
            The default 1e-6 spreads the many near-0 pixels of digit images over a wide logit
            interval; RealNVP's 0.05 squeezes them into a narrow spike that is hard to model
            (measured in ``docs/images.md``, "Training tips").
        clamp: bound on the absolute log-scales of the couplings and priors.
        kernel_size: kernel of the first and last convolutions of the coupling networks.
        activation: nonlinearity of the coupling networks.
        circulant_factors: number ``m`` of diagonal factors of the circulant mixer.
        eiw_hidden: hidden widths of the EIW weight networks.
        eiw_regularization: weight of the EIW regulariser (see :class:`~flows.bijections.eiw.EIWShuffle`).
        eiw_momentum, eiw_margin, eiw_update_steps: see :class:`~flows.bijections.eiw.EntropyPermutation`.
        share_conditioner: NanoFlow parameter sharing (:mod:`flows.nn.sharing`): one coupling network
            per level shared by all its steps, each step with a learned ``(embedding, H, W)``
            flow-indication map (extra input channels) and a per-channel output gate.
        embedding: channels of the per-step embedding map when sharing.
        standardize: data ``(N, C, H, W)`` to fit a :class:`~flows.bijections.Standardize` layer on (or a
            fitted layer), put in front of the flow so that raw data is modelled in data units (see
            :class:`~flows.flow.Flow`).

    Raises:
        ValueError: for a shape that cannot be squeezed ``scales`` times, or an unknown option.

    References:
        Kingma, Dhariwal (2018), "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS,
        arXiv:1807.03039. Dinh, Sohl-Dickstein, Bengio (2017), "Density estimation using Real NVP",
        ICLR, arXiv:1605.08803. Chen, Du, Li, Zeng, Paisley (2025), "Entropy-Informed Weighting
        Channel Normalizing Flow for Deep Generative Models", Pattern Recognition, arXiv:2407.04958.

    Example:
        >>> import torch
        >>> flow = Glow((1, 8, 8), scales=2, steps=2, hidden=(16, 16))
        >>> x = torch.rand(5, 1, 8, 8)
        >>> flow.log_prob(x).shape, flow.sample((3,)).shape
        (torch.Size([5]), torch.Size([3, 1, 8, 8]))
        >>> samples, log_p = flow.sample_and_log_prob((4,))
        >>> torch.allclose(log_p, flow.log_prob(samples), atol=1e-3)
        True
    """

    def __init__(
        self,
        shape: Sequence[int],
        context: int = 0,
        *,
        scales: int = 2,
        steps: int = 8,
        hidden: Sequence[int] = (128, 128),
        mixer: str = "1x1",
        split: str = "static",
        coupling: str = "affine",
        logit_alpha: float | None = 1e-6,
        clamp: float = 3.0,
        kernel_size: int = 3,
        activation: Callable[[], nn.Module] = nn.ReLU,
        circulant_factors: int = 2,
        eiw_hidden: Sequence[int] = (32,),
        eiw_regularization: float = 0.01,
        eiw_momentum: float = 0.05,
        eiw_margin: float = 0.1,
        eiw_update_steps: int | None = None,
        share_conditioner: bool = False,
        embedding: int = 8,
        standardize: Tensor | Standardize | None = None,
    ) -> None:
        shape = tuple(shape)
        if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError(f"Glow: expected an image shape (C, H, W) of positive ints, got {shape}")
        check_count("Glow", "context", context, minimum=0)
        scales, steps = check_count("Glow", "scales", scales), check_count("Glow", "steps", steps)
        hidden = check_hidden("Glow", hidden)
        check_activation("Glow", activation)
        _, height, width = shape
        if height % 2**scales or width % 2**scales:
            raise ValueError(
                f"Glow: expected height and width divisible by 2**scales = {2**scales}, got {height}×{width}"
            )
        check_choice("Glow", "mixer", mixer, MIXERS)
        check_choice("Glow", "split", split, SPLITS)
        check_choice("Glow", "coupling", coupling, COUPLINGS)
        self.scales, self.steps, self.hidden = scales, steps, hidden
        self.mixer, self.split, self.coupling = mixer, split, coupling
        options = {
            "context": context,
            "hidden": hidden,
            "clamp": clamp,
            "kernel_size": kernel_size,
            "activation": activation,
            "circulant_factors": circulant_factors,
            "share": share_conditioner,
            "embedding": embedding,
            "eiw": {
                "hidden": tuple(eiw_hidden),
                "regularization": eiw_regularization,
                "momentum": eiw_momentum,
                "margin": eiw_margin,
                "update_steps": eiw_update_steps,
            },
        }
        if standardize is not None and logit_alpha is not None:
            raise ValueError(
                "Glow: expected logit_alpha=None with standardize (the logit is the preprocessing of images in "
                f"[0, 1]; standardisation replaces it for data on the real line), got logit_alpha={logit_alpha}"
            )
        body = self._level(shape, 0, options)
        self.logit_alpha = logit_alpha
        self.image_shape = shape
        if logit_alpha is None:
            transform = body
        else:
            transform = Chain(Logit(shape, alpha=logit_alpha), body)
        super().__init__(transform, StandardNormal(transform.event_shape_out), context=context, standardize=standardize)

    def _mixer(self, channels: int, options: dict) -> Bijection:
        if self.mixer == "1x1":
            return Invertible1x1Conv(channels)
        if self.mixer == "lu":
            return Invertible1x1Conv(channels, lu=True)
        # Like the 1×1 convolution: a random orthogonal start that mixes all channels, no bias (ActNorm has one).
        return CirculantDiagonal2d(channels, factors=options["circulant_factors"], init="orthogonal", bias=False)

    def _coupling_net(self, channels: int, options: dict, extra_inputs: int = 0) -> ConvNet:
        n_kept = channels // 2
        params = 2 if self.coupling == "affine" else 1
        return ConvNet(
            n_kept + extra_inputs,
            params * (channels - n_kept),
            options["hidden"],
            context=options["context"],
            kernel_size=options["kernel_size"],
            activation=options["activation"],
        )

    def _step(
        self, channels: int, options: dict, shared: ConvNet | None = None, size: tuple[int, int] = (1, 1)
    ) -> list[Bijection]:
        context = options["context"]
        layer = AffineCoupling if self.coupling == "affine" else AdditiveCoupling
        if shared is None:
            net = self._coupling_net(channels, options)
        else:  # NanoFlow: the level's shared network, this step's embedding map and gate
            net = StepConditioner(shared, (options["embedding"], *size), shared.out_channels)
        extra = {"clamp": options["clamp"]} if self.coupling == "affine" else {}
        coupling = layer((channels, None, None), context, mask=half_mask(channels), conditioner=net, **extra)
        return [ActNorm2d(channels), self._mixer(channels, options), coupling]

    def _level(self, shape: tuple[int, int, int], level: int, options: dict) -> Chain:
        c, h, w = shape
        c, h, w = 4 * c, h // 2, w // 2
        layers: list[Bijection] = [Squeeze(shape[0])]
        shared = self._coupling_net(c, options, extra_inputs=options["embedding"]) if options["share"] else None
        for _ in range(self.steps):
            layers += self._step(c, options, shared, (h, w))
        if level == self.scales - 1:
            return Chain(*layers, ActNorm2d(c), Flatten((c, h, w)))
        keep = c // 2
        context = options["context"]
        if self.split == "eiw":
            layers.append(EIWShuffle(c, context, split=c - keep, clamp=options["clamp"], **options["eiw"]))
        prior = Coupling(
            (c, None, None),
            context,
            transformer=AffineTransformer(options["clamp"]),
            mask=half_mask(c),
            conditioner=ConvNet(keep, 2 * (c - keep), (), context=context, kernel_size=options["kernel_size"]),
        )
        inner = self._level((keep, h, w), level + 1, options)
        return Chain(*layers, prior, Split((c, h, w), inner, keep=keep))

    @property
    def event_shape(self) -> tuple[int, int, int]:
        """The image shape ``(C, H, W)``."""
        return self.image_shape

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log-density of images ``x`` (``(*batch, C, H, W)``), of shape ``batch``.

        With the logit preprocessing, ``x`` must lie in the logit's domain
        ``(-a, 1 + a)``, ``a = alpha / (1 - 2 alpha)``, which contains ``[0, 1]`` and every sample.

        Raises:
            ValueError: for a wrong shape, NaN/Inf values or values outside the domain.
        """
        alpha = self.logit_alpha
        if alpha is not None and isinstance(x, Tensor) and x.numel() and not under_vmap(x):  # vmap: no branching
            margin = alpha / (1 - 2 * alpha)
            low, high = torch.aminmax(x.detach())
            if not (low > -margin and high < 1 + margin):
                interval = "[0, 1]" if alpha else "(0, 1)"
                raise ValueError(
                    f"Glow: expected inputs in {interval} (dequantized images), got values in "
                    f"[{float(low):.6g}, {float(high):.6g}]"
                )
        return super().log_prob(x, context)

    @torch.no_grad()
    def sample(
        self, sample_shape: Sequence[int] | int = (), context: Tensor | None = None, *, temperature: float = 1.0
    ) -> Tensor:
        """Samples ``(*sample_shape, *context_batch, C, H, W)``; ``temperature`` scales the base sample.

        ``temperature < 1`` (Glow uses 0.7) trades diversity for cleaner images; 1 samples the model.

        Raises:
            ValueError: for a temperature that is not a finite number > 0 (``inf`` gave NaN images).
            TypeError: for a temperature that is not a number.
        """
        temperature = check_number("Glow", "temperature", temperature, minimum=0, strict=True)
        if temperature == 1.0:
            return self.rsample(sample_shape, context)
        self._check_context(context)
        shape = as_sample_shape(sample_shape)
        z = self.base.rsample(shape, context) * temperature
        return self.transform.inverse(z, self._latent_context(shape, context))

    def extra_repr(self) -> str:
        return (
            f"scales={self.scales}, steps={self.steps}, hidden={self.hidden}, mixer={self.mixer!r}, "
            f"split={self.split!r}, coupling={self.coupling!r}"
        )
