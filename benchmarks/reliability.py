"""Run the robustness attack table (tests/robustness) and count how every attack ended.

Counts per family and in total: attacks tried, ok (right result), clear error, silent wrong, raw
crash, hang, code executions and lost runs; then every failure with what happened. The target is
zero silent wrong answers, zero raw crashes, zero hangs, zero code executions and zero lost runs.

Usage::

    python -m benchmarks.reliability                       # the whole table (about a minute or two)
    python -m benchmarks.reliability --family cli --family kill
    python -m benchmarks.reliability --match api/affine/   # attacks whose id contains a string
    python -m benchmarks.reliability --markdown            # also rewrite the table in docs/reliability.md

Run as a module from the repository root: the table is the test suite's (``tests.robustness``),
and ``python -m`` puts the root on ``sys.path`` (no path edits here). Single-threaded
torch (``torch.set_num_threads(1)``); the counts do not depend on timing except for hangs.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["main", "markdown_table"]

BEGIN, END = "<!-- reliability-table:begin -->", "<!-- reliability-table:end -->"
COLUMNS = ("ok", "clear_error", "silent_wrong", "raw_crash", "hang", "code_execution", "lost_run")
HEADINGS = (
    "family",
    "attacks",
    "ok",
    "clear error",
    "silent wrong",
    "raw crash",
    "hang",
    "code executions",
    "lost runs",
)


def markdown_table(counts: dict[str, collections.Counter]) -> str:
    """The counts as a Markdown table, one row per family and a total row."""
    lines = ["| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
    total: collections.Counter = collections.Counter()
    for family, counter in counts.items():
        total.update(counter)
        lines.append(
            "| " + " | ".join([family, str(sum(counter.values()))] + [str(counter[c]) for c in COLUMNS]) + " |"
        )
    lines.append(
        "| " + " | ".join(["**total**", f"**{sum(total.values())}**"] + [f"**{total[c]}**" for c in COLUMNS]) + " |"
    )
    return "\n".join(lines)


def _write_markdown(table: str, note: str, path: Path) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"expected the markers {BEGIN} and {END} in {path}, got a file without them")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{note}\n\n{table}\n{END}{tail}")


def main(argv: Sequence[str] | None = None) -> dict[str, collections.Counter]:
    """Run the table; returns the outcome counts per family."""
    import torch

    from tests.robustness.table import FAILURES, all_attacks, run_attack

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", help="only this family (repeatable)")
    parser.add_argument("--match", help="only attacks whose id contains this text")
    parser.add_argument("--markdown", action="store_true", help="rewrite the table in docs/reliability.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "reliability.md", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    attacks = all_attacks(tuple(args.family) if args.family else None)
    if args.match:
        attacks = [a for a in attacks if args.match in a.id]
    counts: dict[str, collections.Counter] = {}
    failures = []
    start = time.perf_counter()
    for attack in attacks:
        result = run_attack(attack)
        counts.setdefault(attack.family, collections.Counter())[result.outcome.value] += 1
        if result.outcome in FAILURES:
            failures.append((attack.id, result.outcome.value, result.detail))
    seconds = time.perf_counter() - start

    table = markdown_table(counts)
    print(table)
    print(f"\n{len(attacks)} attacks in {seconds:.0f} s (torch threads: {torch.get_num_threads()})")
    print(f"\n{len(failures)} failure(s):" if failures else "\nno failures")
    for attack_id, outcome, detail in failures:
        print(f"  {outcome:<14} {attack_id}: {detail}")
    if args.markdown:
        import flows

        command = "python -m benchmarks.reliability --markdown"
        note = f"Counts from `{command}` (flows {flows.__version__}, {len(attacks)} attacks)."
        _write_markdown(table, note, args.doc)
        print(f"\nwrote the table to {args.doc}")
    return counts


if __name__ == "__main__":
    main()
