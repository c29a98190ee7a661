"""The run specification of ``flows fit``: one table of its flags, and everything derived from it.

Each :class:`FitFlag` says how the flag is parsed (its argparse keywords), where ``flows fit
--help`` lists it (its group), what ``--resume`` does when it differs from the run's (its policy,
one of :data:`flows.train.runs.RESUME_POLICIES`), and which objective uses it. From
:data:`FIT_FLAGS` come the parser (:func:`add_fit_flags`), the ``--resume`` help
(:func:`resume_help`), the resume check (:func:`resume_policy`, applied by
:func:`flows.train.runs.resume_changes`), the recorded settings (:func:`run_settings`) and the
objective check (:func:`check_objective_flags`): a flag added here is parsed, checked and
resumed alike, with no second list to keep in step.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.cli._types import _MAX_LAYERS, _MAX_SEED, _hidden, _integer, _option, _real

__all__ = [
    "FIT_FLAGS",
    "OBJECTIVES",
    "OBJECTIVE_OPTIONS",
    "FitFlag",
    "add_fit_flags",
    "check_objective_flags",
    "data_spec",
    "objective_defaults",
    "resume_help",
    "resume_policy",
    "run_settings",
]

#: The objectives of ``--objective`` and the words their flags are called by in messages.
OBJECTIVES: dict[str, str] = {"ml": "maximum-likelihood", "fm": "flow-matching"}

#: Builder options (``--option KEY=VALUE``) that only the named objective uses. Flow matching regresses the field
#: directly and never solves the ODE in training, so the RNODE penalties (``kinetic``, ``jacobian``) and the adjoint
#: method would be ignored.
OBJECTIVE_OPTIONS: dict[str, tuple[str, ...]] = {"ml": ("kinetic", "jacobian", "adjoint"), "fm": ()}


@dataclass(frozen=True)
class FitFlag:
    """One flag of ``flows fit``.

    Attributes:
        name: the argparse destination (``batch_size`` for ``--batch-size``).
        group: the section of ``flows fit --help``: ``data``, ``model``, ``training`` or ``output``.
        resume: what ``--resume`` does when the value differs from the run's (a key of
            :data:`flows.train.runs.RESUME_POLICIES`).
        keywords: the keywords of ``argparse.ArgumentParser.add_argument`` (``help`` may be a
            function of the table, for help derived from it).
        objective: the objective that uses the flag (a key of :data:`OBJECTIVES`), ``None`` for all;
            any other value than its default is refused with another objective.
        requires: ``(flag, value)``: another flag's value without which this one is ignored, so a
            value other than its default is refused without it.
    """

    name: str
    group: str
    resume: str
    keywords: dict[str, Any] = field(default_factory=dict)
    objective: str | None = None
    requires: tuple[str, object] | None = None

    @property
    def option(self) -> str:
        """The command-line spelling, ``--batch-size``."""
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> object:
        """The value the flag has when it is not given."""
        return self.keywords.get("default", False if self.keywords.get("action") == "store_true" else None)


def resume_help(flags: Iterable[FitFlag]) -> str:
    """The ``--resume`` help, naming every flag that resume refuses and every one that it records."""
    from flows.train.runs import REFUSED_POLICIES

    flags = list(flags)
    refused = ", ".join(f.option for f in flags if f.resume in REFUSED_POLICIES)
    recorded = " and ".join(f.option for f in flags if f.resume == "record")
    return (
        f"continue the run in --out from its checkpoint; the command must repeat the run's {refused} (a difference "
        f"is refused and listed), while {recorded} may change and the change is recorded in run.json and the history"
    )


def _data_help(flags: Iterable[FitFlag]) -> str:
    from flows.data.dataset import DATASETS

    return f"one of {', '.join(DATASETS)}, or a .csv/.npy/.npz file (default: digits)"


#: Every flag of ``flows fit``, in the order of ``flows fit --help``.
FIT_FLAGS: tuple[FitFlag, ...] = (
    FitFlag("data", "data", "data", {"default": "digits", "help": _data_help}),
    FitFlag("data_dir", "data", "data", {"help": "data directory for real data sets (default: $FLOWS_DATA_DIR)"}),
    FitFlag("key", "data", "data", {"help": "array name inside an .npz file"}),
    FitFlag(
        "levels",
        "data",
        "data",
        {
            "type": _integer(2, what="an integer number of levels"),
            "help": "integer data with this many levels, to dequantize (e.g. 256 for pixels)",
        },
    ),
    FitFlag(
        "val_fraction",
        "data",
        "data",
        {
            "type": _real(0, strict=True, high=1, open_high=True),
            "default": 0.1,
            "help": "validation fraction (default: 0.1)",
        },
    ),
    FitFlag(
        "test_fraction",
        "data",
        "data",
        {"type": _real(0, high=1, open_high=True), "default": 0.2, "help": "test fraction (default: 0.2)"},
    ),
    FitFlag(
        "labels",
        "data",
        "data",
        {
            "action": "store_true",
            "help": "train a class-conditional flow on the data set's labels (digits, mnist; a builder with "
            "num_classes, see 'flows models'): the test log-likelihood is log p(x|y), and flows eval --classify and "
            "flows sample --class use the classes",
        },
    ),
    FitFlag(
        "no_standardize",
        "data",
        "model",
        {"action": "store_true", "help": "do not standardise continuous data inside the flow"},
    ),
    FitFlag(
        "model", "model", "model", {"default": "RealNVP", "help": "builder name (see 'flows models'; default: RealNVP)"}
    ),
    FitFlag(
        "transforms",
        "model",
        "model",
        {"type": _integer(1, _MAX_LAYERS, "a number of layers"), "default": 6, "help": "number of layers (default: 6)"},
    ),
    FitFlag(
        "hidden", "model", "model", {"type": _hidden, "default": [128, 128], "help": "hidden widths (default: 128,128)"}
    ),
    FitFlag(
        "option",
        "model",
        "model",
        {
            "type": _option,
            "action": "append",
            "default": [],
            "metavar": "KEY=VALUE",
            "help": "extra builder option (repeatable)",
        },
    ),
    FitFlag(
        "epochs",
        "training",
        "record",
        {"type": _integer(1, what="a number of epochs"), "default": 60, "help": "epochs (default: 60)"},
    ),
    FitFlag(
        "time_budget",
        "training",
        "record",
        {"type": _real(0, strict=True), "help": "stop after this many seconds of training"},
    ),
    FitFlag(
        "batch_size",
        "training",
        "refuse",
        {
            "type": _integer(1, what="a batch size"),
            "default": 128,
            "help": "global batch size over all processes (default: 128)",
        },
    ),
    FitFlag(
        "lr",
        "training",
        "refuse",
        {
            "type": _real(0, strict=True, allow_inf=True),
            "default": 2e-3,
            "help": "Adam learning rate (default: 2e-3)",
        },
    ),
    FitFlag(
        "objective",
        "training",
        "refuse",
        {
            "choices": tuple(OBJECTIVES),
            "default": "ml",
            "help": "ml: maximum likelihood; fm: flow matching, for continuous flows (--model FFJORD --transforms 1) "
            "(default: ml)",
        },
    ),
    FitFlag(
        "noise_std",
        "training",
        "refuse",
        {
            "type": _real(0),
            "default": 0.0,
            "help": "maximum likelihood: Gaussian noise augmentation, x + σε with σ this many data units, "
            "continuous data only (default: 0, none)",
        },
        objective="ml",
    ),
    FitFlag(
        "sigma",
        "training",
        "refuse",
        {"type": _real(0), "default": 0.0, "help": "flow matching: noise level of the paths (default: 0)"},
        objective="fm",
    ),
    FitFlag(
        "coupling",
        "training",
        "refuse",
        {
            "choices": ("independent", "ot"),
            "default": "independent",
            "help": "flow matching: pairs of data and base samples, as drawn or by minibatch optimal transport "
            "(default: independent)",
        },
        objective="fm",
    ),
    FitFlag(
        "velocity",
        "training",
        "refuse",
        {
            "choices": ("conditional", "stable"),
            "default": "conditional",
            "help": "flow matching: regress onto each pair's velocity, or onto its average over the training rows "
            "that could have produced the same state (Xu et al. 2023's stable target; independent coupling) "
            "(default: conditional)",
        },
        objective="fm",
    ),
    FitFlag(
        "reference_size",
        "training",
        "refuse",
        {
            "type": _integer(1, what="a reference size"),
            "default": 512,
            "help": "flow matching, --velocity stable: training rows drawn each step as the reference (default: 512)",
        },
        objective="fm",
        requires=("velocity", "stable"),
    ),
    FitFlag(
        "time_power",
        "training",
        "refuse",
        {
            "type": _real(0, strict=True),
            "default": 1.0,
            "help": "flow matching: times s = u^p, u ~ U(0, 1); p > 1 trains more near the data (default: 1)",
        },
        objective="fm",
    ),
    FitFlag(
        "schedule",
        "training",
        "refuse",
        {
            "choices": ("cosine", "plateau", "none"),
            "default": "cosine",
            "help": "learning-rate schedule (default: cosine)",
        },
    ),
    FitFlag(
        "clip",
        "training",
        "refuse",
        {
            "type": _real(0),
            "default": 0.0,
            "help": "clip the global gradient norm to this value, 0 for none (default: 0)",
        },
    ),
    FitFlag(
        "patience",
        "training",
        "refuse",
        {
            "type": _integer(0, what="a number of epochs"),
            "default": 10,
            "help": "stop after this many epochs without a better validation loss, 0 to never stop early; either way "
            "the saved model has the best epoch's weights (default: 10)",
        },
    ),
    FitFlag(
        "seed",
        "training",
        "data",
        {
            "type": _integer(0, _MAX_SEED, "a seed"),
            "default": 0,
            "help": "seed of the model, the shuffling and the splits (default: 0)",
        },
    ),
    FitFlag(
        "threads",
        "training",
        "free",
        {
            "type": _integer(1, os.cpu_count() or 1, "a number of threads"),
            "default": 1,
            "help": "torch CPU threads per process (default: 1; small flows gain little from more, and a busy "
            "machine makes extra threads much slower; use --nproc for parallel training)",
        },
    ),
    FitFlag(
        "nproc",
        "training",
        "free",
        {
            "type": _integer(1, 1024, "a number of processes"),
            "default": 1,
            "help": "processes for data-parallel training (default: 1)",
        },
    ),
    FitFlag(
        "compile",
        "training",
        "free",
        {
            "action": "store_true",
            "help": "run the loss under torch.compile (needs a C++ compiler; pays off for runs of minutes)",
        },
    ),
    FitFlag(
        "checkpoint_every",
        "training",
        "free",
        {"type": _real(0), "default": 30.0, "help": "seconds between checkpoints (default: 30)"},
    ),
    FitFlag("out", "output", "free", {"type": Path, "help": "run directory (default: runs/<data name>)"}),
    FitFlag("resume", "output", "free", {"action": "store_true", "help": resume_help}),
    FitFlag(
        "overwrite",
        "output",
        "free",
        {
            "action": "store_true",
            "help": "start afresh even if --out holds a run or files of the names a run writes: all of them are "
            "removed (other files are kept) once the arguments and data are checked; without it such a directory "
            "is refused",
        },
    ),
    FitFlag("no_plots", "output", "free", {"action": "store_true", "help": "do not write pictures"}),
    FitFlag("quiet", "output", "free", {"action": "store_true", "help": "print only the final result"}),
)


def add_fit_flags(parser: argparse.ArgumentParser, flags: tuple[FitFlag, ...] = FIT_FLAGS) -> None:
    """Add ``flags`` to the ``flows fit`` parser, in their groups (in the order the groups first appear)."""
    groups: dict[str, Any] = {}
    for flag in flags:
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        keywords = dict(flag.keywords)
        if callable(keywords.get("help")):
            keywords["help"] = keywords["help"](flags)
        groups[flag.group].add_argument(flag.option, **keywords)


def resume_policy(flags: Iterable[FitFlag] = FIT_FLAGS) -> dict[str, str]:
    """Flag name -> its resume policy (:data:`flows.train.runs.RESUME_POLICIES`)."""
    return {f.name: f.resume for f in flags}


def run_settings(args: argparse.Namespace, flags: Iterable[FitFlag] = FIT_FLAGS) -> dict[str, object]:
    """The settings a resume compares on their own or records: the flags of policy ``refuse`` or ``record``.

    Non-finite numbers are stored as strings (``"inf"``), which the checkpoint's JSON header can hold.
    """
    from flows.train.runs import json_number

    return {f.name: json_number(getattr(args, f.name)) for f in flags if f.resume in ("refuse", "record")}


def data_spec(args: argparse.Namespace, flags: Iterable[FitFlag] = FIT_FLAGS) -> dict[str, object]:
    """The run's data spec: the flags of policy ``data``, as :func:`flows.data.load_dataset` arguments.

    ``--data`` is the data set's ``name`` (a path as its string). ``labels`` enters the spec only
    when it is set (``labels: true``), so the spec of an unlabelled run is what it was before the flag.
    """
    spec = {f.name: getattr(args, f.name) for f in flags if f.resume == "data"}
    if not spec.get("labels"):
        spec.pop("labels", None)
    return {("name" if k == "data" else k): (str(v) if k == "data" else v) for k, v in spec.items()}


def objective_defaults(objective: str, flags: Iterable[FitFlag] = FIT_FLAGS) -> dict[str, object]:
    """The flags that only ``objective`` uses, and their defaults."""
    return {f.name: f.default for f in flags if f.objective == objective}


def check_objective_flags(args: argparse.Namespace, flags: Iterable[FitFlag] = FIT_FLAGS) -> None:
    """Refuse a flag given another value than its default where the run would ignore it.

    A flag of one objective is refused with another ``--objective``; a flag that ``requires``
    another flag's value is refused without it.

    Raises:
        ValueError: naming the flags and the objective (or the flag) that would ignore them.
    """
    changed = [f for f in flags if f.objective is not None and getattr(args, f.name) != f.default]

    def given(found: list[FitFlag]) -> str:
        return ", ".join(f"{f.option} {getattr(args, f.name)}" for f in found)

    for objective, word in OBJECTIVES.items():
        ignored = [f for f in changed if f.objective == objective]
        if ignored and args.objective != objective:
            raise ValueError(
                f"{given(ignored)}: expected {word} flags only with --objective {objective}, "
                f"got --objective {args.objective}"
            )
    for flag in changed:
        if flag.requires is not None and getattr(args, flag.requires[0]) != flag.requires[1]:
            needed, value = flag.requires
            option = "--" + needed.replace("_", "-")
            raise ValueError(
                f"{given([flag])}: expected it only with {option} {value}, got {option} {getattr(args, needed)}"
            )
