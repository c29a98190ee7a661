"""The pieces every benchmark shares: flags, the contender wrapper, timing rounds, the neutral loop, bits/dim, tables.

Benchmarks are scripts (``python benchmarks/x.py``); Python puts a script's own folder first on
``sys.path``, so ``import _harness`` works from any of them with no path edits. What lives here:

* :func:`parser` and :func:`setup`: the common flags (``--threads``, 1 by default: timings on a
  shared machine are only comparable on one thread; ``--seed``; and, where a benchmark has them,
  ``--budget`` in training seconds and ``--epochs``), and applying them;
* :class:`Contender`: a model under a name with its ``log_prob``, its optimiser and its timings;
  peers from other libraries are wrapped into the same interface;
* :func:`interleaved_medians`: timing rounds in which every contender runs in turn (the order
  rotated each round), reported as medians, so that load from other jobs hits every contender alike;
* :func:`train_epoch`: one neutral maximum-likelihood loop (shuffle, optionally dequantize, Adam
  steps on ``-log p``) that every library's model goes through, so a cross-library comparison
  measures the models and not the loops (the library's own loop, ``flows.train.Trainer``, is
  measured against this one in ``trainer_overhead.py``);
* :func:`test_bits_per_dim`: test bits/dim through the library's :func:`flows.metrics.bits_per_dim`;
* :func:`markdown_table` / :func:`print_table`: the result printer.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

import flows
from flows.data import uniform_dequantize
from flows.metrics import bits_per_dim

__all__ = [
    "Contender",
    "interleaved_medians",
    "interleaved_times",
    "load_example",
    "markdown_table",
    "parser",
    "print_table",
    "setup",
    "test_bits_per_dim",
    "train_epoch",
]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


# ----------------------------------------------------------------------------------------------- flags


def parser(
    doc: str | None,
    *,
    threads: int = 1,
    seed: int | None = 0,
    budget: float | None = None,
    epochs: int | None = None,
) -> argparse.ArgumentParser:
    """An argument parser with the common flags.

    Args:
        doc: the benchmark's module docstring (the ``--help`` text).
        threads: default of ``--threads`` (torch intra-op threads; 1 unless a benchmark measures scaling).
        seed: default of ``--seed``; ``None`` leaves the flag out (a benchmark with ``--seeds``).
        budget: default of ``--budget`` (training seconds per contender); ``None`` leaves it out.
        epochs: default of ``--epochs``; ``None`` leaves it out.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=threads, help=f"torch threads (default {threads})")
    if seed is not None:
        p.add_argument("--seed", type=int, default=seed, help=f"random seed (default {seed})")
    if budget is not None:
        p.add_argument("--budget", type=float, default=budget, help=f"training seconds per contender ({budget:g})")
    if epochs is not None:
        p.add_argument("--epochs", type=int, default=epochs, help=f"training epochs (default {epochs})")
    return p


