"""Trainer callbacks (hooks into the loop, with state that checkpoints save and restore) and the progress bar.

A callback overrides any of the hooks below; each receives the :class:`~flows.train.Trainer`,
whose attributes (``model``, ``optimizer``, ``history``, ``epoch``, ``step``, ``should_stop``)
it may read and, for ``should_stop``, set. Callbacks with state implement :meth:`Callback.state_dict`
and :meth:`Callback.load_state_dict` so that a resumed run continues exactly.

While a progress bar is shown, :class:`PrintMetrics` lines, ``logging`` records and warnings are
written with ``tqdm.write`` above the bar (:func:`bar_output`), never into it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from flows.bijections.continuous import total_nfe
from flows.train.guard import TrainingWarning

if TYPE_CHECKING:  # pragma: no cover
    from flows.train.trainer import Trainer

__all__ = [
    "Callback",
    "CosineDecay",
    "EarlyStopping",
    "MetricsLogger",
    "PrintMetrics",
    "RecordNFE",
    "bar_output",
    "progress_bar",
]


class Callback:
    """Base class: every hook does nothing."""

    def on_fit_start(self, trainer: Trainer) -> None:
        """Before the first step of :meth:`~flows.train.Trainer.fit` (also after a resume)."""

    def on_epoch_start(self, trainer: Trainer) -> None:
        """Before the first step of an epoch."""

    def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        """After every step (``metrics`` has ``loss`` and ``skipped``; do not keep heavy work here)."""

    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        """After validation, with the epoch's record (already appended to ``trainer.history``)."""

    def on_fit_end(self, trainer: Trainer) -> None:
        """After the last epoch and the final checkpoint (which holds the training state, not the best weights)."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (tensors, numbers, strings, lists and dicts only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class EarlyStopping(Callback):
    """Stop when a monitored metric has not improved for ``patience`` epochs; restore the best weights.

    With ``patience=2`` and the metric improving last at epoch 5, epochs 6 and 7 are the two
    epochs without improvement and training stops after epoch 7. Whatever the patience (and
    whether or not training stops early), the model ends with the weights of its best epoch when
    ``restore_best`` is set.

    Args:
        monitor: metric name in the epoch record (``"val_loss"`` by default; ``"loss"`` is used
            instead when the record has no ``val_loss``, i.e. without validation data).
        patience: epochs without improvement before stopping (``0``: stop at the first epoch that
            does not improve; ``None``: never stop, only keep the best weights).
        min_delta: smallest decrease that counts as an improvement.
        mode: ``"min"`` or ``"max"``.
        restore_best: load the best weights into the model when training ends (by early stopping
            or otherwise).

    Example:
        >>> stopper = EarlyStopping(patience=5)
        >>> stopper.best, stopper.best_epoch
        (inf, None)
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        patience: int | None = 10,
        min_delta: float = 0.0,
        mode: str = "min",
        restore_best: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: expected mode 'min' or 'max', got {mode!r}")
        if patience is not None and patience < 0:
            raise ValueError(f"EarlyStopping: expected patience >= 0, got {patience}")
        self.monitor, self.patience, self.min_delta, self.mode = monitor, patience, min_delta, mode
        self.restore_best = restore_best
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: float | None = None  # fractional for a record of a run stopped mid-epoch
        self.bad_epochs = 0
        self.best_state: dict | None = None
        self.stopped_epoch: float | None = None

    def _value(self, record: dict[str, float]) -> float | None:
        if self.monitor in record:
            return record[self.monitor]
        if self.monitor == "val_loss" and "loss" in record:
            return record["loss"]
        return None

    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        value = self._value(record)
        if value is None:
            raise KeyError(f"EarlyStopping: the epoch record has no metric {self.monitor!r}; it has {sorted(record)}")
        improved = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if improved and math.isfinite(value):
            self.best, self.best_epoch, self.bad_epochs = value, record["epoch"], 0
            if self.restore_best:
                self.best_state = copy.deepcopy(trainer.model.state_dict())
        else:
            self.bad_epochs += 1
            if self.patience is not None and self.bad_epochs >= self.patience:
                self.stopped_epoch = record["epoch"]
                trainer.should_stop = True
                trainer.history.event(
                    trainer.step,
                    f"early stopping at epoch {self.stopped_epoch}: {self.monitor} has not improved for "
                    f"{self.bad_epochs} epochs (best {self.best:.6g} at epoch {self.best_epoch})",
                )

    def on_fit_end(self, trainer: Trainer) -> None:
        if self.restore_best and self.best_state is None and self.bad_epochs:
            message = (
                f"EarlyStopping: expected a finite {self.monitor} in some epoch, got none in {self.bad_epochs}; "
                "the model keeps its last weights"
            )
            warnings.warn(message, TrainingWarning, stacklevel=2)
            trainer.history.event(trainer.step, message)
        if self.restore_best and self.best_state is not None:
            trainer.model.load_state_dict(self.best_state)
            last = trainer.history.last().get("epoch")
            if last is not None and self.best_epoch != last:
                trainer.history.event(trainer.step, f"restored the best weights (epoch {self.best_epoch})")

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "best_state": self.best_state,
            "stopped_epoch": self.stopped_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.bad_epochs = state["best"], state["best_epoch"], state["bad_epochs"]
        self.best_state, self.stopped_epoch = state["best_state"], state["stopped_epoch"]


