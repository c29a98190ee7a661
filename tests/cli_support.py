"""Helpers shared by the command-line tests."""

from __future__ import annotations


def one_line_error(err: str, command: str) -> str:
    """The single ``flows COMMAND: error: ...`` line of ``err`` (asserting there is one, and no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"flows {command}: error: ") and "Traceback" not in err, err
    return lines[0]
