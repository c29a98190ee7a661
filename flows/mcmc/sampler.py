r"""The driver: :func:`sample` runs a kernel's chains through warm-up and sampling and records a :class:`Trace`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flows.flow import evaluating
from flows.mcmc.base import Kernel, State, StepInfo

__all__ = ["Trace", "sample"]


@dataclass(repr=False)
class Trace:
    r"""What :func:`sample` records.

    Attributes:
        samples: positions after each kept step, ``(draws, chains, *event_shape)``.
        log_prob: unnormalised :math:`\log\pi` of the samples, ``(draws, chains)``.
        accept_prob: acceptance probability of every sampling step, ``(steps, chains)``.
        accepted: whether each chain moved at every sampling step, ``(steps, chains)``.
        extras: further per-step statistics reported by the kernel (e.g. ``"local_accept_prob"``),
            each ``(steps, chains)``.
        warmup_accept_prob: acceptance probability of the warm-up steps, ``(warmup, chains)``.
        state: the final state (pass it to :func:`sample` to continue the chains).
        seconds: wall-clock time of the sampling phase.
        warmup_seconds: wall-clock time of the warm-up phase.
    """

    samples: Tensor
    log_prob: Tensor
    accept_prob: Tensor
    accepted: Tensor
    extras: dict[str, Tensor] = field(default_factory=dict)
    warmup_accept_prob: Tensor | None = None
    state: State | None = None
    seconds: float = 0.0
    warmup_seconds: float = 0.0

    def acceptance_rate(self) -> float:
        """Fraction of sampling steps in which a chain moved, over all chains."""
        return float(self.accepted.float().mean()) if self.accepted.numel() else float("nan")

    def __repr__(self) -> str:
        draws, chains = self.samples.shape[:2]
        return (
            f"Trace(draws={draws}, chains={chains}, event_shape={tuple(self.samples.shape[2:])}, "
            f"acceptance={self.acceptance_rate():.3f}, seconds={self.seconds:.2f})"
        )


def _stack(rows: list[Tensor], like: Tensor) -> Tensor:
    return torch.stack(rows) if rows else like.new_empty((0, *like.shape))


def sample(
    kernel: Kernel,
    start: Tensor | State,
    steps: int,
    *,
    warmup: int = 0,
    thin: int = 1,
    progress: bool = False,
    callback: Callable[[int, State, StepInfo], None] | None = None,
) -> Trace:
    r"""Run a batch of chains: ``warmup`` adapting steps, then ``steps`` recorded steps.

    During warm-up the kernel adapts (``kernel.step(state, adapt=True)``: dual-averaging step
    sizes, online flow training); :meth:`~flows.mcmc.Kernel.end_adaptation` then fixes the tuned
    parameters, and the sampling steps are plain Markov moves. Every ``thin``-th sampling step is
    kept in :attr:`Trace.samples`; acceptance is recorded at every step.

    Args:
        kernel: the Markov kernel.
        start: starting positions ``(chains, *event_shape)``, or the :attr:`Trace.state` of a
            previous run to continue it.
        steps: number of sampling steps (after warm-up).
        warmup: number of adapting warm-up steps.
        thin: keep every ``thin``-th sampling step.
        progress: show a progress bar (tqdm) with the running acceptance rate.
        callback: called as ``callback(i, state, info)`` after every step, ``i`` counting from 0
            over warm-up and sampling steps together (monitoring, snapshots of an adapting flow).

    Returns:
        The :class:`Trace`.

    Raises:
        ValueError: for negative step counts, ``thin < 1``, positions of the wrong shape, no
            chains, or starting positions that are not finite or have a non-finite energy.
        TypeError: for positions that are not a real floating-point tensor.

    Example:
        >>> import torch
        >>> from flows.mcmc import MALA
        >>> from flows.targets import Gaussian
        >>> trace = sample(MALA(Gaussian(2)), torch.zeros(10, 2), steps=40, warmup=20, thin=2)
        >>> trace.samples.shape, trace.accept_prob.shape
        (torch.Size([20, 10, 2]), torch.Size([40, 10]))
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"sample: expected a Kernel, got {type(kernel).__name__}")
    for name, value, low in (("steps", steps, 0), ("warmup", warmup, 0), ("thin", thin, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"sample: expected {name} to be an int >= {low}, got {value!r}")
    if isinstance(start, State):
        kernel.check_positions(start.x)
        kernel.check_start(start)
    elif not isinstance(start, Tensor):
        raise TypeError(f"sample: expected start to be a Tensor or a State, got {type(start).__name__}")
    with evaluating(kernel):  # flows and targets in eval mode once (online flow training switches itself)
        state = start if isinstance(start, State) else kernel.init(start)
        return _run(kernel, state, steps, warmup, thin, progress, callback)


def _run(
    kernel: Kernel,
    state: State,
    steps: int,
    warmup: int,
    thin: int,
    progress: bool,
    callback: Callable[[int, State, StepInfo], None] | None,
) -> Trace:
    from tqdm import tqdm  # imported on first use: keeps `import flows` fast

    bar = tqdm(total=warmup + steps, disable=not progress, desc="warm-up" if warmup else "sampling")
    warm_accept: list[Tensor] = []
    began = time.perf_counter()
    for i in range(warmup):
        state, info = kernel.step(state, adapt=True)
        warm_accept.append(info.accept_prob)
        if callback is not None:
            callback(i, state, info)
        bar.update()
        if progress and (i % 10 == 9 or i == warmup - 1):
            bar.set_postfix(accept=f"{float(info.accept_prob.mean()):.3f}")
    if warmup:
        kernel.end_adaptation()
    warmup_seconds = time.perf_counter() - began
    bar.set_description("sampling")

    samples, log_probs, accept, accepted = [], [], [], []
    extras: dict[str, list[Tensor]] = {}
    began = time.perf_counter()
    for i in range(steps):
        state, info = kernel.step(state)
        if callback is not None:
            callback(warmup + i, state, info)
        accept.append(info.accept_prob)
        accepted.append(info.accepted)
        for key, value in info.extras.items():
            extras.setdefault(key, []).append(value)
        if (i + 1) % thin == 0:
            samples.append(state.x)
            log_probs.append(state.log_prob)
        bar.update()
        if progress and (i % 10 == 9 or i == steps - 1):
            bar.set_postfix(accept=f"{float(torch.stack(accepted[-10:]).float().mean()):.3f}")
    seconds = time.perf_counter() - began
    bar.close()

    chains = state.log_prob
    return Trace(
        samples=_stack(samples, state.x),
        log_prob=_stack(log_probs, chains),
        accept_prob=_stack(accept, chains),
        accepted=_stack(accepted, chains.bool()),
        extras={key: torch.stack(values) for key, values in extras.items()},
        warmup_accept_prob=_stack(warm_accept, chains),
        state=state,
        seconds=seconds,
        warmup_seconds=warmup_seconds,
    )
