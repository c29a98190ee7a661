"""``flows`` entry point: parse, dispatch to the command, turn every failure into one line and an exit status."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from flows.cli.exit_codes import EXIT_CODES
from flows.cli.parser import _parser

__all__ = ["EXIT_CODES", "main"]


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
    root = str(Path(__file__).resolve().parents[2])
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
    from flows.cli import _interrupt

    argv = list(sys.argv[1:] if argv is None else argv)
    _interrupt.restore()  # from here on Ctrl-C raises KeyboardInterrupt, answered below
    try:
        args = _parser().parse_args(argv)
        from flows.train.checkpoint import CheckpointError
        from flows.train.guard import TrainingDiverged
    except KeyboardInterrupt:
        _interrupt.ignore_further()
        print("flows: interrupted", file=sys.stderr)
        return 130

    try:
        if args.command == "fit" and args.nproc > 1 and "LOCAL_RANK" not in os.environ:
            return _launch(argv, args.nproc)
        from flows.cli.commands import command

        with _one_line_warnings(args.command):
            status = command(args.command)(args)
        if status == 130:  # stopped by a signal: more of them while the process exits must not give a traceback
            _interrupt.ignore_further()
        return status
    except TrainingDiverged as error:
        return _fail(args.command, error, 1)
    except (ValueError, TypeError, CheckpointError, ImportError, RuntimeError, MemoryError) as error:
        return _fail(args.command, error, 2)
    except OSError as error:  # missing, unreadable or unwritable files and directories, full disks
        return _fail(args.command, _os_error(error), 2)
    except KeyboardInterrupt:
        _interrupt.ignore_further()  # more Ctrl-C while stopping must not print a traceback from atexit
        print(f"flows {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug: still one line, with a way to see the traceback
        if os.environ.get("FLOWS_TRACEBACK"):
            raise
        return _fail(
            args.command,
            f"internal error ({type(error).__name__}: {_one_line(str(error))}); "
            "set FLOWS_TRACEBACK=1 to see the traceback and please report it",
            3,
        )


@contextlib.contextmanager
def _one_line_warnings(name: str) -> Iterator[None]:
    """Warnings raised during a command print as ``flows NAME: warning: ...``, one line, like the CLI's own.

    Python's default format is two lines with a file path and a source line; the progress bar
    writes warnings through the same ``warnings.formatwarning``, so both get this format.
    """
    original = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None) -> str:
        return f"flows {name}: warning: {_one_line(str(message))}\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = original


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines) if len(lines) <= 3 else " ".join(lines[:3]) + " ..."


def _os_error(error: OSError) -> str:
    """``'PATH': reason`` for an OS error (``[Errno 13] Permission denied: 'x'`` becomes ``'x': permission denied``)."""
    if error.filename is None or not error.strerror:
        return str(error)
    where = repr(str(error.filename))
    if error.filename2 is not None:
        where += f" -> {str(error.filename2)!r}"
    reason = error.strerror[0].lower() + error.strerror[1:]
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        reason += " (the disk or quota is full: the file was not written, earlier files of the name are unchanged)"
    return f"{where}: {reason}"


def _fail(command: str, error: BaseException | str, code: int) -> int:
    if os.environ.get("FLOWS_TRACEBACK") and isinstance(error, BaseException):
        import traceback

        traceback.print_exception(error)
    message = error if isinstance(error, str) else str(error)
    if isinstance(error, MemoryError):
        message = f"out of memory ({message or 'MemoryError'}); try smaller sizes"
    print(f"flows {command}: error: {_one_line(message)}", file=sys.stderr)
    return code
