"""Append-only run log: every record goes to `metrics.jsonl` as it happens and stays in memory for the summary."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class Recorder:
    def __init__(self, out_dir: str | Path, t0: float | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time() if t0 is None else t0
        self.records: list[dict[str, Any]] = []
        self._file = open(self.out_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 - lives with the run

    def log(self, kind: str, t: float | None = None, **fields: Any) -> dict[str, Any]:
        """`t` is an absolute time.time(); stored relative to the run's start."""
        record = {"kind": kind, "t": round((time.time() if t is None else t) - self.t0, 4), **fields}
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        return record

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def close(self) -> None:
        self._file.close()
