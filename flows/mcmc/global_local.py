r"""Global–local sampling: flow-proposal moves alternated with local moves, the flow trained online.

This is the adaptive scheme of Gabrié, Rotskoff and Vanden-Eijnden (2022) ("flowMC"): local
moves explore each basin, flow moves (:class:`~flows.mcmc.IMH` or :class:`~flows.mcmc.ISIR`)
jump between basins, and during warm-up the flow is fitted by maximum likelihood (forward KL)
to the chains' recent positions, so that the proposal improves as the chains equilibrate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flows._validation import check_count
from flows.mcmc.base import Kernel, State, StepInfo
from flows.mcmc.independent import _FlowProposal

__all__ = ["GlobalLocal"]


class GlobalLocal(Kernel):
    r"""One flow move followed by ``local_steps`` local moves; optionally trains the flow during warm-up.

    Each step applies the global kernel :math:`P_g` (a flow proposal) once, then the local kernel
    :math:`P_l` ``local_steps`` times: :math:`P = P_g P_l^k`, :math:`\pi`-invariant since both are.

    With ``train=True``, every warm-up step (``adapt=True``) stores the chains' positions after
    each move in a memory of the last ``memory`` moves and then takes ``train_steps`` optimiser
    steps on the forward-KL (maximum-likelihood) loss

    .. math:: \mathcal L(\theta) = -\frac{1}{B}\sum_{b=1}^{B} \log q_\theta(x_b),

    :math:`x_b` drawn uniformly from the memory. After warm-up the flow is frozen (continued
    adaptation would break the Markov property). The IMH/i-SIR cache of :math:`\log q` notices
    the parameter change, so training never leaves a stale density in use.

    The local kernel is adapted too during warm-up (its step size by dual averaging).

    References:
        Gabrié, Rotskoff, Vanden-Eijnden (2022), "Adaptive Monte Carlo augmented with normalizing
        flows", PNAS 119, arXiv:2105.12603. Grenioux, Durmus, Moulines, Gabrié (2023), "On
        Sampling with Approximate Transport Maps", ICML, arXiv:2302.04763.

    Args:
        global_kernel: an :class:`~flows.mcmc.IMH` or :class:`~flows.mcmc.ISIR` kernel (its flow is
            the one trained).
        local_kernel: any kernel on the same target (MALA, HMC, RandomWalk, NeuTra).
        local_steps: local moves per step.
        train: fit the flow to the chains during warm-up.
        lr: Adam learning rate (ignored when ``optimizer`` is given).
        train_steps: optimiser steps per warm-up step.
        batch_size: positions per optimiser step.
        memory: number of most recent moves whose positions are kept for training.
        optimizer: the optimiser of the flow's parameters (default: Adam with ``lr``); save its
            ``state_dict()`` with the kernel's to resume a warm-up.

    Example:
        >>> import torch
        >>> from flows import RealNVP
        >>> from flows.mcmc import IMH, MALA, sample
        >>> from flows.targets import Gaussian
        >>> target = Gaussian(2, loc=2.0)
        >>> kernel = GlobalLocal(IMH(target, RealNVP(2, transforms=2, hidden=(16,))), MALA(target), train=True)
        >>> trace = sample(kernel, torch.full((32, 2), 2.0), 10, warmup=20)
        >>> len(kernel.losses), sorted(trace.extras)
        (20, ['local_accept_prob'])
    """

    def __init__(
        self,
        global_kernel: _FlowProposal,
        local_kernel: Kernel,
        *,
        local_steps: int = 5,
        train: bool = False,
        lr: float = 1e-3,
        train_steps: int = 1,
        batch_size: int = 256,
        memory: int = 50,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if not isinstance(global_kernel, _FlowProposal):
            raise TypeError(f"GlobalLocal: expected an IMH or ISIR global kernel, got {type(global_kernel).__name__}")
        if not isinstance(local_kernel, Kernel):
            raise TypeError(f"GlobalLocal: expected a Kernel as local_kernel, got {type(local_kernel).__name__}")
        if local_kernel.target is not global_kernel.target:
            raise ValueError("GlobalLocal: expected the global and local kernels to share one target object")
        for name, value in (("local_steps", local_steps), ("train_steps", train_steps)):
            check_count("GlobalLocal", name, value, minimum=0)
        for name, value in (("batch_size", batch_size), ("memory", memory)):
            check_count("GlobalLocal", name, value)
        super().__init__(global_kernel.target)
        self.global_kernel, self.local_kernel = global_kernel, local_kernel
        self.local_steps, self.train_flow, self.train_steps = local_steps, train, train_steps
        self.batch_size, self.memory = batch_size, memory
        if train and optimizer is None:
            optimizer = torch.optim.Adam(global_kernel.flow.parameters(), lr=lr)
        self.optimizer = optimizer
        self.losses: list[float] = []
        self._memory: list[Tensor] = []

    @property
    def flow(self) -> torch.nn.Module:
        """The flow of the global kernel."""
        return self.global_kernel.flow

    def init(self, x: Tensor) -> State:
        self.check_positions(x)
        return self.check_start(self.local_kernel.init(x))

    def _remember(self, x: Tensor) -> None:
        self._memory.append(x.detach().reshape(-1, *self.event_shape))
        if len(self._memory) > self.memory:
            del self._memory[0]

    def _train(self) -> None:
        data = torch.cat(self._memory)
        flow = self.flow
        was_training = flow.training
        flow.train()
        for _ in range(self.train_steps):
            batch = data[torch.randint(len(data), (min(self.batch_size, len(data)),), device=data.device)]
            loss = -flow.log_prob(batch).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.losses.append(float(loss.detach()))
        flow.train(was_training)

    def step(self, state: State, *, adapt: bool = False) -> tuple[State, StepInfo]:
        training = adapt and self.train_flow and self.train_steps > 0
        state, info = self.global_kernel.step(state, adapt=adapt)
        if training:
            self._remember(state.x)
        local = []
        for _ in range(self.local_steps):
            state, local_info = self.local_kernel.step(state, adapt=adapt)
            local.append(local_info.accept_prob)
            if training:
                self._remember(state.x)
        if training:
            self._train()
        extras = {"local_accept_prob": torch.stack(local).mean(0)} if local else {}
        return state, StepInfo(info.accept_prob, info.accepted, extras)

    def end_adaptation(self) -> None:
        self.global_kernel.end_adaptation()
        self.local_kernel.end_adaptation()
        self._memory.clear()

    def extra_repr(self) -> str:
        return f"local_steps={self.local_steps}, train={self.train_flow}"
