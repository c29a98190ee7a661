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

Every error is one line on standard error, ``flows <command>: error: ...``, never a traceback, and
the exit status says what kind of failure it was (see :data:`EXIT_CODES`, also in ``flows --help``):

* 0: success;
* 1: the work ran and failed: training diverged (non-finite loss or weights after the guard's
  retries), or ``flows check`` found a layer that fails its checks;
* 2: bad arguments or inputs: an option out of range, a missing, unreadable or malformed data
  file, a damaged checkpoint, an unwritable output path (any OS error), data that changed since
  the run was trained;
* 3: an internal error (a bug in flows: please report it; set ``FLOWS_TRACEBACK=1`` to see the
  traceback);
* 130: ``flows fit`` was stopped by Ctrl-C, SIGTERM or SIGHUP after writing its checkpoint (continue
  with ``--resume``), or a command was interrupted by Ctrl-C (also while it imports; one line, no
  traceback, further Ctrl-C ignored while it stops).

``flows fit --out DIR`` writes only the files named in :data:`flows.train.runs.RUN_FILES` and
refuses, before any work, a ``DIR`` that already holds any of them (a user's own ``metrics.csv``
is never replaced); ``--overwrite`` removes all of them first, so a run that fails midway never
leaves the old model beside its own ``run.json``. ``flows sample`` writes atomically (temporary
file, fsync, rename). A full disk ends in one line naming the file not written.

Runs record a SHA-256 fingerprint of their data (the values of every split, and the file's bytes
for file data) in ``run.json`` and in their checkpoints. ``flows eval`` and ``flows check`` refuse
to score a run on data that no longer matches it (``--allow-changed-data`` scores it anyway, with
a warning), ``flows fit --resume`` refuses to continue on changed data, and ``flows sample``
(whose samples do not depend on the data) warns.

Layout: :mod:`flows.cli.parser` (options), :mod:`flows.cli.fit_flags` (the table of ``flows fit``'s
flags, from which its options, its ``--resume`` help and its checks are derived),
:mod:`flows.cli.app` (:func:`main`, errors and exit statuses), one module per command
(:mod:`~flows.cli.fit`, :mod:`~flows.cli.evaluate`, :mod:`~flows.cli.sample`,
:mod:`~flows.cli.check`, :mod:`~flows.cli.models`) imported only when that command runs, and
:mod:`flows.cli.commands`, the table from command name to function.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXIT_CODES", "main"]

# Imported when first used (PEP 562), so that ``flows/__init__.py`` can import ``flows.cli._interrupt`` before torch.
_LAZY = {"main": "flows.cli.app", "EXIT_CODES": "flows.cli.exit_codes", "_parser": "flows.cli.parser"}


def __getattr__(name: str) -> Any:
    """``main``, ``EXIT_CODES`` and ``_parser`` (the tests walk the parser), imported on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
