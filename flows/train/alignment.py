r"""Representation alignment of a TarFlow's hidden states with a frozen encoder: :class:`RepresentationAlignment`.

REPA (Yu et al. 2024) adds to a generative model's loss the negative cosine similarity between a
frozen encoder's patch features :math:`y^\star_n = \Phi(x)_n` of the clean data and a projection
:math:`h_\phi` of the model's hidden states :math:`h_n`, per token:

.. math:: \frac{L}{D} = \frac{L_{\text{NLL}}}{D} + \lambda \cdot \frac{1}{|A|} \sum_{(b, l) \in A}
          \Big(-\frac1N \sum_n \cos\big(y^\star_n, h_\phi(h^{(b, l)}_n)\big)\Big),

(:math:`\lambda` weighs the alignment against the NLL per dimension, as in TarFlow's and FlowBack's
losses; the objective returns :math:`L`, the summed NLL plus :math:`D \lambda` times the alignment term),
with :math:`h_\phi` REPA's three-layer MLP (Linear → SiLU → Linear → SiLU → Linear) and
:math:`A` the aligned locations (TarFlow block ``b``, transformer layer ``l``). FlowBack (Chen et
al. 2025) aligns the hidden states of the **generative (reverse) pass**. Which parameters the
alignment gradient reaches is the ``route``; with blocks numbered from the data side and the
aligned block ``b``:

* ``"reverse"`` (FlowBack's R-REPA): the latent :math:`z` is detached and the blocks ``n-1 … b``
  are inverted by the teacher-forced inverse
  (:meth:`~flows.bijections.TransformerAutoregressive.inverse_teacher_forced`, scales and
  shifts from the detached forward inputs :math:`\hat x`), which returns :math:`\hat x`
  numerically through a generative graph; block ``b``'s hidden states are computed on its reverse
  output. The gradient reaches block ``b`` and every block nearer the noise (``b+1 … n-1``),
  never a block nearer the data.
* ``"forward"`` (F-REPA): the hidden states of the maximum-likelihood pass; the gradient reaches
  every block before ``b`` and, in block ``b``, the embeddings and layers ``0 … l``.
* ``"detach"`` (D-REPA): block ``b``'s input is detached; only its embeddings and layers
  ``0 … l`` are reached.

The projector learns in every route. The features of the three routes are equal in value (the
teacher-forced inverse reproduces the forward inputs); only the graph differs.

Tokens and grids: the encoder returns tokens ``(B, N, D)`` or a feature map ``(B, D, h, w)``. The
flow's tokens form its patch grid ``(H/p, W/p)`` (a row ``(1, T)`` for vectors); an encoder grid
of another size (tokens: a square ``√N × √N`` grid) is resampled to it by bilinear interpolation
(``grid="interpolate"``) or adaptive average pooling (``"pool"``).

Encoders: any frozen ``nn.Module`` (its parameters are set to ``requires_grad=False``; it runs in
eval mode under ``torch.no_grad``) that takes the batch's clean data ``x`` as the data yields it
(do resizing and normalisation inside it). Online, DINOv2 plugs in through ``torch.hub`` or
``timm``, e.g.::

    dino = torch.hub.load("facebookresearch/dinov2", "dinov2_vitb14")

    class Dino(torch.nn.Module):  # images in [-1, 1] -> RGB at 224 -> (B, 256, 768) patch tokens
        def __init__(self):
            super().__init__()
            self.net = dino

        def forward(self, x):
            x = F.interpolate((x + 1) / 2, size=224, mode="bicubic").expand(-1, 3, -1, -1)
            mean = x.new_tensor([0.485, 0.456, 0.406])[:, None, None]
            std = x.new_tensor([0.229, 0.224, 0.225])[:, None, None]
            return self.net.forward_features((x - mean) / std)["x_norm_patchtokens"]

(with ``timm``: ``timm.create_model("vit_base_patch14_dinov2", pretrained=True)`` and
``forward_features(x)[:, 1:]``, dropping the class token). Nothing is downloaded by this library.

Training: the objective holds the projector (``align.projector``), which the optimizer must get::

    align = RepresentationAlignment(encoder, where=[(-1, 1)], route="reverse", width=64, features=32)
    trainer = Trainer(flow, align, optimizer=lambda p: torch.optim.AdamW([*p, *align.projector.parameters()], 1e-3))

The trainer's checkpoints hold the flow and the optimizer, not the projector: save
``align.projector.state_dict()`` beside them to resume the alignment exactly.

References:
    Yu et al. (2024), "Representation Alignment for Generation: Training Diffusion Transformers Is
    Easier Than You Think", arXiv:2410.06940 (REPA). Chen et al. (2025), "Flowing Backwards:
    Improving Normalizing Flows via Reverse Representation Alignment", arXiv:2511.22345 (FlowBack).
    Oquab et al. (2023), "DINOv2: Learning Robust Visual Features without Supervision", arXiv:2304.07193.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows.architectures.transformer import TarFlow
from flows.bijections.patchify import Patchify
from flows.train.batching import split_batch
from flows.train.objectives import MaximumLikelihood, Objective, ObjectiveOutput

__all__ = ["RepresentationAlignment", "repa_projector"]

ROUTES = ("reverse", "forward", "detach")


def repa_projector(width: int, features: int, projector_width: int = 2048) -> nn.Sequential:
    """REPA's projector ``Linear(width, w) → SiLU → Linear(w, w) → SiLU → Linear(w, features)``, w = projector_width."""
    return nn.Sequential(
        nn.Linear(width, projector_width),
        nn.SiLU(),
        nn.Linear(projector_width, projector_width),
        nn.SiLU(),
        nn.Linear(projector_width, features),
    )


