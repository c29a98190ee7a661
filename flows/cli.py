"""The ``flows`` command: fit a flow to data, evaluate it, sample from it, check its transforms.

::

    flows fit                                  # RealNVP on the embedded digits, into runs/digits
    flows fit --data moons --epochs 50 --out runs/moons
    flows fit --data my_table.csv --model RealNVP --transforms 6 --hidden 128,128
    flows fit --data digits --nproc 2          # two processes (torch.distributed, gloo on CPU)
    flows fit --out runs/digits --resume       # continue a run that was interrupted
    flows eval runs/digits                     # test log-likelihood and bits/dim
    flows sample runs/digits -n 64             # samples.npy and a picture
    flows check runs/digits                    # log-det and inverse checks of every layer
    flows models                               # the model builders available

Every command prints ``flows <command>: error: ...`` and exits with a non-zero status on failure
(2 for bad arguments or inputs, 1 when training diverges, 130 when ``flows fit`` is stopped by
Ctrl-C or SIGTERM after writing its checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _hidden(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 128,128, got {text!r}") from error
    if not widths or min(widths) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive widths such as 128,128, got {text!r}")
    return widths


def _option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE as JSON, e.g. clamp=2.0), got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parser() -> argparse.ArgumentParser:
    from flows.data.dataset import DATASETS

    parser = argparse.ArgumentParser(
        prog="flows",
        description=__doc__.split("\n\n")[0].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.epilog = "Run 'flows COMMAND --help' for the options of a command."
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
        "--levels", type=int, help="integer data with this many levels, to dequantize (e.g. 256 for pixels)"
    )
    data.add_argument("--val-fraction", type=float, default=0.1, help="validation fraction (default: 0.1)")
    data.add_argument("--test-fraction", type=float, default=0.2, help="test fraction (default: 0.2)")
    data.add_argument(
        "--no-standardize", action="store_true", help="do not standardise continuous data inside the flow"
    )
    model = fit.add_argument_group("model")
    model.add_argument("--model", default="RealNVP", help="builder name (see 'flows models'; default: RealNVP)")
    model.add_argument("--transforms", type=int, default=6, help="number of layers (default: 6)")
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
    train.add_argument("--epochs", type=int, default=60, help="epochs (default: 60)")
    train.add_argument("--time-budget", type=float, help="stop after this many seconds of training")
    train.add_argument(
        "--batch-size", type=int, default=128, help="global batch size over all processes (default: 128)"
    )
    train.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (default: 2e-3)")
    train.add_argument(
        "--objective",
        choices=("ml", "fm"),
        default="ml",
        help="ml: maximum likelihood; fm: flow matching, for continuous flows (--model FFJORD --transforms 1) "
        "(default: ml)",
    )
    train.add_argument("--sigma", type=float, default=0.0, help="flow matching: noise level of the paths (default: 0)")
    train.add_argument(
        "--coupling",
        choices=("independent", "ot"),
        default="independent",
        help="flow matching: pairs of data and base samples, as drawn or by minibatch optimal transport "
        "(default: independent)",
    )
    train.add_argument(
        "--schedule",
        choices=("cosine", "plateau", "none"),
        default="cosine",
        help="learning-rate schedule (default: cosine)",
    )
    train.add_argument(
        "--clip", type=float, default=0.0, help="clip the global gradient norm to this value, 0 for none (default: 0)"
    )
    train.add_argument(
        "--patience", type=int, default=10, help="early-stopping patience in epochs, 0 for none (default: 10)"
    )
    train.add_argument(
        "--seed", type=int, default=0, help="seed of the model, the shuffling and the splits (default: 0)"
    )
    train.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads per process (default: 1; small flows gain little from more, and a busy "
        "machine makes extra threads much slower; use --nproc for parallel training)",
    )
    train.add_argument("--nproc", type=int, default=1, help="processes for data-parallel training (default: 1)")
    train.add_argument(
        "--compile",
        action="store_true",
        help="run the loss under torch.compile (needs a C++ compiler; pays off for runs of minutes)",
    )
    train.add_argument("--checkpoint-every", type=float, default=30.0, help="seconds between checkpoints (default: 30)")
    output = fit.add_argument_group("output")
    output.add_argument("--out", type=Path, help="run directory (default: runs/<data name>)")
    output.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    output.add_argument("--overwrite", action="store_true", help="start afresh even if --out holds a run")
    output.add_argument("--no-plots", action="store_true", help="do not write pictures")
    output.add_argument("--quiet", action="store_true", help="print only the final result")

    ev = sub.add_parser("eval", help="test log-likelihood (and bits/dim) of a trained run")
    ev.add_argument("run", type=Path, help="run directory or model.ckpt")
    ev.add_argument("--split", choices=("test", "val", "train"), default="test")
    ev.add_argument("--draws", type=int, default=10, help="dequantization draws for integer data (default: 10)")
    ev.add_argument("--data-dir", help="data directory for real data sets")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")

    sample = sub.add_parser("sample", help="draw samples to .npy and a picture")
    sample.add_argument("run", type=Path, help="run directory or model.ckpt")
    sample.add_argument("-n", "--num", type=int, default=64, help="number of samples (default: 64)")
    sample.add_argument("--out", type=Path, help="output .npy file (default: <run>/samples.npy)")
    sample.add_argument("--picture", type=Path, help="output picture (default: the .npy path with .png)")
    sample.add_argument("--seed", type=int, default=0)

    check = sub.add_parser("check", help="run flows.testing.check_bijection on every layer of a trained model")
    check.add_argument("run", type=Path, help="run directory or model.ckpt")
    check.add_argument("--num", type=int, default=3, help="test points to check on (default: 3)")
    check.add_argument("--atol", type=float, default=1e-6, help="tolerance in float64 (default: 1e-6)")
    check.add_argument("--data-dir", help="data directory for real data sets")

    sub.add_parser("models", help="list the model builders that --model accepts")
    return parser


def _launch(argv: Sequence[str], nproc: int) -> int:
    """Re-run this command under torchrun with ``nproc`` processes."""
    rest, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = i + 1 < len(argv)
            continue
        if arg.startswith("--nproc="):
            continue
        rest.append(arg)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "flows.cli",
        *rest,
    ]
    return subprocess.run(command, env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flows`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    from flows.train.checkpoint import CheckpointError
    from flows.train.guard import TrainingDiverged

    try:
        if args.command == "fit" and args.nproc > 1 and "LOCAL_RANK" not in os.environ:
            return _launch(argv, args.nproc)
        from flows import _cli_commands as commands

        return getattr(commands, args.command)(args)
    except TrainingDiverged as error:
        print(f"flows {args.command}: error: {error}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError, RuntimeError) as error:
        print(f"flows {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
