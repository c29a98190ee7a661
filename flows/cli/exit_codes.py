"""The exit statuses of the ``flows`` command (documented in :mod:`flows.cli` and ``flows --help``)."""

__all__ = ["EXIT_CODES"]

EXIT_CODES = {
    0: "success",
    1: "training diverged (non-finite steps, every step skipped, or a best model far worse than the untrained one), "
    "or 'flows check' found a failing layer",
    2: "bad arguments or inputs (out-of-range option, missing/unreadable/malformed data, damaged checkpoint, "
    "unwritable output, data changed since the run)",
    3: "internal error (a bug: set FLOWS_TRACEBACK=1 and report the traceback)",
    130: "interrupted: 'flows fit' stopped by Ctrl-C/SIGTERM/SIGHUP after writing its checkpoint (continue with "
    "--resume), or any command stopped by Ctrl-C",
}
"""Exit status of the ``flows`` command and its meaning."""
