"""Run a benchmark or example script in the test process, as ``python <script>`` would.

``python benchmarks/x.py`` puts the script's own folder first on ``sys.path`` (that is how a
benchmark imports ``_harness``); :func:`run_script` does the same for the duration of the run, so a
test calls the script's ``main`` with a tiny budget instead of paying for a subprocess.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_script(path: str | Path, run_name: str = "benchmark") -> dict[str, Any]:
    """The globals of the script at ``path`` (relative to the repository root, or absolute); ``main`` not run."""
    path = ROOT / path
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        return runpy.run_path(str(path), run_name=run_name)
    finally:
        sys.path.remove(folder)


def script_main(path: str | Path, run_name: str = "benchmark"):
    """The ``main`` function of the script at ``path``."""
    return run_script(path, run_name)["main"]
