"""Metrics history of a training run: one record per epoch plus notable events, saved as JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from typing import Any

from flows.train._atomic import atomic_write_text

__all__ = ["History"]

logger = logging.getLogger("flows.train")


class History:
    """Per-epoch metrics (``records``) and events such as NaN-guard rollbacks (``events``).

    Each record is a flat dict of numbers, e.g. ``{"epoch": 3, "step": 120, "time": 4.2,
    "loss": 1.9, "val_loss": 2.0, "lr": 0.001}``. Files are written atomically.

    Example:
        >>> h = History()
        >>> h.append({"epoch": 1, "loss": 2.5})
        >>> h.append({"epoch": 2, "loss": 2.0, "val_loss": 2.1})
        >>> h["loss"], h.columns
        ([2.5, 2.0], ['epoch', 'loss', 'val_loss'])
    """

    def __init__(self) -> None:
        self.records: list[dict[str, float]] = []
        self.events: list[dict[str, Any]] = []

    def append(self, record: dict[str, float]) -> None:
        """Add one epoch's record."""
        self.records.append(dict(record))

    def event(self, step: int, message: str) -> None:
        """Record a notable event (e.g. a rollback) at a global step; also logged (``flows.train``, INFO)."""
        self.events.append({"step": step, "message": message})
        logger.info("step %d: %s", step, message)

    @property
    def columns(self) -> list[str]:
        """Every metric name, in order of first appearance."""
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)

    def __getitem__(self, name: str) -> list[float]:
        """The values of one metric over the epochs that have it."""
        return [r[name] for r in self.records if name in r]

    def __len__(self) -> int:
        return len(self.records)

    def last(self) -> dict[str, float]:
        """The most recent record (empty before the first epoch)."""
        return dict(self.records[-1]) if self.records else {}

    def to_json(self, path: str | os.PathLike) -> None:
        """Write ``{"records": [...], "events": [...]}`` (non-finite numbers as ``null``)."""
        data = {"records": [_finite(r) for r in self.records], "events": self.events}
        atomic_write_text(path, json.dumps(data, indent=1) + "\n")

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write one row per epoch, one column per metric (empty cells where a metric is absent)."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.records)
        atomic_write_text(path, buffer.getvalue())

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> History:
        """Read a file written by :meth:`to_json`."""
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        history = cls()
        history.records = [{k: math.nan if v is None else v for k, v in r.items()} for r in data["records"]]
        history.events = list(data.get("events", []))
        return history

    def state_dict(self) -> dict[str, Any]:
        """Plain lists and dicts (saved in checkpoints)."""
        return {"records": [dict(r) for r in self.records], "events": [dict(e) for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.records = [dict(r) for r in state["records"]]
        self.events = [dict(e) for e in state["events"]]


def _finite(record: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
