"""The ``flows`` argument parser: every command, option and range check (parsing only, no work)."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from flows import __version__
from flows.cli.exit_codes import EXIT_CODES

# the flow-matching flags of ``flows fit`` and their defaults (fit refuses other values without --objective fm)
FLOW_MATCHING_DEFAULTS = {
    "sigma": 0.0,
    "coupling": "independent",
    "target": "conditional",
    "reference_size": 512,
    "time_power": 1.0,
}

#: The first line of ``flows --help``.
_COMMAND_SUMMARY = "The flows command: fit a flow to data, evaluate it, sample from it, check its transforms."

__all__: list[str] = []

_MAX_SEED = 2**63 - 1
_MAX_LAYERS = 1000
_MAX_WIDTH = 1 << 16
_MAX_DRAWS = 10_000


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``flows fit: error: ...``) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _integer(low: int, high: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, else a one-line "expected ..., got ..." error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def _real(
    low: float | None = None,
    *,
    strict: bool = False,
    high: float | None = None,
    open_high: bool = False,
    allow_inf: bool = False,
) -> Callable[[str], float]:
    """An argparse type: a finite number (``+inf`` too with ``allow_inf``) above ``low`` and below ``high``.

    ``strict`` excludes ``low`` itself, ``open_high`` excludes ``high``; NaN is always refused.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = low is not None and (value <= low if strict else value < low)
        too_high = high is not None and (value >= high if open_high else value > high)
        bad = math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0))
        if bad or too_low or too_high:
            parts = []
            if low is not None:
                parts.append(f"{'>' if strict else '>='} {low:g}")
            if high is not None:
                parts.append(f"{'<' if open_high else '<='} {high:g}")
            kind = "a number" if allow_inf else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {kind} {' and '.join(parts)}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _hidden(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 128,128, got {text!r}") from error
    if not widths or min(widths) <= 0 or max(widths) > _MAX_WIDTH:
        raise argparse.ArgumentTypeError(
            f"expected positive widths of at most {_MAX_WIDTH} such as 128,128, got {text!r}"
        )
    return widths


def _option(text: str) -> tuple[str, object]:
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE as JSON, e.g. clamp=2.0), got {text!r}")
    key, value = text.split("=", 1)
    key = key.strip()
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parser() -> argparse.ArgumentParser:
    from flows.data.dataset import DATASETS

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

    fit = sub.add_parser(
        "fit",
        help="train a flow on data and write a run directory",
        description=(
            "Train a flow by maximum likelihood. Writes run.json, model.ckpt, checkpoint.ckpt, metrics.json/csv "
            "and pictures to --out, prints the test log-likelihood (and bits/dim for integer data)."
        ),
    )
    data = fit.add_argument_group("data")
    data.add_argument(
        "--data", default="digits", help=f"one of {', '.join(DATASETS)}, or a .csv/.npy/.npz file (default: digits)"
    )
    data.add_argument("--data-dir", help="data directory for real data sets (default: $FLOWS_DATA_DIR)")
    data.add_argument("--key", help="array name inside an .npz file")
    data.add_argument(
        "--levels",
        type=_integer(2, what="an integer number of levels"),
        help="integer data with this many levels, to dequantize (e.g. 256 for pixels)",
    )
    data.add_argument(
        "--val-fraction",
        type=_real(0, strict=True, high=1, open_high=True),
        default=0.1,
        help="validation fraction (default: 0.1)",
    )
    data.add_argument(
        "--test-fraction", type=_real(0, high=1, open_high=True), default=0.2, help="test fraction (default: 0.2)"
    )
    data.add_argument(
        "--no-standardize", action="store_true", help="do not standardise continuous data inside the flow"
    )
    model = fit.add_argument_group("model")
    model.add_argument("--model", default="RealNVP", help="builder name (see 'flows models'; default: RealNVP)")
    model.add_argument(
        "--transforms",
        type=_integer(1, _MAX_LAYERS, "a number of layers"),
        default=6,
        help="number of layers (default: 6)",
    )
    model.add_argument("--hidden", type=_hidden, default=[128, 128], help="hidden widths (default: 128,128)")
    model.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra builder option (repeatable)",
    )
    train = fit.add_argument_group("training")
    train.add_argument("--epochs", type=_integer(1, what="a number of epochs"), default=60, help="epochs (default: 60)")
    train.add_argument("--time-budget", type=_real(0, strict=True), help="stop after this many seconds of training")
    train.add_argument(
        "--batch-size",
        type=_integer(1, what="a batch size"),
        default=128,
        help="global batch size over all processes (default: 128)",
    )
    train.add_argument(
        "--lr", type=_real(0, strict=True, allow_inf=True), default=2e-3, help="Adam learning rate (default: 2e-3)"
    )
    train.add_argument(
        "--objective",
        choices=("ml", "fm"),
        default="ml",
        help="ml: maximum likelihood; fm: flow matching, for continuous flows (--model FFJORD --transforms 1) "
        "(default: ml)",
    )
    train.add_argument(
        "--sigma",
        type=_real(0),
        default=FLOW_MATCHING_DEFAULTS["sigma"],
        help="flow matching: noise level of the paths (default: 0)",
    )
    train.add_argument(
        "--coupling",
        choices=("independent", "ot"),
        default=FLOW_MATCHING_DEFAULTS["coupling"],
        help="flow matching: pairs of data and base samples, as drawn or by minibatch optimal transport "
        "(default: independent)",
    )
    train.add_argument(
        "--target",
        choices=("conditional", "stable"),
        default=FLOW_MATCHING_DEFAULTS["target"],
        help="flow matching: regress onto each pair's velocity, or onto its average over the training rows that "
        "could have produced the same state (Xu et al. 2023's stable target; independent coupling) "
        "(default: conditional)",
    )
    train.add_argument(
        "--reference-size",
        type=_integer(1, what="a reference size"),
        default=FLOW_MATCHING_DEFAULTS["reference_size"],
        help="flow matching, --target stable: training rows drawn each step as the reference (default: 512)",
    )
    train.add_argument(
        "--time-power",
        type=_real(0, strict=True),
        default=FLOW_MATCHING_DEFAULTS["time_power"],
        help="flow matching: times s = u^p, u ~ U(0, 1); p > 1 trains more near the data (default: 1)",
    )
    train.add_argument(
        "--schedule",
        choices=("cosine", "plateau", "none"),
        default="cosine",
        help="learning-rate schedule (default: cosine)",
    )
    train.add_argument(
        "--clip",
        type=_real(0),
        default=0.0,
        help="clip the global gradient norm to this value, 0 for none (default: 0)",
    )
    train.add_argument(
        "--patience",
        type=_integer(0, what="a number of epochs"),
        default=10,
        help="stop after this many epochs without a better validation loss, 0 to never stop early; either way the "
        "saved model has the best epoch's weights (default: 10)",
    )
    train.add_argument(
        "--seed",
        type=_integer(0, _MAX_SEED, "a seed"),
        default=0,
        help="seed of the model, the shuffling and the splits (default: 0)",
    )
    train.add_argument(
        "--threads",
        type=_integer(1, os.cpu_count() or 1, "a number of threads"),
        default=1,
        help="torch CPU threads per process (default: 1; small flows gain little from more, and a busy "
        "machine makes extra threads much slower; use --nproc for parallel training)",
    )
    train.add_argument(
        "--nproc",
        type=_integer(1, 1024, "a number of processes"),
        default=1,
        help="processes for data-parallel training (default: 1)",
    )
    train.add_argument(
        "--compile",
        action="store_true",
        help="run the loss under torch.compile (needs a C++ compiler; pays off for runs of minutes)",
    )
    train.add_argument(
        "--checkpoint-every", type=_real(0), default=30.0, help="seconds between checkpoints (default: 30)"
    )
    output = fit.add_argument_group("output")
    output.add_argument("--out", type=Path, help="run directory (default: runs/<data name>)")
    output.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint; the command must repeat the run's data, model, "
        "--lr, --batch-size, --schedule, --clip and --patience (a difference is refused and listed), while "
        "--epochs and --time-budget may change and the change is recorded in run.json and the history",
    )
    output.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh even if --out holds a run or files of the names a run writes: all of them are removed "
        "(other files are kept) once the arguments and data are checked; without it such a directory is refused",
    )
    output.add_argument("--no-plots", action="store_true", help="do not write pictures")
    output.add_argument("--quiet", action="store_true", help="print only the final result")

    ev = sub.add_parser("eval", help="test log-likelihood (and bits/dim) of a trained run")
    ev.add_argument("run", type=Path, help="run directory or model.ckpt")
    ev.add_argument("--split", choices=("test", "val", "train"), default="test")
    ev.add_argument(
        "--draws",
        type=_integer(1, _MAX_DRAWS, "a number of draws"),
        default=10,
        help="dequantization draws for integer data (default: 10)",
    )
    ev.add_argument("--data-dir", help="data directory for real data sets")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="evaluate even if the data no longer matches the run's recorded fingerprint (warns)",
    )

    sample = sub.add_parser("sample", help="draw samples to .npy and a picture")
    sample.add_argument("run", type=Path, help="run directory or model.ckpt")
    sample.add_argument(
        "-n", "--num", type=_integer(1, what="a number of samples"), default=64, help="number of samples (default: 64)"
    )
    sample.add_argument("--out", type=Path, help="output .npy file (default: <run>/samples.npy)")
    sample.add_argument("--picture", type=Path, help="output picture (default: the .npy path with .png)")
    sample.add_argument("--seed", type=_integer(0, _MAX_SEED, "a seed"), default=0, help="seed (default: 0)")
    sample.add_argument(
        "--overwrite", action="store_true", help="replace earlier samples instead of numbering new ones"
    )

    check = sub.add_parser("check", help="run flows.testing.check_bijection on every layer of a trained model")
    check.add_argument("run", type=Path, help="run directory or model.ckpt")
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

    sub.add_parser("models", help="list the model builders that --model accepts")
    from flows.cli.data import add_data_parser

    add_data_parser(sub)
    return parser
