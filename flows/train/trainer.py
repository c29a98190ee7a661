r"""The training loop shared by every objective: :class:`Trainer`.

The objective computes the loss of a batch; each step makes one call into it,
``objective(model, batch) -> loss | (loss, metrics)``, with the batch already on the model's device
(the protocol, with shapes, is in :mod:`flows.train.objectives`). The loop does the rest
identically for all objectives: optimizer steps, clipping, schedules, auxiliary losses, validation
in eval mode, the NaN guard, callbacks, history, progress, atomic checkpoints with exact resume
(the trainer's whole state is :meth:`Trainer.state_dict`), and multi-process data parallelism (see
``docs/guide/training.md``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from flows.bijections.auxiliary import AuxiliaryLosses
from flows.data.loader import TensorLoader
from flows.flow import evaluating
from flows.train._compile import CompiledForward, CompilerRejected, compile_options
from flows.train._lock import hold_run_lock
from flows.train.batching import (
    Data,
    as_tensors,
    batch_size_of,
    epoch_batches,
    on_device,
    steps_in_epoch,
    train_loader,
    val_loader,
)
from flows.train.callbacks import Callback, bar_output, progress_bar
from flows.train.checkpoint import capture_rng_state, restore_rng_state, training_state_problem
from flows.train.distributed import ObjectiveModule, all_reduce_weighted_mean, get_rank, get_world_size
from flows.train.guard import (
    NonFiniteGuard,
    TrainingDiverged,
    all_finite,
    global_grad_norm,
    state_tensors,
)
from flows.train.history import History
from flows.train.objectives import MaximumLikelihood, Objective, ObjectiveOutput, objective_output
from flows.train.resume import resume_trainer, save_trainer, stop_on_signals

__all__ = ["FIRST_CHECKPOINT_SECONDS", "Trainer"]

FIRST_CHECKPOINT_SECONDS = 5.0
"""Seconds of training after which a session writes its first checkpoint (if its first epoch has not ended yet)."""


class Trainer:
    r"""Train a model by minimising an objective over batches, with validation, checkpoints and a NaN guard.

    Args:
        model: the model (for :class:`~flows.train.MaximumLikelihood`, anything with ``log_prob``).
        objective: the loss of a batch (default: maximum likelihood on continuous data).
        optimizer: an optimizer over the model's parameters, or a factory ``params -> optimizer``
            (default: :func:`default_optimizer`, Adam with learning rate ``lr``).
        lr: learning rate of the default optimizer.
        scheduler: a learning-rate scheduler or a factory ``optimizer -> scheduler``.
        scheduler_interval: step the scheduler after every ``"epoch"`` or every ``"step"``.
        clip_grad_norm: clip the global gradient norm to this value (``None``: no clipping; the
            norm is still computed, for the guard and the ``grad_norm`` metric).
        guard: the NaN/Inf guard (``None`` for the default :class:`NonFiniteGuard`, ``False`` to
            disable it: then a non-finite loss raises at once).
        callbacks: :class:`~flows.train.callbacks.Callback` instances, called in order.
        progress: show a ``tqdm`` bar (``None``: only when standard error is a terminal).
        checkpoint: file to write resumable checkpoints to (``None``: no checkpoints).
        checkpoint_every: seconds between checkpoints (also written at the end of :meth:`fit`).
        checkpoint_every_steps: also write a checkpoint every this many steps.
        config: model config stored in checkpoints so that :func:`flows.load_model` can rebuild
            the model (:func:`flows.model_file.describe_model`).
        info: extra JSON facts stored in checkpoint headers (data set name, ...).
        find_unused_parameters: passed to ``DistributedDataParallel`` in multi-process runs.
        compile: run the objective under :func:`torch.compile` (``True``, or a dict of its keyword
            arguments, e.g. ``{"backend": "aot_eager"}``). The inductor backend fuses the elementwise
            work of coupling layers; it needs a C++ compiler, and the first steps pay for
            compilation (seconds to a minute). Random draws inside the objective (dequantization
            noise) use PyTorch's eager generator (``fallback_random``), so seeding works as usual.
            A model the compiler rejects (with torch 2.13: ``NSF``, ``FFJORD``) is trained eagerly
            after a :class:`TrainingWarning`, exactly as without ``compile``.

    Example:
        >>> import torch
        >>> from flows import RealNVP
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> data = torch.randn(256, 2) * torch.tensor([2.0, 0.5])
        >>> trainer = Trainer(RealNVP(2, transforms=2, hidden=(16,)), lr=1e-2)
        >>> history = trainer.fit(data[:200], data[200:], epochs=3, batch_size=50)
        >>> len(history), sorted(history.last())[:3]
        (3, ['epoch', 'grad_norm', 'loss'])
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective | Callable[..., Any] | None = None,
        *,
        optimizer: Optimizer | Callable[[Iterable[nn.Parameter]], Optimizer] | None = None,
        lr: float = 1e-3,
        scheduler: Any = None,
        scheduler_interval: str = "epoch",
        clip_grad_norm: float | None = None,
        guard: NonFiniteGuard | bool | None = None,
        callbacks: Sequence[Callback] = (),
        progress: bool | None = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: float = 30.0,
        checkpoint_every_steps: int | None = None,
        config: dict[str, Any] | None = None,
        info: dict[str, Any] | None = None,
        find_unused_parameters: bool = False,
        compile: bool | dict[str, Any] = False,
    ) -> None:
        _check_arguments(model, scheduler_interval, clip_grad_norm, callbacks, compile)
        self.model = model
        self._parallel: nn.Module | None = None  # the DDP module of a multi-process run
        self.objective = objective if objective is not None else MaximumLikelihood()
        params = [p for p in model.parameters() if p.requires_grad]
        if isinstance(optimizer, Optimizer):
            self.optimizer = optimizer
        elif optimizer is None:
            self.optimizer = default_optimizer(params, lr)
        else:
            self.optimizer = optimizer(params)
        self.scheduler = (
            scheduler(self.optimizer) if callable(scheduler) and not hasattr(scheduler, "step") else scheduler
        )
        self.scheduler_interval = scheduler_interval
        self.clip_grad_norm = clip_grad_norm
        self.guard: NonFiniteGuard | None = (
            NonFiniteGuard() if guard is None or guard is True else (guard if guard is not False else None)
        )
        self.callbacks = list(callbacks)
        self.progress = progress
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.checkpoint_every = checkpoint_every
        self.checkpoint_every_steps = checkpoint_every_steps
        self.config, self.info = config, dict(info or {})
        self._start_counters()
        self.rank, self.world_size = get_rank(), get_world_size()
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self._params = params
        _check_objective_parameters(self.objective, self.optimizer)
        self._forward = self._build_forward(find_unused_parameters, compile)

    def _start_counters(self) -> None:
        """The history, counters and stop flags of a new run."""
        self.history = History()
        self.epoch = 0  # completed epochs
        self.epoch_step = 0  # steps done in the current epoch
        self.step = 0  # steps done in total (skipped ones included)
        self.elapsed = 0.0  # training seconds over all sessions of this run
        self.should_stop = False
        self.interrupted: int | None = None  # the signal that stopped the last fit (SIGINT, SIGTERM, SIGHUP), if any
        self.epochs_target: int | None = None
        self._epoch_sums: dict[str, float] = {}
        self._epoch_count = 0

    def _build_forward(
        self, find_unused_parameters: bool, compile: bool | dict[str, Any]
    ) -> Callable[[object], ObjectiveOutput]:
        """The step's call into the objective.

        ``objective(model, batch)`` itself, through DDP in a multi-process run (its module's forward
        is that call) and ``torch.compile`` when asked for.
        """
        forward: Callable[[object], ObjectiveOutput] = self._call_objective
        if self.world_size > 1:
            self._parallel = ObjectiveModule(self.model, self._objective).parallel(self.device, find_unused_parameters)
            forward = self._parallel
        if compile is not False:
            forward = CompiledForward(forward, compile)
        return forward

    # -- properties ------------------------------------------------------------------------------
    @property
    def is_main_process(self) -> bool:
        """Whether this process writes files (rank 0)."""
        return self.rank == 0

    @property
    def objective(self) -> Objective | Callable[..., Any]:
        """The objective: a callable ``objective(model, batch) -> loss | (loss, metrics)`` (assignable between fits)."""
        return self._objective

    @objective.setter
    def objective(self, objective: Objective | Callable[..., Any]) -> None:
        if not callable(objective):
            raise TypeError(f"Trainer: expected a callable objective(model, batch), got {type(objective).__name__}")
        self._objective = objective
        if hasattr(self, "optimizer"):  # a replacement after construction
            _check_objective_parameters(objective, self.optimizer)
        if self._parallel is not None:  # the DDP module calls its own reference
            delattr(self._parallel.module, "objective")  # (a module objective is a submodule there)
            self._parallel.module.objective = objective

    @property
    def lr(self) -> float:
        """Current learning rate of the first parameter group."""
        return float(self.optimizer.param_groups[0]["lr"])

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs, as tensors and plain containers (what checkpoints hold).

        The entries (the on-disk layout of training checkpoints, see :mod:`flows.train.checkpoint`):

        * ``"trainer"``: the counters ``epoch`` (completed epochs), ``epoch_step`` (the position
          inside the current epoch, which is also the data loader's position), ``step``,
          ``elapsed`` (training seconds), and the running sums of the unfinished epoch's metrics
          (``epoch_sums``, ``epoch_count``);
        * ``"model"``, ``"optimizer"``, ``"scheduler"`` (``None`` without one), ``"guard"`` (the NaN
          guard's counters, ``None`` without a guard; its in-memory snapshot is not saved: a loaded
          trainer snapshots its loaded state when :meth:`fit` starts), ``"callbacks"`` (one state
          per callback, in order), ``"history"``;
        * ``"rng"``: the states of torch's (CPU and CUDA), NumPy's and Python's global generators,
          which drive shuffling, dequantization noise and any sampling inside the objective;
        * ``"objective"``: the objective's ``state_dict`` when it is an ``nn.Module`` with state (the
          projector of :class:`~flows.train.RepresentationAlignment`), ``None`` otherwise.

        As with :meth:`torch.nn.Module.state_dict`, model and optimizer tensors are references,
        not copies: copy the dict (``copy.deepcopy``) to keep it while training goes on.
        Everything loads under ``torch.load(weights_only=True)``.

        Taken between steps (in a callback, or after :meth:`fit` returns) it continues exactly.
        After :meth:`fit`, though, a callback that loads the best weights at the end
        (:class:`~flows.train.EarlyStopping`) has replaced the training weights: the checkpoint
        that :meth:`fit` writes before ``on_fit_end``, or a state taken in the ``on_fit_end`` of a
        callback listed before it, holds the training state.
        """
        return {
            "trainer": {
                "epoch": self.epoch,
                "epoch_step": self.epoch_step,
                "step": self.step,
                "elapsed": self.elapsed,
                "epoch_sums": dict(self._epoch_sums),
                "epoch_count": self._epoch_count,
            },
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "guard": self.guard.state_dict() if self.guard is not None else None,
            "callbacks": [cb.state_dict() for cb in self.callbacks],
            "history": self.history.state_dict(),
            "rng": capture_rng_state(),
            "objective": _objective_state(self.objective),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the next :meth:`fit` continues that run exactly.

        The trainer must have the same kind of model, optimizer, scheduler and the same callbacks
        as the one that saved ``state``; call :meth:`fit` with the same data, batch size and seed.
        The global random generators are set to the saved states.

        Raises:
            ValueError: for a state that lacks entries, holds state for another number of
                callbacks, or lacks the state of an objective that has some (or has objective state
                this trainer's objective cannot take); errors of the model's, optimizer's or
                scheduler's ``load_state_dict`` propagate.
        """
        problem = training_state_problem(state)
        if problem is not None:
            raise ValueError(f"Trainer.load_state_dict: {problem}")
        if len(state["callbacks"]) != len(self.callbacks):
            raise ValueError(
                f"Trainer.load_state_dict: the state has state for {len(state['callbacks'])} callbacks, this trainer "
                f"has {len(self.callbacks)}; resume with the same callbacks"
            )
        _check_objective_state(self.objective, state.get("objective"))  # before anything is changed
        counters = state["trainer"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.guard is not None and state["guard"] is not None:
            self.guard.load_state_dict(state["guard"])
        for cb, cb_state in zip(self.callbacks, state["callbacks"], strict=True):
            cb.load_state_dict(cb_state)
        if state.get("objective") is not None:
            self.objective.load_state_dict(state["objective"])
        self.history.load_state_dict(state["history"])
        self.epoch, self.epoch_step = int(counters["epoch"]), int(counters["epoch_step"])
        self.step = int(counters["step"])
        self.elapsed = float(counters["elapsed"])
        self._epoch_sums = {str(k): float(v) for k, v in counters["epoch_sums"].items()}
        self._epoch_count = int(counters["epoch_count"])
        restore_rng_state(state["rng"])

    def save(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write a resumable checkpoint atomically (rank 0 only; returns the path, ``None`` elsewhere)."""
        return save_trainer(self, path)

    def resume(self, path: str | os.PathLike | None = None) -> Trainer:
        """Load a checkpoint written by :meth:`save`; the next :meth:`fit` continues the same run.

        Call :meth:`fit` with the same data, batch size, seed and callbacks as the original run;
        ``epochs``, ``max_steps`` and ``time_budget`` count the whole run, not the resumed part.
        """
        resume_trainer(self, path)
        return self

    # -- the loop --------------------------------------------------------------------------------
    def fit(
        self,
        train: Data = None,
        val: Data = None,
        *,
        epochs: int | None = None,
        batch_size: int = 128,
        val_batch_size: int | None = None,
        max_steps: int | None = None,
        time_budget: float | None = None,
        steps_per_epoch: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> History:
        """Train until ``epochs``, ``max_steps`` or ``time_budget`` (whichever comes first) or a callback stops.

        Args:
            train: training data: a tensor, a tuple ``(x, context)`` of tensors, a
                :class:`~flows.data.TensorLoader`, any iterable of batches (re-iterated every
                epoch; resuming mid-epoch is exact only for tensors and ``TensorLoader``), or
                ``None`` for objectives that need no data (then give ``steps_per_epoch``).
            val: validation data in the same forms (``None``: no validation).
            epochs: total number of epochs of the run (a resumed run counts the epochs before).
            batch_size: samples per optimizer step, over all processes together.
            val_batch_size: samples per validation batch (per process; default ``max(batch_size, 1024)``).
            max_steps: total number of steps of the run.
            time_budget: seconds of training over the whole run (checked after every step).
            steps_per_epoch: steps per epoch when ``train`` is ``None``.
            seed: seed of the shuffling of tensor data.
            shuffle: shuffle tensor data every epoch.

        Returns:
            The metrics history (one record per epoch; a run stopped mid-epoch adds a record with a
            fractional epoch).

        Raises:
            ValueError: when no stopping rule is given or ``train=None`` without ``steps_per_epoch``.
            TrainingDiverged: when the NaN guard runs out of rollbacks.
        """
        if epochs is None and max_steps is None and time_budget is None:
            raise ValueError("Trainer.fit: expected at least one of epochs, max_steps or time_budget")
        if train is None and not steps_per_epoch:
            raise ValueError("Trainer.fit: expected steps_per_epoch when there is no training data (train=None)")
        loader = train_loader(train, batch_size, seed, shuffle, self.rank, self.world_size)
        validation = val_loader(val, val_batch_size or max(batch_size, 1024), self.rank, self.world_size)
        with contextlib.ExitStack() as run:
            if self.checkpoint is not None and self.is_main_process:  # one writer per checkpoint
                run.enter_context(hold_run_lock(self.checkpoint))
            try:
                self._loop(loader, validation, epochs, max_steps, time_budget, steps_per_epoch)
            except TrainingDiverged as error:
                kept = self.checkpoint is not None and self.checkpoint.is_file()
                where = (
                    f"the last good checkpoint, {str(self.checkpoint)!r}, is kept"
                    if kept
                    else "no checkpoint was written"
                )
                raise TrainingDiverged(f"{error}; {where}") from None
        return self.history

    def _loop(
        self,
        loader: Any,
        validation: Any,
        epochs: int | None,
        max_steps: int | None,
        time_budget: float | None,
        steps_per_epoch: int | None,
    ) -> None:
        """The body of :meth:`fit`: epochs of steps, validation, checkpoints, callbacks."""
        per_epoch = steps_in_epoch(loader, steps_per_epoch)
        self.epochs_target = epochs
        self.should_stop = False
        self.interrupted = None
        session = _Session(start=time.perf_counter(), elapsed_before=self.elapsed, last_save=time.perf_counter())
        session.bar = progress_bar(self.progress, self.is_main_process, epochs, per_epoch, max_steps, self.step)
        if not self.model.training:  # submodules a user put in eval mode on a training model stay so
            self.model.train()
        if self.guard is not None:
            self.guard.snapshot(self.model, self.optimizer, self.scheduler)
        for cb in self.callbacks:
            cb.on_fit_start(self)
        stop_reason = None
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(stop_on_signals(self))
            stack.enter_context(bar_output(session.bar))  # logs and warnings above the bar
            while stop_reason is None:
                if epochs is not None and self.epoch >= epochs:
                    stop_reason = "epochs"
                    break
                stop_reason = self._epoch(
                    loader, validation, session, per_epoch, max_steps, time_budget, steps_per_epoch
                )
        finally:
            stack.close()
            if session.bar is not None:
                session.bar.close()
        if self.checkpoint is not None:  # the exact training state, before callbacks restore best weights
            self.save()
        for cb in self.callbacks:
            cb.on_fit_end(self)

    def _epoch(
        self,
        loader: Any,
        validation: Any,
        session: _Session,
        per_epoch: int | None,
        max_steps: int | None,
        time_budget: float | None,
        steps_per_epoch: int | None,
    ) -> str | None:
        """The rest of the current epoch (or until a stop), then its end; returns why training stops, if it does."""
        if self.epoch_step == 0:
            for cb in self.callbacks:
                cb.on_epoch_start(self)
        stop_reason, finished_epoch, served = self._epoch_steps(
            loader, session, per_epoch, max_steps, time_budget, steps_per_epoch
        )
        if served == 0 and self.epoch_step == 0:
            raise ValueError(
                "Trainer.fit: the training data yielded no batch in an epoch (fewer samples than processes, "
                "or drop_last with fewer samples than batch_size)"
            )
        if finished_epoch:
            self.epoch += 1
            self.epoch_step = 0
        fraction = None if finished_epoch else (self.epoch_step / per_epoch if per_epoch else 0.0)
        self._end_epoch(validation, fraction)
        if self.should_stop and stop_reason is None:
            stop_reason = "callback"
        if self.checkpoint is not None and (
            not session.saved or self._checkpoint_due(time.perf_counter() - session.last_save, session.saved)
        ):  # the first checkpoint of a session at the latest after its first epoch
            self.save()
            session.last_save, session.saved = time.perf_counter(), True
        return stop_reason

    def _epoch_steps(
        self,
        loader: Any,
        session: _Session,
        per_epoch: int | None,
        max_steps: int | None,
        time_budget: float | None,
        steps_per_epoch: int | None,
    ) -> tuple[str | None, bool, int]:
        """The steps of the current epoch until it ends or a stop: ``(stop reason, epoch finished, batches served)``."""
        stop_reason, finished_epoch, served = None, True, 0
        bar = session.bar
        for batch in epoch_batches(loader, self.epoch, self.epoch_step, steps_per_epoch, self.device):
            served += 1
            metrics = self._step(batch)
            self.epoch_step += 1
            self.elapsed = session.elapsed_before + time.perf_counter() - session.start
            for cb in self.callbacks:
                cb.on_step_end(self, metrics)
            if bar is not None:
                bar.update(1)
                if self.step % 25 == 0:
                    bar.set_postfix(loss=f"{metrics['loss']:.4g}", refresh=False)
            want_stop = (max_steps is not None and self.step >= max_steps) or (
                time_budget is not None and self.elapsed >= time_budget
            )
            if self._agree(want_stop or self.should_stop):
                stop_reason = "callback" if self.should_stop else "budget"
                finished_epoch = per_epoch is not None and self.epoch_step >= per_epoch
                break
            if self.checkpoint is not None and (
                self._checkpoint_due(time.perf_counter() - session.last_save, session.saved)
                or (self.checkpoint_every_steps and self.step % self.checkpoint_every_steps == 0)
            ):
                self.save()
                session.last_save, session.saved = time.perf_counter(), True
        return stop_reason, finished_epoch, served

    def _checkpoint_due(self, since_last: float, saved: bool) -> bool:
        """Whether ``since_last`` seconds since the last save call for a checkpoint.

        The interval is ``checkpoint_every``, and for a session's first checkpoint the smaller of that
        and :data:`FIRST_CHECKPOINT_SECONDS`, so that a run killed early keeps its first seconds.
        """
        interval = self.checkpoint_every if saved else min(self.checkpoint_every, FIRST_CHECKPOINT_SECONDS)
        return since_last >= interval

    def release_distributed(self) -> None:
        """Drop the ``DistributedDataParallel`` wrapper of a multi-process run (a no-op otherwise).

        Call it before leaving the process group (:func:`~flows.train.distributed.cleanup_distributed`):
        a wrapper that is destroyed after its process group can hang its process on exit. The
        trainer keeps its model, history and state; a later :meth:`fit` trains without the group.
        """
        if self.world_size == 1:
            return
        self._parallel = None
        self._forward = self._call_objective
        self.world_size = 1  # the rank stays: only rank 0 writes files

    def _agree(self, flag: bool) -> bool:
        """``flag`` on any process means stop on every process."""
        if self.world_size == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def _call_objective(self, batch: object) -> ObjectiveOutput:
        """``objective(model, batch)``: the eager form of the step's call into the objective."""
        return self._objective(self.model, batch)

    def _objective_loss(self, batch: object) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One call into the objective, with the auxiliary losses the model's layers add during it.

        Returns:
            ``(loss, total, metrics)``: the objective's loss, the loss to minimise (``loss`` plus
            the auxiliary terms), and the metrics to log (the objective's and ``aux_<name>``).
        """
        try:
            with AuxiliaryLosses() as aux:
                out = self._forward(batch)
        except CompilerRejected:  # warned; the same step again, eagerly, without the failed attempt's terms
            with AuxiliaryLosses() as aux:
                out = self._forward(batch)
        loss, metrics = objective_output(out)
        if not len(aux):
            return loss, loss, metrics
        extra = {f"aux_{name}": value.detach() for name, value in aux.by_name().items()}
        return loss, loss + aux.total(), {**metrics, **extra}

    def _step(self, batch: object) -> dict[str, float]:
        """One optimizer step on ``batch`` (already on the model's device), guarded against non-finite values."""
        self.step += 1
        loss, total, metrics = self._objective_loss(batch)
        value = float(total.detach())
        finite = math.isfinite(value)
        if not finite and self.guard is None:
            raise FloatingPointError(f"step {self.step}: non-finite loss {value} (the NaN guard is off)")
        self.optimizer.zero_grad(set_to_none=True)
        grad_norm = math.nan
        if finite or self.world_size > 1:  # in multi-process runs every process joins the gradient all-reduce
            total.backward()
            grad_norm = global_grad_norm(self._params, self.clip_grad_norm)
        ok = finite and math.isfinite(grad_norm)
        if self.world_size > 1:
            ok = not self._agree(not ok)
        reason = "non-finite loss" if not finite else "non-finite gradient"
        if ok:
            self.optimizer.step()
            # A finite gradient can still give non-finite weights or moments (lr=inf, huge steps): undo such a step.
            ok = all_finite(state_tensors(self.model, self.optimizer))
            if self.world_size > 1:
                ok = not self._agree(not ok)
            if not ok:
                reason = "non-finite parameters or optimizer state after the update"
                if self.guard is None:
                    raise FloatingPointError(f"step {self.step}: {reason} (the NaN guard is off)")
                undone = self.guard.undo(self.model, self.optimizer, self.step)
                if undone is not None:
                    self.history.event(self.step, undone)
        if ok:
            if self.scheduler is not None and self.scheduler_interval == "step":
                self.scheduler.step()
            if self.guard is not None:
                self.guard.good_step(self.model, self.optimizer, self.scheduler)
            self._accumulate(loss, metrics, grad_norm, batch_size_of(batch))
        else:
            self.optimizer.zero_grad(set_to_none=True)
            if self.guard is None:
                raise FloatingPointError(f"step {self.step}: non-finite gradient norm (the NaN guard is off)")
            message = self.guard.bad_step(self.model, self.optimizer, self.step, reason, self.scheduler)
            self._epoch_sums["skipped"] = self._epoch_sums.get("skipped", 0.0) + 1
            if message is not None:
                self.history.event(self.step, message)
        return {"loss": float(loss.detach()), "skipped": float(not ok)}

    def _accumulate(self, loss: Tensor, metrics: dict[str, Tensor], grad_norm: float, n: int) -> None:
        sums = self._epoch_sums
        sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) * n
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value) * n
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm * n
        self._epoch_count += n

    def _end_epoch(self, validation: object, fraction: float | None) -> None:
        sums, count = self._epoch_sums, self._epoch_count
        record: dict[str, float] = {"epoch": self.epoch if fraction is None else self.epoch + fraction}
        record["step"] = self.step
        means = {k: v / count for k, v in sums.items() if k != "skipped"} if count else {}
        means = all_reduce_weighted_mean(means, float(count), self.device)
        record.update(means)
        if sums.get("skipped"):
            record["skipped"] = sums["skipped"]
        if validation is not None:
            record.update({f"val_{k}": v for k, v in self.evaluate(validation).items()})
        record["lr"] = self.lr
        record["time"] = self.elapsed
        self.history.append(record)
        if fraction is None:
            self._epoch_sums, self._epoch_count = {}, 0
        if self.scheduler is not None and self.scheduler_interval == "epoch" and fraction is None:
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(record.get("val_loss", record.get("loss", math.inf)))
            else:
                self.scheduler.step()
        if fraction is None:  # callbacks (early stopping, ...) judge whole epochs only, as an uninterrupted run would
            for cb in self.callbacks:
                cb.on_epoch_end(self, record)

    def evaluate(self, data: Data, *, batch_size: int = 1024) -> dict[str, float]:
        """The objective's validation measures on ``data``, in eval mode, without gradients.

        In multi-process runs each process evaluates its share and the results are averaged.
        """
        loader = (
            data
            if isinstance(data, TensorLoader) or as_tensors(data) is None
            else val_loader(data, batch_size, self.rank, self.world_size)
        )
        count = loader.num_samples if isinstance(loader, TensorLoader) else 1
        with evaluating(self.model), torch.no_grad():
            batches = on_device(loader, self.device)
            evaluate = getattr(self._objective, "evaluate", None)
            if evaluate is None:  # a plain callable objective: average its loss
                metrics = Objective.evaluate(self._objective, self.model, batches)
            else:
                metrics = evaluate(self.model, batches)
        return all_reduce_weighted_mean(metrics, float(count), self.device)


def _check_arguments(
    model: object, scheduler_interval: str, clip_grad_norm: float | None, callbacks: Sequence[object], compile: object
) -> None:
    """Refuse the :class:`Trainer` arguments that are wrong before anything is built."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"Trainer: expected an nn.Module as model, got {type(model).__name__}")
    if scheduler_interval not in ("epoch", "step"):
        raise ValueError(f"Trainer: expected scheduler_interval 'epoch' or 'step', got {scheduler_interval!r}")
    if clip_grad_norm is not None and not clip_grad_norm > 0:
        raise ValueError(f"Trainer: expected clip_grad_norm > 0 or None, got {clip_grad_norm}")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"Trainer: expected Callback instances, got {type(cb).__name__}")
    if compile is not False:
        compile_options(compile)  # refuse bad options before anything is built


def _objective_state(objective: object) -> dict[str, Any] | None:
    """The objective's ``state_dict`` when it is a module with parameters or buffers, else ``None``."""
    if isinstance(objective, nn.Module):
        state = objective.state_dict()
        return state if state else None
    return None


def _check_objective_state(objective: object, saved: dict[str, Any] | None) -> None:
    """Refuse an objective state that would leave the objective's parameters fresh, or that has no home."""
    name = type(objective).__name__
    if saved is None:
        if _objective_state(objective) is not None:
            raise ValueError(
                f"Trainer.load_state_dict: the objective {name} has parameters or buffers, but the state holds none "
                "for it (written by an older flows, or by a trainer with another objective); resuming would "
                "silently restart them"
            )
        return
    if not isinstance(objective, nn.Module):
        raise ValueError(
            f"Trainer.load_state_dict: the state holds objective parameters {sorted(saved)[:3]}, but the objective "
            f"{name} is not an nn.Module to take them; resume with the objective that wrote it"
        )


def _check_objective_parameters(objective: object, optimizer: Optimizer) -> None:
    """Refuse an objective whose trainable parameters the optimizer does not hold: they would never learn."""
    if not isinstance(objective, nn.Module):
        return
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in objective.named_parameters() if p.requires_grad and id(p) not in held]
    if missing:
        raise ValueError(
            f"Trainer: the objective {type(objective).__name__} has trainable parameters the optimizer does not hold "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); pass "
            "optimizer=lambda params: torch.optim.Adam([*params, *objective.parameters()])"
        )


@dataclass
class _Session:
    """The clocks of one :meth:`Trainer.fit` call (a session of a possibly resumed run) and its progress bar."""

    start: float  # time.perf_counter() when the session started
    elapsed_before: float  # training seconds of the run before this session
    last_save: float  # time.perf_counter() of the last checkpoint (the start, before the first)
    saved: bool = False  # the first checkpoint of a session comes early (see Trainer._checkpoint_due)
    bar: Any = None  # the tqdm bar, or None


def default_optimizer(params: Iterable[nn.Parameter], lr: float = 1e-3) -> Optimizer:
    """Adam with learning rate ``lr``, in its fused single-kernel form where the parameters allow it.

    The fused implementation updates every parameter in one pass per tensor, faster than the
    multi-tensor (``foreach``) one on CPU (measured in ``docs/guide/training.md``).
    Complex parameters, or parameters on devices other than CPU and CUDA, get the default
    implementation.
    """
    params = list(params)
    fusable = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=lr, fused=True) if fusable else torch.optim.Adam(params, lr=lr)
