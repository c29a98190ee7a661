"""The README's install lines: portable for users, offline-safe for CI (``.ci/run`` runs the test command)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _command_after(marker: str) -> str:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    at = lines.index(f"<!-- {marker} -->")
    assert lines[at + 1] == "```bash"
    return lines[at + 2]


def test_main_command_names_the_pytorch_cpu_index_and_runs_in_one_line() -> None:
    command = _command_after("main-command")
    assert re.search(rf"--(extra-)?index-url {re.escape(CPU_INDEX)}\b", command), command
    assert command.startswith("pip install ") and command.endswith("&& flows fit")
    assert "torch==" not in command  # no pinned version that only a local mirror happens to hold


def test_ci_extracts_a_test_command_that_needs_only_pypi() -> None:
    """``.ci/run`` takes the line after the marker verbatim; CI reaches PyPI only."""
    if shutil.which("awk") is None:
        pytest.fail("awk is needed to read the test command as .ci/run does")
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    program = re.search(r"awk '([^']+)' README.md", script).group(1)
    extracted = subprocess.run(["awk", program, "README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    command = extracted.stdout.strip()
    assert command == _command_after("test-command")
    assert "pytest" in command and "download.pytorch.org" not in command
