"""Masked autoencoder for distribution estimation (:class:`MADE`) and its degree masks."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flows._functorch import functorch_active
from flows._validation import check_context, check_count, check_number

__all__ = ["MADE"]


def _made_hidden_degrees(
    features: int,
    widths: Sequence[int],
    scheme: str | Sequence[Tensor],
    generator: torch.Generator | None,
    conditional: bool,
) -> list[Tensor]:
    """Degrees of the hidden units of a MADE, each layer sorted (non-decreasing).

    A unit of degree ``m`` sees the inputs of order ``<= m`` (and the context); the outputs of the
    feature of order ``t`` see the last-layer units of degree ``< t``. Degree ``-1`` units see only
    the context: a conditional MADE uses degrees ``-1..D-2`` (so the first feature's parameters
    depend on the context), an unconditional one ``0..D-2``.
    """
    top = features - 2
    low = -1 if conditional or top < 0 else 0
    if not isinstance(scheme, str):
        degrees = [torch.as_tensor(d, dtype=torch.long) for d in scheme]
        if len(degrees) != len(widths):
            raise ValueError(f"MADE: expected {len(widths)} hidden degree vectors, got {len(degrees)}")
        for i, (d, w) in enumerate(zip(degrees, widths, strict=True)):
            if d.shape != (w,):
                raise ValueError(f"MADE: expected hidden degrees of layer {i} of shape ({w},), got {tuple(d.shape)}")
            if d.numel() and (int(d.min()) < -1 or int(d.max()) > max(top, -1)):
                raise ValueError(
                    f"MADE: expected hidden degrees in [-1, {max(top, -1)}] (features={features}), "
                    f"got values in [{int(d.min())}, {int(d.max())}]"
                )
        return [d.sort().values for d in degrees]
    top = max(top, low)
    if scheme == "sequential":
        return [(torch.arange(w) % (top - low + 1) + low).sort().values for w in widths]
    if scheme == "random":
        degrees = []
        for w in widths:
            d = torch.randint(low, top + 1, (w,), generator=generator).sort().values
            degrees.append(d)
            low = int(d.min()) if w else low
        return degrees
    raise ValueError(f"MADE: expected hidden_degrees 'sequential', 'random' or a list of tensors, got {scheme!r}")


class MADE(nn.Module):
    r"""Masked autoencoder for distribution estimation: an MLP whose outputs are autoregressive in its inputs.

    Every input :math:`x_i` has an order :math:`o_i` (a permutation of ``0..D-1``), every hidden unit a
    degree :math:`m \in \{-1, \dots, D-2\}` (:math:`-1`: sees only the context; used when there
    is a context, so that the first feature's parameters depend on it). Masks keep a weight from
    input :math:`j` to a first-layer unit :math:`k` iff :math:`m_k \ge o_j`, between hidden layers
    iff :math:`m_k \ge m_j`, and from a last-layer unit :math:`k` to the outputs of feature
    :math:`i` iff :math:`o_i > m_k`; the context (degree :math:`-1`) feeds every first-layer unit.
    Hence the outputs of feature :math:`i` depend only on the context and on the inputs
    :math:`x_j` with :math:`o_j < o_i`.

    Output layout (parameter-major): ``out_features = D · P`` and output unit ``p · D + i`` is raw
    parameter ``p`` of feature ``i``, so ``out.unflatten(-1, (P, D)).transpose(-1, -2)`` has shape
    ``(*, D, P)`` (that is what :class:`~flows.bijections.autoregressive.MaskedAutoregressive`
    passes to its transformer; the layout keeps elementwise work contiguous along the features).

    Network: plain, :math:`a_1 = \phi(W_1 [x, c] + b_1)`, :math:`a_l = \phi(W_l a_{l-1} + b_l)`,
    :math:`\text{out} = W_o a_L + b_o`; residual (``residual=True``, equal widths),
    :math:`r_1 = W_1 [x, c] + b_1`, :math:`r_l = r_{l-1} + W_l \phi(r_{l-1}) + b_l`,
    :math:`\text{out} = W_o \phi(r_L) + b_o`. Every :math:`W` is multiplied by its mask.

    :meth:`forward` evaluates all outputs in one pass (the density direction of MAF).
    :meth:`solve` inverts an autoregressive transform in ``D`` sequential steps with no wasted
    work: hidden units of degree ``t - 1`` depend only on inputs of order ``< t``, so step ``t``
    computes exactly those units and the outputs of the feature of order ``t``; over all steps each
    unit and each output is computed once (the cost of one forward pass, in ``D`` small pieces).

    References:
        Germain, Gregor, Murray, Larochelle (2015), "MADE: Masked Autoencoder for Distribution
        Estimation", ICML, arXiv:1502.03509. Papamakarios, Pavlakou, Murray (2017), "Masked
        Autoregressive Flow for Density Estimation", NeurIPS, arXiv:1705.07057 (the conditional
        MADE). Nash, Durkan (2019), "Autoregressive Energy Machines", ICML, arXiv:1904.05626
        (residual MADE).

    Args:
        in_features: number of features ``D``.
        out_features: ``D · P`` outputs, ``P`` per feature.
        hidden: widths of the hidden layers (at least one).
        context: width of the context input (0 for none).
        order: the autoregressive order ``o`` (a permutation of ``range(D)``; default ``range(D)``).
        hidden_degrees: ``"sequential"`` (degrees cycle through ``0..D-2``, or ``-1..D-2`` with a
            context), ``"random"`` (the MADE paper's scheme, drawn in the same range) or one tensor of
            degrees per hidden layer. Units are stored sorted by degree.
        residual: residual hidden layers (all hidden widths equal).
        dropout: probability of zeroing each hidden activation in train mode (a regulariser for
            small data sets). Only :meth:`forward` drops units; :meth:`solve` is deterministic, so
            with ``dropout > 0`` evaluate and sample in eval mode (:func:`flows.evaluating`).
        activation: constructor of the nonlinearity.
        zero_init: zero the last layer (a flow built on it starts at the identity).
        generator: random generator for ``hidden_degrees="random"``.

    Raises:
        ValueError: for bad widths, orders or degrees.

    Example:
        >>> import torch
        >>> made = MADE(3, 6, hidden=(8,), zero_init=False)
        >>> x = torch.randn(4, 3)
        >>> jac = torch.autograd.functional.jacobian(lambda v: made(v).view(2, 3), x[0])  # (P, D, D)
        >>> bool((jac.abs().sum(0) * torch.ones(3, 3).tril().T).abs().sum() == 0)  # output i ignores x_j, j >= i
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        *,
        context: int = 0,
        order: Sequence[int] | Tensor | None = None,
        hidden_degrees: str | Sequence[Tensor] = "sequential",
        residual: bool = False,
        dropout: float = 0.0,
        activation: Callable[[], nn.Module] = nn.ReLU,
        zero_init: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        d = in_features
        if not 0 <= check_number("MADE", "dropout", dropout, minimum=0) < 1:
            raise ValueError(f"MADE: expected 0 <= dropout < 1, got {dropout}")
        check_count("MADE", "in_features", d)
        if not isinstance(out_features, int) or out_features < d or out_features % d:
            raise ValueError(
                f"MADE: expected out_features to be a positive multiple of in_features={d}, got {out_features!r}"
            )
        hidden = tuple(int(h) for h in hidden)
        if not hidden or any(h < 1 for h in hidden):
            raise ValueError(f"MADE: expected at least one hidden layer of positive width, got {hidden}")
        if residual and len(set(hidden)) != 1:
            raise ValueError(f"MADE: residual=True needs equal hidden widths, got {hidden}")
        if context < 0:
            raise ValueError(f"MADE: expected context >= 0, got {context}")
        order = torch.arange(d) if order is None else torch.as_tensor(order, dtype=torch.long)
        if order.shape != (d,) or not torch.equal(order.sort().values, torch.arange(d)):
            raise ValueError(f"MADE: expected order to be a permutation of range({d}), got {order.tolist()}")
        self.in_features, self.out_features, self.context_features = d, out_features, context
        self.params_per_feature = out_features // d
        self.residual = residual
        degrees = _made_hidden_degrees(d, hidden, hidden_degrees, generator, conditional=context > 0)
        if residual and any(not torch.equal(deg, degrees[0]) for deg in degrees):
            if not isinstance(hidden_degrees, str):
                raise ValueError("MADE: residual=True needs the same hidden degrees in every layer")
            degrees = [degrees[0]] * len(degrees)
        self.register_buffer("order", order)
        in_degrees = torch.cat((order, torch.full((context,), -1, dtype=torch.long)))
        out_degrees = order.repeat(self.params_per_feature)  # parameter-major: unit p * D + i is feature i
        masks = [degrees[0][:, None] >= in_degrees[None, :]]
        masks += [degrees[i][:, None] >= degrees[i - 1][None, :] for i in range(1, len(hidden))]
        masks.append(out_degrees[:, None] > degrees[-1][None, :])
        widths = [d + context, *hidden, out_features]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        for i, (layer, mask) in enumerate(zip(self.layers, masks, strict=True)):
            self.register_buffer(f"mask{i}", mask.to(layer.weight.dtype))
        for i, deg in enumerate(degrees):
            self.register_buffer(f"degrees{i}", deg)
        if zero_init:
            nn.init.zeros_(self.layers[-1].weight)
            nn.init.zeros_(self.layers[-1].bias)
        self.activation = activation()
        self.dropout = float(dropout)

    def masks(self) -> list[Tensor]:
        """The connectivity masks ``(out, in)`` of every layer, in order."""
        return [getattr(self, f"mask{i}") for i in range(len(self.layers))]

    def hidden_degrees(self) -> list[Tensor]:
        """The (sorted) degrees of the hidden units, one tensor per hidden layer."""
        return [getattr(self, f"degrees{i}") for i in range(len(self.layers) - 1)]

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """All outputs ``(*batch, D · P)`` from inputs ``(*batch, D)`` (and a context ``(*batch, C)``)."""
        if self.context_features:
            check_context(context, self.context_features, "MADE")
            x = torch.cat((x, context.expand(*x.shape[:-1], self.context_features)), dim=-1)
        masks, layers = self.masks(), self.layers
        # Without residual connections each pre-activation is used once, so a ReLU may overwrite it.
        # Not while tracing: torch.jit.trace (Pyro's jit_compile=True) refuses in-place ops it cannot replay.
        inplace = not self.residual and type(self.activation) is nn.ReLU and not torch.jit.is_tracing()

        def act(h: Tensor) -> Tensor:
            h = torch.relu_(h) if inplace else self.activation(h)
            return F.dropout(h, self.dropout, self.training) if self.dropout else h

        layers = list(layers)  # a list: slicing an nn.ModuleList builds a new module at every call
        h = F.linear(x, layers[0].weight * masks[0], layers[0].bias)
        for layer, mask in zip(layers[1:-1], masks[1:-1], strict=True):
            if self.residual:
                h = h + F.linear(act(h), layer.weight * mask, layer.bias)
            else:
                h = F.linear(act(h), layer.weight * mask, layer.bias)
        return F.linear(act(h), layers[-1].weight * masks[-1], layers[-1].bias)

    def solve(
        self,
        step: Callable[[int, Tensor], Tensor],
        batch_shape: Sequence[int],
        context: Tensor | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        r"""Solve for the inputs one feature at a time, in the autoregressive order.

        At step ``t`` the outputs of feature ``i`` (the one with order ``t``) are computed from the
        inputs already solved, and ``step(i, params)`` (``params`` of shape ``(*batch_shape, P)``)
        must return ``x_i`` (shape ``batch_shape``). Each hidden unit is evaluated once, at the first
        step where all its inputs are known; the result equals running :meth:`forward` on the
        returned ``x``. Differentiable (it concatenates instead of writing in place when autograd
        records).

        Args:
            step: the callback ``(feature index, raw parameters) -> value of that feature``.
            batch_shape: the batch shape of the values.
            context: context ``(*batch_shape, C)`` or broadcastable to it.
            dtype: dtype of the values (default: the parameters').
            device: device of the values (default: the parameters').

        Returns:
            The solved inputs, ``(*batch_shape, D)``.
        """
        if self.context_features:
            check_context(context, self.context_features, "MADE")
        weight0 = self.layers[0].weight
        dtype = dtype or weight0.dtype
        device = device or weight0.device
        batch_shape = torch.Size(batch_shape)
        n, d, p = batch_shape.numel(), self.in_features, self.params_per_feature
        weights, biases, by_order, below, first, pre0 = self._solve_plan(batch_shape, context)
        widths = [w.shape[0] for w in weights[:-1]]
        # autograd (and torch.func transforms, whose batched values cannot be written into plain buffers):
        # build by concatenation; otherwise fill buffers in place
        solved = _Solved(torch.is_grad_enabled() or functorch_active(), n, d, widths, dtype, device, weight0)
        for t in range(d):
            for layer in range(len(widths)):
                lo, hi = below[layer][t], below[layer][t + 1]
                if hi == lo:
                    continue
                if layer == 0:
                    pre = pre0[:, lo:hi]
                    if t:
                        pre = torch.addmm(pre, solved.known(t), first[lo:hi, :t].t())
                else:
                    end = below[layer - 1][t + 1]  # previous-layer units of degree <= t - 1
                    inputs = solved.activations(layer - 1, end)
                    pre = torch.addmm(biases[layer][lo:hi], inputs, weights[layer][lo:hi, :end].t())
                    if self.residual:  # equal degrees in every layer: the same slice of the stream
                        pre = pre + solved.stream(layer - 1, lo, hi)
                solved.add_units(layer, lo, hi, pre, self.activation(pre))
            i = by_order[t]
            rows = list(range(i, p * d, d))  # the P outputs of feature i (parameter-major layout)
            end = below[-1][t + 1]  # last-layer units of degree < t
            params = torch.addmm(
                biases[-1][rows], solved.activations(len(widths) - 1, end), weights[-1][rows, :end].t()
            )
            solved.add_value(t, step(i, params.reshape(*batch_shape, p)).reshape(n, 1))
        return solved.inputs()[:, self.order.tolist()].reshape(*batch_shape, d)

    def _solve_plan(
        self, batch_shape: torch.Size, context: Tensor | None
    ) -> tuple[list[Tensor], list[Tensor], list[int], list[list[int]], Tensor, Tensor]:
        """What :meth:`solve` reads at every step: masked weights, biases, order, degree ranges, ``W_1 [0, c] + b_1``.

        Returns ``(weights, biases, by_order, below, first, pre0)``: ``by_order[t]`` is the feature of
        order ``t``; ``below[l][t]`` the number of units of hidden layer ``l`` with degree ``< t - 1``;
        ``first`` the input columns of the first layer in the autoregressive order; ``pre0`` the
        first layer's pre-activation before any input is known, ``(n, width)``.
        """
        n, d = batch_shape.numel(), self.in_features
        weights = [layer.weight * mask for layer, mask in zip(self.layers, self.masks(), strict=True)]
        biases = [layer.bias for layer in self.layers]
        order = self.order.tolist()
        by_order = sorted(range(d), key=order.__getitem__)  # by_order[t] = the feature of order t
        # below[l][t] = number of units of hidden layer l with degree < t - 1 (units are sorted by degree),
        # so step t computes the units [below[l][t], below[l][t + 1]) (degree t - 1).
        below = [
            torch.searchsorted(deg, torch.arange(-1, d + 1, device=deg.device)).tolist()
            for deg in self.hidden_degrees()
        ]
        first = weights[0][:, :d][:, by_order]  # input columns in the autoregressive order
        pre0 = biases[0].expand(n, -1)
        if self.context_features:
            c = context.expand(*batch_shape, self.context_features).reshape(n, self.context_features)
            pre0 = torch.addmm(biases[0], c, weights[0][:, d:].t())
        return weights, biases, by_order, below, first, pre0


class _Solved:
    """The inputs and hidden units :meth:`MADE.solve` has computed so far, ``n`` rows each.

    While autograd records they are lists of pieces joined by concatenation (differentiable);
    otherwise preallocated buffers filled in place.
    """

    def __init__(
        self, record: bool, n: int, d: int, widths: list[int], dtype: torch.dtype, device: torch.device, like: Tensor
    ) -> None:
        self.record, self.n, self.like = record, n, like
        if record:
            self.values: list[Tensor] = []
            self.acts: list[list[Tensor]] = [[] for _ in widths]
            self.pres: list[list[Tensor]] = [[] for _ in widths]
        else:
            self.solved = torch.empty(n, d, dtype=dtype, device=device)
            self.act_buf = [torch.empty(n, w, dtype=dtype, device=device) for w in widths]
            self.pre_buf = [torch.empty(n, w, dtype=dtype, device=device) for w in widths]

    def known(self, t: int) -> Tensor:
        """The ``t`` inputs solved so far, in the autoregressive order, ``(n, t)``."""
        return torch.cat(self.values, dim=1) if self.record else self.solved[:, :t]

    def activations(self, layer: int, end: int) -> Tensor:
        """The first ``end`` activations of hidden layer ``layer`` (all that are computed), ``(n, end)``."""
        if self.record:
            return torch.cat(self.acts[layer], dim=1) if self.acts[layer] else self.like.new_zeros(self.n, 0)
        return self.act_buf[layer][:, :end]

    def stream(self, layer: int, lo: int, hi: int) -> Tensor:
        """The pre-activations ``[lo, hi)`` of hidden layer ``layer`` (the last ones computed): the residual stream."""
        return self.pres[layer][-1] if self.record else self.pre_buf[layer][:, lo:hi]

    def add_units(self, layer: int, lo: int, hi: int, pre: Tensor, out: Tensor) -> None:
        """Keep the pre-activations and activations of the units ``[lo, hi)`` of hidden layer ``layer``."""
        if self.record:
            self.acts[layer].append(out)
            self.pres[layer].append(pre)
        else:
            self.act_buf[layer][:, lo:hi] = out
            self.pre_buf[layer][:, lo:hi] = pre

    def add_value(self, t: int, x_i: Tensor) -> None:
        """Keep the input of order ``t``, ``(n, 1)``."""
        if self.record:
            self.values.append(x_i)
        else:
            self.solved[:, t : t + 1] = x_i

    def inputs(self) -> Tensor:
        """All solved inputs in the autoregressive order, ``(n, D)``."""
        return torch.cat(self.values, dim=1) if self.record else self.solved