def _locations(where: object) -> list[tuple[int, int]]:
    """``[(block, layer), ...]`` from one pair or a sequence of pairs of ints."""
    pairs = [where] if isinstance(where, tuple) and len(where) == 2 and isinstance(where[0], int) else where
    ok = isinstance(pairs, Sequence) and len(pairs) > 0
    ok = ok and all(
        isinstance(p, Sequence) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
        for p in pairs
    )
    if not ok:
        raise ValueError(
            f"RepresentationAlignment: expected where to be (block, layer) or a list of them, got {where!r}"
        )
    return [(int(b), int(layer)) for b, layer in pairs]


class RepresentationAlignment(nn.Module, Objective):
    r"""Maximum likelihood plus REPA/FlowBack alignment of a :class:`~flows.TarFlow`'s hidden states.

    See the module docstring for the loss, the routes, the grids and how to train it.

    Args:
        encoder: a frozen ``nn.Module``, ``encoder(x) -> (B, N, D)`` tokens or ``(B, D, h, w)`` maps.
        where: the aligned ``(block, layer)`` pairs (blocks as in ``flow.blocks``, data side first,
            negative from the noise side; layers 0-based in the block's transformer).
        route: ``"reverse"``, ``"forward"`` or ``"detach"`` (which parameters the alignment reaches).
        weight: :math:`\lambda` (REPA's 0.5).
        projector: the per-token map ``width → D`` (default :func:`repa_projector`, which needs
            ``width`` and ``features``).
        width: the flow's transformer width (for the default projector).
        features: the encoder's feature width ``D`` (for the default projector).
        projector_width: the default projector's hidden width (REPA: 2048).
        grid: ``"interpolate"`` or ``"pool"``: how an encoder grid of another size is matched.
        likelihood: the maximum-likelihood objective (dequantization, noise); default
            :class:`~flows.train.MaximumLikelihood`.
        until: align in the first ``until`` training steps only, then train by maximum
            likelihood alone (HASTE's early stop, Wang et al. 2025, arXiv:2505.16792); the
            alignment is still measured and logged after it. Steps are the calls in training
            mode with gradients on, counted in the ``steps`` buffer (saved with the objective's
            state, so a resumed run stops where it would have). ``None``: align throughout.

    Raises:
        ValueError, TypeError: for a bad argument, naming what was expected.

    Example:
        >>> import torch
        >>> from flows import TarFlow
        >>> flow = TarFlow((1, 4, 4), patch=2, transforms=2, hidden=(16,))
        >>> encoder = torch.nn.Conv2d(1, 8, 2, stride=2)  # (B, 8, 2, 2) maps: the flow's 2x2 grid
        >>> align = RepresentationAlignment(encoder, where=(1, 0), width=16, features=8, projector_width=32)
        >>> loss, metrics = align(flow, (torch.randn(3, 1, 4, 4),))
        >>> sorted(metrics)
        ['alignment', 'nll']
    """

    def __init__(
        self,
        encoder: nn.Module,
        where: tuple[int, int] | Sequence[tuple[int, int]],
        route: str = "reverse",
        weight: float = 0.5,
        projector: nn.Module | None = None,
        *,
        width: int | None = None,
        features: int | None = None,
        projector_width: int = 2048,
        grid: str = "interpolate",
        likelihood: MaximumLikelihood | None = None,
        until: int | None = None,
    ) -> None:
        super().__init__()
        who = "RepresentationAlignment"
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"{who}: expected the encoder to be an nn.Module, got {type(encoder).__name__}")
        if route not in ROUTES:
            raise ValueError(f"{who}: expected route in {list(ROUTES)}, got {route!r}")
        if grid not in ("interpolate", "pool"):
            raise ValueError(f"{who}: expected grid in ['interpolate', 'pool'], got {grid!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
            raise ValueError(f"{who}: expected weight to be a finite number >= 0, got {weight!r}")
        if until is not None and (isinstance(until, bool) or not isinstance(until, int) or until < 1):
            raise ValueError(f"{who}: expected until to be None or a positive int (training steps), got {until!r}")
        if projector is None:
            sizes = {"width": width, "features": features, "projector_width": projector_width}
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in sizes.values()):
                raise ValueError(
                    f"{who}: expected positive int width (the flow's), features (the encoder's) and "
                    f"projector_width for the default projector, got {sizes}; or pass projector="
                )
            projector = repa_projector(width, features, projector_width)
        elif not isinstance(projector, nn.Module):
            raise TypeError(f"{who}: expected the projector to be an nn.Module, got {type(projector).__name__}")
        self.where, self.route, self.weight, self.grid = _locations(where), route, float(weight), grid
        self.encoder = encoder.requires_grad_(False)
        self.projector = projector
        self.likelihood = likelihood if likelihood is not None else MaximumLikelihood()
        self.until = until
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    # -- pieces ---------------------------------------------------------------------------------
    def targets(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """The frozen encoder's features of ``x`` on the flow's token ``grid``: ``(B, gh·gw, D)``, no gradient."""
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            with torch.no_grad():
                y = self.encoder(x)
        finally:
            self.encoder.train(was_training)
        if not isinstance(y, Tensor) or y.dim() not in (3, 4):
            raise ValueError(
                "RepresentationAlignment: expected the encoder to return tokens (B, N, D) or maps (B, D, h, w), "
                f"got {type(y).__name__} of shape {tuple(getattr(y, 'shape', ()))}"
            )
        tokens = grid[0] * grid[1]
        if y.dim() == 3:
            if y.shape[1] == tokens:
                return y.detach()
            side = math.isqrt(y.shape[1])
            if side * side != y.shape[1]:
                raise ValueError(
                    f"RepresentationAlignment: expected {tokens} encoder tokens or a square number of them, got "
                    f"{y.shape[1]} (drop class or register tokens in the encoder)"
                )
            y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], side, side)
        if tuple(y.shape[2:]) != grid:
            if self.grid == "pool":
                y = F.adaptive_avg_pool2d(y, grid)
            else:
                y = F.interpolate(y, size=grid, mode="bilinear", align_corners=False)
        return y.flatten(2).transpose(1, 2).detach()

    def hidden_states(self, flow: TarFlow, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """``(log p(x), [h per aligned location])`` with each ``h`` ``(B, T, width)`` on the route's graph."""
        blocks, where = flow.blocks, self._pairs(flow)
        n = len(blocks)
        state = flow.forward_pass(x, context, states=where if self.route == "forward" else ())
        c = state.context
        if self.route == "forward":  # the maximum-likelihood pass's own states: no second pass
            return state.log_prob, [state.states[pair] for pair in where]
        if self.route == "reverse":
            lowest = min(b for b, _ in where)
            inputs, x_rev = {}, state.output.detach()
            for i in range(n - 1, lowest - 1, -1):  # the generative graph from the detached latent
                x_rev = blocks[i].inverse_teacher_forced(x_rev, state.inputs[i].detach(), c)
                inputs[i] = x_rev
        else:
            inputs = {i: v.detach() for i, v in enumerate(state.inputs)}
        states = [blocks[b].hidden_states(inputs[b], c, layers=[layer])[0] for b, layer in where]
        return state.log_prob, states

    def _pairs(self, flow: TarFlow) -> list[tuple[int, int]]:
        """The aligned ``(block, layer)`` pairs with blocks counted ``0..n-1`` from the data side."""
        n = len(flow.blocks)
        for b, _ in self.where:
            if not -n <= b < n:
                raise ValueError(f"RepresentationAlignment: expected blocks in -{n}..{n - 1}, got {b}")
        return [(b % n, layer) for b, layer in self.where]

    def alignment_loss(self, states: Sequence[Tensor], targets: Tensor) -> Tensor:
        r"""Mean over locations, tokens and batch of :math:`-\cos(y^\star_n, h_\phi(h_n))`."""
        terms = []
        for h in states:
            projected = self.projector(h.reshape(targets.shape[0], -1, h.shape[-1]))
            if projected.shape != targets.shape:
                raise ValueError(
                    f"RepresentationAlignment: expected projected features of the targets' shape "
                    f"{tuple(targets.shape)}, got {tuple(projected.shape)} (check features= / the projector)"
                )
            terms.append(-F.cosine_similarity(projected, targets.to(projected.dtype), dim=-1).mean())
        return torch.stack(terms).mean()

    # -- the objective --------------------------------------------------------------------------
    def __call__(self, model: nn.Module, batch: object) -> ObjectiveOutput:  # type: ignore[override]
        if not isinstance(model, TarFlow):
            raise TypeError(f"RepresentationAlignment: expected a TarFlow model, got {type(model).__name__}")
        clean, _ = split_batch(batch)
        x, context = self.likelihood._inputs(model, batch)
        aligning = self.until is None or int(self.steps) < self.until
        if model.training and torch.is_grad_enabled():
            self.steps += 1
        targets = self.targets(clean.to(x.dtype), _token_grid(model))
        if aligning:
            log_p, states = self.hidden_states(model, x, context)
            align = self.alignment_loss(states, targets)
        else:  # past `until`: maximum likelihood alone, the alignment measured on the same pass
            pairs = self._pairs(model)
            state = model.forward_pass(x, context, states=pairs)
            log_p = state.log_prob
            with torch.no_grad():
                align = self.alignment_loss([state.states[pair] for pair in pairs], targets)
        nll = -log_p.mean()
        dims = math.prod(x.shape[1:])  # λ weighs the per-dimension NLL, as TarFlow's and FlowBack's losses are
        loss = nll + dims * self.weight * align if aligning else nll
        return loss, {"nll": nll.detach(), "alignment": align.detach()}

    forward = __call__

    def extra_repr(self) -> str:
        until = "" if self.until is None else f", until={self.until}"
        return f"where={self.where}, route={self.route!r}, weight={self.weight}, grid={self.grid!r}{until}"


def _token_grid(flow: TarFlow) -> tuple[int, int]:
    """The flow's tokens as a grid: the patch grid of an image TarFlow, else one row of ``T`` tokens."""
    for layer in flow.transform.modules():
        if isinstance(layer, Patchify):
            _, h, w = layer.event_shape
            return h // layer.patch, w // layer.patch
    return 1, flow.tokens