class MetricsLogger(Callback):
    """Write the history to ``directory/metrics.json`` and ``directory/metrics.csv``, and scalars to TensorBoard.

    The CSV and JSON files are rewritten after every ``every`` epochs (and at the end). When the
    ``tensorboard`` package is installed (``pip install "flows[tensorboard]"``), every epoch's
    numeric metrics (``loss``, ``val_loss``, ``lr``, ... everything but ``epoch`` and ``step``) are
    also written as scalars at the global step to ``directory/tensorboard`` (view them with
    ``tensorboard --logdir directory``); a resumed run purges the events written after its
    checkpoint's step, so curves do not fork. Only the process of rank 0 writes (see
    :mod:`flows.train.distributed`).

    Args:
        directory: output directory (created if needed).
        every: write the CSV and JSON files every ``every`` epochs (and always at the end).
        tensorboard: write TensorBoard scalars: ``None`` (default) when ``tensorboard`` is
            installed, ``True`` always (an error without it), ``False`` never.

    Raises:
        ImportError: with ``tensorboard=True`` when the ``tensorboard`` package is not installed.
    """

    def __init__(self, directory: str | os.PathLike, *, every: int = 1, tensorboard: bool | None = None) -> None:
        self.directory = Path(directory)
        self.every = max(1, int(every))
        installed = importlib.util.find_spec("tensorboard") is not None
        if tensorboard and not installed:
            raise ImportError(
                "MetricsLogger: expected the tensorboard package for tensorboard=True, got none installed "
                '(pip install "flows[tensorboard]")'
            )
        self.tensorboard = installed if tensorboard is None else bool(tensorboard)
        self._writer: Any = None

    def _write(self, trainer: Trainer) -> None:
        if trainer.is_main_process:
            trainer.history.to_json(self.directory / "metrics.json")
            trainer.history.to_csv(self.directory / "metrics.csv")

    def on_fit_start(self, trainer: Trainer) -> None:
        if self.tensorboard and trainer.is_main_process and self._writer is None:
            self._writer = _summary_writer(self.directory / "tensorboard", purge_step=trainer.step or None)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        if self._writer is not None:
            step = int(record.get("step", trainer.step))
            for key, value in record.items():
                if key not in ("epoch", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, float(value), global_step=step)
            self._writer.flush()
        if int(record["epoch"]) % self.every == 0:
            self._write(trainer)

    def on_fit_end(self, trainer: Trainer) -> None:
        self._write(trainer)
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:  # an open writer is never copied or pickled
        return {**self.__dict__, "_writer": None}


