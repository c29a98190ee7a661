"""Ctrl-C in the ``flows`` command outside training: one line and exit status 130, never a traceback.

Importing ``flows`` (torch above all) takes seconds, before :func:`flows.cli.main` runs, so a
Ctrl-C then would end in a ``KeyboardInterrupt`` traceback and a process killed by SIGINT
(status -2). ``flows/__init__.py`` imports this module first, which calls :func:`install_while_importing`: when
the process is the ``flows`` command (the console script or ``python -m flows.cli``) it installs a
SIGINT handler that prints ``flows: interrupted`` and exits with 130. :func:`main
<flows.cli.main>` puts Python's own handler back once it runs (its ``except KeyboardInterrupt``
then gives the same line and status), and :func:`ignore_further` makes later presses of Ctrl-C,
while the command is already stopping, do nothing (a third Ctrl-C during interpreter shutdown
used to print an ``atexit`` traceback).

This module imports nothing from flows (it runs before the package is imported).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["ignore_further", "install_while_importing", "is_command_process", "restore"]

#: The exit status of an interrupted command (128 + SIGINT, the shell's convention).
INTERRUPTED = 130


def is_command_process() -> bool:
    """Whether this process runs the ``flows`` command (the console script or ``python -m flows.cli``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] in ("flows.cli", "flows.cli.__main__"):
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ("flows", "flows.exe", "flows-script.py")


def _while_importing(signum: int, frame: object) -> None:
    try:
        sys.stderr.write("flows: interrupted (while starting)\n")
        sys.stderr.flush()
    finally:
        os._exit(INTERRUPTED)  # nothing has been written yet; no cleanup to run


def install_while_importing() -> None:
    """In the ``flows`` command's process only: Ctrl-C before :func:`flows.cli.main` runs exits 130 with one line."""
    if not is_command_process():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _while_importing)
    except ValueError:  # pragma: no cover - not the main thread
        pass


def restore() -> None:
    """Python's own SIGINT handler (``KeyboardInterrupt``) in place of the import-time one, if that is installed."""
    try:
        if signal.getsignal(signal.SIGINT) is _while_importing:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # pragma: no cover - not the main thread
        pass


def ignore_further() -> None:
    """In the command's process, once it is stopping on Ctrl-C: ignore further SIGINT, SIGTERM and SIGHUP."""
    if not is_command_process():
        return
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            try:
                signal.signal(getattr(signal, name), signal.SIG_IGN)
            except ValueError:  # pragma: no cover - not the main thread
                pass


install_while_importing()  # at import: flows/__init__.py imports this module before anything heavy
