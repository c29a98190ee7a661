"""The ``flows`` argument parser: every command, option and range check (parsing only, no work)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from flows import __version__
from flows.cli._types import _MAX_DRAWS, _MAX_SEED, _integer, _real
from flows.cli.exit_codes import EXIT_CODES
from flows.cli.fit_flags import add_fit_flags, objective_defaults

#: The flow-matching flags of ``flows fit`` and their defaults (fit refuses other values without --objective fm),
#: read from the flag table :data:`flows.cli.fit_flags.FIT_FLAGS`.
FLOW_MATCHING_DEFAULTS = objective_defaults("fm")

#: The first line of ``flows --help``.
_COMMAND_SUMMARY = "The flows command: fit a flow to data, evaluate it, sample from it, check its transforms."

__all__: list[str] = []


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``flows fit: error: ...``) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    """The ``flows`` parser: one sub-parser per command of :data:`flows.cli.commands.COMMANDS`."""
    parser = _Parser(
        prog="flows",
        description=_COMMAND_SUMMARY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())
    parser.epilog = (
        "Run 'flows COMMAND --help' for the options of a command.\n\n"
        f"Errors are one line on stderr ('flows COMMAND: error: ...'). Exit status:\n{codes}"
    )
    parser.add_argument("--version", action="version", version=f"flows {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from flows.cli.data import add_data_parser

    for add in (_fit_options, _eval_options, _sample_options, _check_options, _models_options, add_data_parser):
        add(sub)
    return parser


def _fit_options(sub: argparse._SubParsersAction) -> None:
    """``flows fit``: its flags are the table :data:`flows.cli.fit_flags.FIT_FLAGS`."""
    fit = sub.add_parser(
        "fit",
        help="train a flow on data and write a run directory",
        description=(
            "Train a flow by maximum likelihood. Writes run.json, model.safetensors/json, checkpoint.ckpt, "
            "metrics.json/csv and pictures to --out, prints the test log-likelihood (and bits/dim for integer data)."
        ),
    )
    add_fit_flags(fit)


def _eval_options(sub: argparse._SubParsersAction) -> None:
    """``flows eval RUN``."""
    ev = sub.add_parser("eval", help="test log-likelihood (and bits/dim) of a trained run, or its accuracy")
    ev.add_argument("run", type=Path, help="run directory, model file (.safetensors) or checkpoint (.ckpt)")
    ev.add_argument("--split", choices=("test", "val", "train"), default="test")
    ev.add_argument(
        "--draws",
        type=_integer(1, _MAX_DRAWS, "a number of draws"),
        help="dequantization draws for integer data, for the log-likelihood (default: 10)",
    )
    ev.add_argument("--data-dir", help="data directory for real data sets")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument(
        "--classify",
        action="store_true",
        help="class-conditional runs (flows fit --labels): print the Bayes-rule accuracy on the split (uniform "
        "prior) instead of the log-likelihood",
    )
    ev.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="evaluate even if the data no longer matches the run's recorded fingerprint (warns)",
    )


def _sample_options(sub: argparse._SubParsersAction) -> None:
    """``flows sample RUN``."""
    sample = sub.add_parser("sample", help="draw samples to .npy and a picture")
    sample.add_argument("run", type=Path, help="run directory, model file (.safetensors) or checkpoint (.ckpt)")
    sample.add_argument(
        "-n", "--num", type=_integer(1, what="a number of samples"), default=64, help="number of samples (default: 64)"
    )
    sample.add_argument("--out", type=Path, help="output .npy file (default: <run>/samples.npy)")
    sample.add_argument("--picture", type=Path, help="output picture (default: the .npy path with .png)")
    sample.add_argument("--seed", type=_integer(0, _MAX_SEED, "a seed"), default=0, help="seed (default: 0)")
    sample.add_argument(
        "--class",
        dest="label",
        metavar="K",
        type=_integer(0, what="a class index"),
        help="class-conditional runs (flows fit --labels): draw samples of this class (default: the classes in turn)",
    )
    sample.add_argument(
        "--guidance",
        metavar="W",
        type=_real(),
        help="class-conditional runs: classifier-free guidance weight w (0: the conditional model; default: none, "
        "plain sampling)",
    )
    sample.add_argument(
        "--schedule",
        choices=("constant", "linear"),
        help="with --guidance: the weight constant, or ramped over each block's token order (default: constant)",
    )
    sample.add_argument(
        "--denoise",
        action="store_true",
        help="end with a Tweedie denoising step at the model's recorded noise_std (noise-augmented TarFlow)",
    )
    sample.add_argument(
        "--overwrite", action="store_true", help="replace earlier samples instead of numbering new ones"
    )


def _check_options(sub: argparse._SubParsersAction) -> None:
    """``flows check RUN``."""
    check = sub.add_parser("check", help="run flows.testing.check_bijection on every layer of a trained model")
    check.add_argument("run", type=Path, help="run directory, model file (.safetensors) or checkpoint (.ckpt)")
    check.add_argument(
        "--num",
        type=_integer(1, what="a number of test points"),
        default=3,
        help="test points to check on (default: 3)",
    )
    check.add_argument("--atol", type=_real(0, strict=True), default=1e-6, help="tolerance in float64 (default: 1e-6)")
    check.add_argument("--data-dir", help="data directory for real data sets")
    check.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="check on the data even if it no longer matches the run's recorded fingerprint (warns)",
    )


def _models_options(sub: argparse._SubParsersAction) -> None:
    """``flows models``."""
    sub.add_parser("models", help="list the model builders that --model accepts")