def _summary_writer(log_dir: Path, purge_step: int | None) -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, imported here (slow: ``docs/ecosystem.md``; needs ``tensorboard``)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), purge_step=purge_step)


class PrintMetrics(Callback):
    """Print one line per ``every`` epochs (the first and last epochs always) on rank 0, above any progress bar.

    Args:
        every: print every ``every`` epochs.
        stream: where to print (default ``sys.stdout``).
        keys: metrics to show (default: every metric except ``epoch``, ``step`` and ``time``).
    """

    def __init__(self, every: int = 1, *, stream: TextIO | None = None, keys: list[str] | None = None) -> None:
        self.every = max(1, int(every))
        self.stream = stream
        self.keys = keys

    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        epoch = int(record["epoch"])
        last = trainer.epochs_target is not None and epoch >= trainer.epochs_target
        if not trainer.is_main_process or (epoch % self.every and epoch != 1 and not last and not trainer.should_stop):
            return
        keys = self.keys or [k for k in record if k not in ("epoch", "step", "time")]
        parts = [f"{k} {record[k]:.4g}" for k in keys if k in record]
        from tqdm.auto import tqdm  # tqdm.write: above a progress bar, not inside it

        tqdm.write(
            f"epoch {epoch:4d}  " + "  ".join(parts) + f"  ({record['time']:.1f} s)", file=self.stream or sys.stdout
        )


class RecordNFE(Callback):
    """Put the mean number of field evaluations (NFE) of the epoch's training solves into its record, as ``nfe``.

    After every step it reads :func:`flows.bijections.total_nfe` of the model (the evaluations of
    the last forward solve of every :class:`~flows.bijections.CNF` in it); at the end of an epoch
    it writes their mean into the epoch's record, which the callbacks listed after it see
    (:class:`PrintMetrics`, :class:`MetricsLogger`), and appends it to :attr:`means`. Useful to
    watch a regulariser (RNODE) or a tolerance make the dynamics cheaper.

    Example:
        >>> import torch
        >>> from flows import FFJORD
        >>> from flows.train import Trainer
        >>> nfe = RecordNFE()
        >>> trainer = Trainer(FFJORD(2, hidden=(8,)), progress=False, callbacks=[nfe])
        >>> _ = trainer.fit(torch.randn(32, 2), epochs=2, batch_size=16)
        >>> len(nfe.means), nfe.means[-1] > 0
        (2, True)
    """

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.means: list[float] = []

    def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self.counts.append(total_nfe(trainer.model))

    def on_epoch_end(self, trainer: Trainer, record: dict[str, float]) -> None:
        if self.counts:
            record["nfe"] = sum(self.counts) / len(self.counts)
            self.means.append(record["nfe"])
        self.counts = []


