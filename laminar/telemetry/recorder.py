"""Append-only run log: every record goes to `metrics.jsonl` as it happens and stays in memory for the summary.

The run's files are strict JSON: a NaN or inf (a skipped step's loss, say) is written as null, and the encoder
refuses any that slip past (`allow_nan=False`), so a reader in any language can parse every line."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from laminar.telemetry.console import Console
from laminar.telemetry.tracking import Trackers


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text: non-finite floats become null; anything else non-standard raises."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)


def write_json(path: str | Path, value: Any) -> Path:
    path = Path(path)
    path.write_text(dumps(value, indent=2) + "\n")
    return path


class Recorder:
    def __init__(
        self,
        out_dir: str | Path,
        t0: float | None = None,
        console: Console | None = None,
        trackers: Trackers | None = None,
    ) -> None:
        """`console`: where the records a person must see (errors, skipped steps) are also shown; `trackers`:
        TensorBoard and W&B, given every record (the driver's recorder only)."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time() if t0 is None else t0
        self.console = console
        self.trackers = trackers
        self.records: list[dict[str, Any]] = []
        self._file = open(self.out_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 - lives with the run

    def log(self, kind: str, t: float | None = None, **fields: Any) -> dict[str, Any]:
        """`t` is an absolute time.time(); stored relative to the run's start."""
        t_rel = round((time.time() if t is None else t) - self.t0, 4)
        record = finite_or_null({"kind": kind, "t": t_rel, **fields})
        self.records.append(record)
        self._file.write(dumps(record) + "\n")
        if self.console is not None:
            self.console.show(record)
        if self.trackers is not None:
            self.trackers.log(record)
        return record

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def close(self) -> None:
        self._file.close()
        if self.trackers is not None:
            self.trackers.close()
        if self.console is not None:
            self.console.flush()