def setup(args: argparse.Namespace) -> argparse.Namespace:
    """Apply the common flags: torch's thread count (and nothing else: seeds are set per contender)."""
    if args.threads < 1:
        raise SystemExit(f"expected --threads >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    return args


# ------------------------------------------------------------------------------------------- contenders


class Contender:
    """A model under a name: its log-density, its optimiser and its timings.

    Args:
        name: the name printed in the results.
        model: the module whose parameters are trained (a flows ``Flow`` or a peer library's model).
        log_prob: ``x -> log p(x)`` (default ``model.log_prob``); a peer's model is wrapped here.
        lr: Adam's learning rate (ignored when ``optimizer`` is given).
        optimizer: the optimiser (default Adam on ``model``'s parameters).
    """

    def __init__(
        self,
        name: str,
        model: nn.Module,
        *,
        log_prob: Callable[[Tensor], Tensor] | None = None,
        lr: float = 1e-3,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.name, self.model = name, model
        self.log_prob = log_prob if log_prob is not None else model.log_prob
        params = list(model.parameters())
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(params, lr=lr) if params else None
        self.step_times: list[float] = []
        self.epoch_times: list[float] = []

    @property
    def parameters(self) -> int:
        """The number of trainable scalars."""
        return sum(p.numel() for p in self.model.parameters())

    def loss(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(loss, nll)``: ``nll = -mean log p(x)``, plus any auxiliary losses the model adds in ``loss``."""
        with flows.AuxiliaryLosses() as aux:
            nll = -self.log_prob(x).mean()
        return (nll + aux.total() if aux.terms else nll), nll

    def step(self, x: Tensor, *, scale: float = 1.0) -> float:
        """One timed optimiser step on ``scale * loss``; returns the batch's negative log-likelihood."""
        start = time.perf_counter()
        loss, nll = self.loss(x)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * scale if scale != 1.0 else loss).backward()
        self.optimizer.step()
        self.after_step()
        self.step_times.append(time.perf_counter() - start)
        return float(nll.detach())

    def after_step(self) -> None:
        """Called inside the timed step after the optimiser's (a learning-rate schedule, an average)."""


def train_epoch(
    contender: Contender,
    data: Tensor,
    *,
    batch_size: int,
    generator: torch.Generator,
    levels: int | None = None,
    scale: float = 1.0,
) -> float:
    """The neutral maximum-likelihood loop: one epoch of shuffled mini-batches, timed; returns the mean loss.

    Args:
        contender: the model, its log-density and optimiser.
        data: training rows (integer levels when ``levels`` is given).
        batch_size: rows per step (the last batch may be smaller).
        generator: the shuffle and dequantization noise (give every contender its own, seeded alike,
            and they see the same batches).
        levels: dequantize uniformly with this many levels first (``flows.data.uniform_dequantize``).
        scale: multiplies the loss before the backward pass (e.g. ``1 / D`` for images).
    """
    contender.model.train()
    start = time.perf_counter()
    order = torch.randperm(len(data), generator=generator)
    total = 0.0
    for i in range(0, len(data), batch_size):
        x = data[order[i : i + batch_size]]
        if levels is not None:
            x = uniform_dequantize(x, levels, generator=generator)
        total += contender.step(x, scale=scale) * len(x)
    contender.epoch_times.append(time.perf_counter() - start)
    return total / len(data)


@torch.no_grad()
def test_bits_per_dim(
    model: nn.Module,
    data: Tensor,
    *,
    levels: int,
    draws: int = 10,
    seed: int = 0,
    log_prob: Callable[[Tensor], Tensor] | None = None,
) -> float:
    """Mean test bits/dim over ``draws`` uniform dequantizations (the dequantization bound), in eval mode.

    The number comes from :func:`flows.metrics.bits_per_dim`, the library's one formula.
    """
    log_prob = log_prob if log_prob is not None else model.log_prob
    generator = torch.Generator().manual_seed(seed)
    dims = data[0].numel()
    with flows.evaluating(model):
        log_p = torch.stack([log_prob(uniform_dequantize(data, levels, generator=generator)) for _ in range(draws)])
    return float(bits_per_dim(log_p, dims, levels).mean())


# ---------------------------------------------------------------------------------------------- timing


def interleaved_times(
    steps: Mapping[str, Callable[[], object]], *, rounds: int, inner: int = 1, warmup: int = 1
) -> dict[str, list[tuple[float, float]]]:
    """Wall-clock and CPU (process) seconds per call of each step, one pair per interleaved round.

    Every round calls each step ``inner`` times in turn, the order rotated by one each round, so a
    burst of load from other jobs hits every step alike and no step always runs first (warm caches).

    Args:
        steps: name -> a callable doing one unit of work.
        rounds: timing rounds.
        inner: calls per step and round (for steps shorter than the clock's resolution).
        warmup: untimed calls of each step first (allocations, lazy initialisation, compilation).

    Returns:
        name -> ``[(wall, cpu), ...]``, seconds per call, one pair per round.
    """
    if rounds < 1 or inner < 1 or warmup < 0:
        raise ValueError(f"expected rounds >= 1, inner >= 1 and warmup >= 0, got {rounds}, {inner} and {warmup}")
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = steps[name]
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(inner):
                fn()
            times[name].append(((time.perf_counter() - wall) / inner, (time.process_time() - cpu) / inner))
    return times


def interleaved_medians(
    steps: Mapping[str, Callable[[], object]], *, rounds: int, inner: int = 1, warmup: int = 1
) -> dict[str, float]:
    """Median wall-clock seconds per call of each step over :func:`interleaved_times`' rounds."""
    times = interleaved_times(steps, rounds=rounds, inner=inner, warmup=warmup)
    return {name: statistics.median(wall for wall, _ in pairs) for name, pairs in times.items()}


# --------------------------------------------------------------------------------------------- results


def _cell(value: object, spec: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "—"
    return format(value, spec)


def markdown_table(rows: Iterable[Mapping[str, object]], columns: Sequence[tuple[str, str, str]]) -> str:
    """Rows as a Markdown table.

    Args:
        rows: one mapping per row.
        columns: ``(key, heading, format spec)`` per column, e.g. ``("bpd", "test bits/dim", ".3f")``;
            a missing key prints as ``—``, a string as it is.
    """
    lines = ["| " + " | ".join(heading for _, heading, _ in columns) + " |"]
    lines.append("|" + "|".join("---" if spec in ("", "s") else "---:" for _, _, spec in columns) + "|")
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), spec) for key, _, spec in columns) + " |")
    return "\n".join(lines)


def print_table(
    rows: Iterable[Mapping[str, object]], columns: Sequence[tuple[str, str, str]], *, title: str | None = None
) -> None:
    """Print :func:`markdown_table` (after a title line, when given)."""
    if title:
        print(f"\n{title}\n")
    print(markdown_table(rows, columns), flush=True)


# -------------------------------------------------------------------------------------------- examples


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>`` as a module, for a benchmark that measures an example's recipe.

    A benchmark that runs an example's model against a peer library's must run the same model, so
    it imports the example instead of copying it. Examples are scripts, not a package: this loads
    one by its path (its ``main`` does not run), the one place where a benchmark reaches into
    ``examples/``.
    """
    path = EXAMPLES / name
    spec = importlib.util.spec_from_file_location(f"_example_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"expected an example script at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