class CosineDecay(Callback):
    r"""Decay every learning rate by a cosine over a number of steps or a wall-clock budget.

    :math:`\eta(p) = \eta_1 + (\eta_0 - \eta_1)\,\tfrac12 (1 + \cos \pi p)`, with progress
    :math:`p = \min(1, \text{step}/\text{steps})` or :math:`\min(1, \text{elapsed}/\text{seconds})`
    (the trainer's training seconds, restored on resume, so a resumed run continues the same
    schedule), :math:`\eta_0` each parameter group's learning rate when the callback is built and
    :math:`\eta_1 = \eta_0 \cdot` ``floor``. A budget in seconds is what a time-budgeted run
    wants (Loshchilov & Hutter 2017, "SGDR", arXiv:1608.03983, in time rather than steps); the
    rate is set before the first step and after every step. Each update multiplies the rate by
    the ratio of the new factor to the last one, so a change made by something else between steps
    (the :class:`~flows.train.NonFiniteGuard`'s backoff after a rollback) is kept, not overwritten.

    Args:
        optimizer: the optimizer whose groups' ``lr`` it drives (``trainer.optimizer``).
        steps: steps over which the rate decays (give this or ``seconds``).
        seconds: training seconds over which the rate decays.
        floor: the final rate as a fraction of the initial one, in ``[0, 1)``.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> decay = CosineDecay(opt, steps=10)
        >>> class FakeTrainer:
        ...     step, elapsed = 5, 0.0
        >>> decay.on_step_end(FakeTrainer(), {})
        >>> round(opt.param_groups[0]["lr"], 6)
        0.5
    """

    def __init__(
        self, optimizer: Any, *, steps: int | None = None, seconds: float | None = None, floor: float = 0.0
    ) -> None:
        if (steps is None) == (seconds is None):
            raise ValueError(f"CosineDecay: expected exactly one of steps and seconds, got {steps}, {seconds}")
        horizon = steps if steps is not None else seconds
        if isinstance(horizon, bool) or not isinstance(horizon, int | float) or not math.isfinite(horizon):
            raise TypeError(f"CosineDecay: expected a finite number of steps or seconds, got {horizon!r}")
        if horizon <= 0:
            raise ValueError(f"CosineDecay: expected a positive number of steps or seconds, got {horizon}")
        if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 <= floor < 1:
            raise ValueError(f"CosineDecay: expected 0 <= floor < 1, got {floor!r}")
        self.optimizer, self.steps, self.seconds, self.floor = optimizer, steps, seconds, float(floor)
        self.initial = [float(group["lr"]) for group in optimizer.param_groups]
        self.factor = 1.0  # the factor the rates carry now

    def progress(self, trainer: Trainer) -> float:
        """Fraction of the schedule done, in ``[0, 1]``."""
        done = trainer.step / self.steps if self.steps is not None else trainer.elapsed / self.seconds
        return min(1.0, max(0.0, done))

    def _set(self, trainer: Trainer) -> None:
        factor = self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * self.progress(trainer)))
        for group, lr in zip(self.optimizer.param_groups, self.initial, strict=True):
            group["lr"] = group["lr"] * (factor / self.factor) if self.factor > 0 else lr * factor
        self.factor = factor

    def on_fit_start(self, trainer: Trainer) -> None:
        self._set(trainer)

    def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self._set(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"initial": list(self.initial), "factor": self.factor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial = [float(lr) for lr in state["initial"]]
        self.factor = float(state["factor"])


def progress_bar(
    show: bool | None, main_process: bool, epochs: int | None, per_epoch: int | None, max_steps: int | None, step: int
) -> Any:
    """A ``tqdm`` bar over the run's steps, or ``None`` when not shown.

    ``show=None`` shows it only when standard error is a terminal (so logs and CI stay clean);
    only the main process shows one.
    """
    if not (show if show is not None else sys.stderr.isatty()) or not main_process:
        return None
    from tqdm.auto import tqdm

    total = max_steps
    if epochs is not None and per_epoch is not None:
        total = min(total or math.inf, epochs * per_epoch)
    total = None if total is None or total == math.inf else int(total)
    return tqdm(total=total, initial=min(step, total or step), unit="step", dynamic_ncols=True)


@contextlib.contextmanager
def bar_output(bar: Any) -> Iterator[None]:
    """While ``bar`` is shown, write ``logging`` records and warnings with ``tqdm.write``, above the bar.

    Console handlers of the root logger are swapped for tqdm's (``tqdm.contrib.logging``), and
    :func:`warnings.showwarning` writes through ``tqdm.write``; both are restored on exit.

    Args:
        bar: the ``tqdm`` bar of :func:`progress_bar` (``None``: nothing is redirected).
    """
    if bar is None:
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    tqdm_class = type(bar)
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        tqdm_class.write(text, file=file or sys.stderr)

    warnings.showwarning = showwarning
    try:
        with logging_redirect_tqdm(tqdm_class=tqdm_class):
            yield
    finally:
        warnings.showwarning = shown
