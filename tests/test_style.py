"""The code base is ruff-clean (lint and format), as configured in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.importorskip("ruff", reason="ruff is part of the test extra")
    return [sys.executable, "-m", "ruff"]


def test_ruff_lint() -> None:
    result = subprocess.run([*_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = subprocess.run([*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MARKERS = ("<" * 7 + " ", "=" * 7 + "\n", ">" * 7 + " ")


def test_no_file_holds_merge_conflict_markers() -> None:
    """A merge that committed ``<<<<<<<``/``>>>>>>>`` lines into docs or code fails here, not in a reader's eyes."""
    suffixes = {".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".json"}
    skip = {".git", ".venv", "venv", "build", "dist", "__pycache__"}
    bad = []
    for path in ROOT.rglob("*"):
        if path.suffix not in suffixes or skip & set(path.relative_to(ROOT).parts) or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(keepends=True), 1):
            if line.startswith(MARKERS[0]) or line.startswith(MARKERS[2]) or line == MARKERS[1]:
                bad.append(f"{path.relative_to(ROOT)}:{number}")
    assert not bad, f"merge conflict markers: {bad}"
