r"""Global kernels with a flow as independent proposal: independent Metropolis–Hastings and i-SIR.

Both target :math:`\pi` exactly with any proposal :math:`q` (a :class:`~flows.Flow`) that covers
it; the closer :math:`q` is to :math:`\pi`, the more often the chains jump, including between
modes. Both use the importance weights :math:`\log w = \log\pi - \log q`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flows._kernels import metropolis_accept
from flows._validation import check_count
from flows.flow import Flow
from flows.mcmc.base import FlowWatch, Kernel, State, StepInfo, _select, check_flow_matches
from flows.targets.base import EnergyTarget

__all__ = ["IMH", "ISIR", "imh_log_ratio"]


def imh_log_ratio(log_pi_x: Tensor, log_q_x: Tensor, log_pi_y: Tensor, log_q_y: Tensor) -> Tensor:
    r"""Log acceptance ratio of an independent proposal :math:`y \sim q` from the current :math:`x`.

    .. math:: \log\frac{\pi(y)\,q(x)}{\pi(x)\,q(y)} = \log w(y) - \log w(x),\qquad w = \pi / q.

    Args:
        log_pi_x: :math:`\log\pi(x)` (any shape, unnormalised).
        log_q_x: :math:`\log q(x)`.
        log_pi_y: :math:`\log\pi(y)`.
        log_q_y: :math:`\log q(y)`.

    Example:
        >>> import torch
        >>> imh_log_ratio(torch.tensor(0.0), torch.tensor(-1.0), torch.tensor(-1.0), torch.tensor(-3.0)).item()
        1.0
    """
    return (log_pi_y - log_q_y) - (log_pi_x - log_q_x)


class _FlowProposal(Kernel):
    """A kernel that draws independent proposals from a flow and caches ``log q`` at the state."""

    def __init__(self, target: EnergyTarget, flow: Flow) -> None:
        super().__init__(target)
        check_flow_matches(flow, self.event_shape, type(self).__name__)
        self.flow = flow
        self._watch = FlowWatch(flow)

    def _cache_key(self) -> str:
        return f"log_q@{id(self.flow)}"

    def _log_q(self, state: State) -> Tensor:
        """``log q(x)`` at the state, from the cache when the flow is unchanged since it was stored."""
        cached = state.cache.get(self._cache_key())
        if cached is not None and cached[0] == self._watch.version():
            return cached[1]
        with torch.no_grad(), self._watch.evaluating():
            return self.flow.log_prob(state.x)

    def _propose(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
        """Proposals ``(*shape, *event)`` with their flow and target log-densities."""
        with torch.no_grad(), self._watch.evaluating():
            y, log_q_y = self.flow.sample_and_log_prob(shape)
            log_pi_y = -self.target.energy(y)
        return y, log_q_y, log_pi_y

    def _moved(self, state: State, accepted: Tensor, y: Tensor, log_pi_y: Tensor, log_q: Tensor) -> State:
        """The state after the accepted chains moved to ``y`` (gradients refreshed where they are kept)."""
        x = _select(accepted, y, state.x)
        log_pi = torch.where(accepted, log_pi_y, state.log_prob)
        grad = state.grad
        if grad is not None and bool(accepted.any()):
            # Keep the gradient cache of gradient-based partners valid: evaluate it at the new rows only.
            rows = accepted.nonzero().squeeze(-1)
            _, grad_rows = self._log_prob_and_grad(y[rows])
            grad = grad.index_copy(0, rows, grad_rows)
        return State(x, log_pi, grad, {self._cache_key(): (self._watch.version(), log_q)})

    def extra_repr(self) -> str:
        return ""


class IMH(_FlowProposal):
    r"""Independent Metropolis–Hastings with a normalizing flow as proposal.

    Each chain proposes :math:`y \sim q` (the flow's samples) independently of its state :math:`x`
    and accepts with

    .. math:: \alpha = \min\Bigl(1, \frac{\pi(y)\,q(x)}{\pi(x)\,q(y)}\Bigr) = \min\Bigl(1, \frac{w(y)}{w(x)}\Bigr).

    With a perfect flow (:math:`q = \pi`) every proposal is accepted. ``log q`` at the state is
    cached and recomputed whenever the flow's parameters change (e.g. online training in
    :class:`~flows.mcmc.GlobalLocal`). Costs one flow sample and one target evaluation (no
    gradient) per chain and step; when the state carries gradients (a gradient-based partner
    kernel), the accepted chains also get their gradient evaluated.

    References:
        Tierney (1994), "Markov chains for exploring posterior distributions", Ann. Statist. 22.
        Grenioux, Durmus, Moulines, Gabrié (2023), "On Sampling with Approximate Transport Maps",
        ICML, arXiv:2302.04763.

    Args:
        target: the energy target.
        flow: an unconditional :class:`~flows.Flow` on the target's event shape (the proposal).

    Example:
        >>> import math
        >>> import torch
        >>> from flows import Affine, Flow, StandardNormal
        >>> from flows.mcmc import sample
        >>> from flows.targets import Gaussian
        >>> perfect = Flow(Affine(2, shift=-0.5, log_scale=-math.log(2)), StandardNormal(2))  # z = (x - 1) / 2
        >>> trace = sample(IMH(Gaussian(2, loc=1.0, scale=2.0), perfect), torch.zeros(8, 2), 10)
        >>> trace.acceptance_rate()
        1.0
    """

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        y, log_q_y, log_pi_y = self._propose((state.chains,))
        log_q_x = self._log_q(state)
        accept_prob, accepted = metropolis_accept(imh_log_ratio(state.log_prob, log_q_x, log_pi_y, log_q_y))
        log_q = torch.where(accepted, log_q_y, log_q_x)
        return self._moved(state, accepted, y, log_pi_y, log_q), StepInfo(accept_prob, accepted)


class ISIR(_FlowProposal):
    r"""Iterated sampling-importance-resampling (i-SIR) with a normalizing flow as proposal.

    Each chain draws :math:`M` = ``n_proposals`` fresh proposals :math:`y_1, \dots, y_M \sim q`,
    keeps its current state as :math:`y_0 = x` and moves to :math:`y_j` with probability

    .. math:: P(j) = \frac{w(y_j)}{\sum_{k=0}^{M} w(y_k)},\qquad w = \pi / q.

    The kernel leaves :math:`\pi` invariant for any :math:`M \ge 1` (:math:`M = 1` is Barker's
    rule with an independent proposal); larger :math:`M` moves more often at :math:`M` target
    evaluations per step. The reported ``accept_prob`` is the probability of leaving the current
    state, :math:`1 - P(0)`.

    References:
        Andrieu, Lee, Vihola (2018), "Uniform ergodicity of the iterated conditional SMC and
        geometric ergodicity of particle Gibbs samplers", Bernoulli 24, arXiv:1312.6432.
        Samsonov, Lagutin, Gabrié, Durmus, Naumov, Moulines (2022), "Local-Global MCMC kernels:
        the best of both worlds", NeurIPS, arXiv:2111.02702.

    Args:
        target: the energy target.
        flow: an unconditional :class:`~flows.Flow` on the target's event shape (the proposal).
        n_proposals: fresh proposals :math:`M` per chain and step.

    Example:
        >>> import torch
        >>> from flows import Flow, LULinear, StandardNormal
        >>> from flows.mcmc import sample
        >>> from flows.targets import Gaussian
        >>> kernel = ISIR(Gaussian(2), Flow(LULinear(2), StandardNormal(2)), n_proposals=4)
        >>> trace = sample(kernel, torch.zeros(8, 2), 10)
        >>> round(trace.accept_prob.mean().item(), 2)  # perfect proposal: P(stay) = 1 / 5
        0.8
    """

    def __init__(self, target: EnergyTarget, flow: Flow, n_proposals: int = 8) -> None:
        super().__init__(target, flow)
        check_count("ISIR", "n_proposals", n_proposals)
        self.n_proposals = n_proposals

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        n = state.chains
        y, log_q_y, log_pi_y = self._propose((self.n_proposals, n))
        log_q_x = self._log_q(state)
        log_w = torch.cat([(state.log_prob - log_q_x)[None], log_pi_y - log_q_y])  # (M + 1, chains)
        probs = torch.softmax(torch.nan_to_num(log_w, nan=-torch.inf), dim=0)
        index = torch.multinomial(probs.T, 1).squeeze(-1)
        accepted = index != 0
        chains = torch.arange(n, device=y.device)
        pick = (index - 1).clamp(min=0)
        y_pick, log_pi_pick, log_q_pick = y[pick, chains], log_pi_y[pick, chains], log_q_y[pick, chains]
        log_q = torch.where(accepted, log_q_pick, log_q_x)
        new = self._moved(state, accepted, y_pick, log_pi_pick, log_q)
        return new, StepInfo(1.0 - probs[0], accepted)

    def extra_repr(self) -> str:
        return f"n_proposals={self.n_proposals}"
