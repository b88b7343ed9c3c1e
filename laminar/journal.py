"""A control actor's journal: what it changed since its last snapshot, so that its restarted self continues where
it stood. Ray restarts a lost control actor's process with the same constructor arguments; the constructor finds
the journal and replays it before the actor answers a call.

Records are JSON lines in `DIR/NAME.jsonl`, numbered, each written and flushed to the operating system before
the call that made the change returns: they outlive the process, not the machine (the control plane lives on
the driver's machine, whose loss is the driver's, and `laminar train --resume` takes the checkpoint). Once the
tail outgrows twice the last snapshot (and `min_bytes`), the whole state goes to `NAME.snapshot.json` and the
tail starts again, so a replay reads one snapshot and a bounded tail, and snapshots cost a constant share of
the writes. A kill between the snapshot's rename and the tail's truncation is harmless: records numbered at or
below the snapshot's are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laminar.jsonio import dumps

COMPACT = (",", ":")


def _text(value: Any) -> str:
    """Strict JSON, as every JSON file of a run (`laminar.jsonio`), without walking every number first when
    none is out of range (a journal line is written on every change)."""
    try:
        return json.dumps(value, allow_nan=False, separators=COMPACT)
    except ValueError:
        return dumps(value, separators=COMPACT)


class JournalError(RuntimeError):
    """A journal that cannot be read back (not one torn last line: a damaged file)."""


class Journal:
    def __init__(self, directory: str | Path, name: str, state: Callable[[], Any], min_bytes: int = 4 << 20):
        """`state()` is the actor's whole state as JSON data, taken when the journal compacts."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tail = self.dir / f"{name}.jsonl"
        self.snapshot = self.dir / f"{name}.snapshot.json"
        self.state, self.min_bytes = state, min_bytes
        self.limit = min_bytes
        self.seq = 0
        self.size = 0
        self._file: Any = None

    def replay(self) -> tuple[Any, list[dict[str, Any]]]:
        """What an earlier incarnation left: its last snapshot's state (None: none) and the records after it, in
        order (empty for a first incarnation). A last line cut short by the kill was never acknowledged: it goes."""
        state, after = None, 0
        if self.snapshot.exists():
            snap = json.loads(self.snapshot.read_text())
            state, after = snap["state"], snap["seq"]
            self.limit = max(self.min_bytes, 2 * self.snapshot.stat().st_size)
        records = []
        if self.tail.exists():
            data = self.tail.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) < len(data):
                with open(self.tail, "r+b") as f:
                    f.truncate(len(whole))
            for n, line in enumerate(whole.splitlines(), 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise JournalError(f"{self.tail}:{n}: not JSON ({e.msg})") from None
                if record["seq"] > after:
                    records.append(record)
            self.size = len(whole)
        self.seq = max([after, *(r["seq"] for r in records)])
        return state, records

    def append(self, record: dict[str, Any]) -> None:
        """One change, on disk (the OS's page cache) when this returns; compacts when the tail is due."""
        if self._file is None:
            self._file = open(self.tail, "ab")  # noqa: SIM115 - held open for the actor's life
        self.seq += 1
        line = (_text({"seq": self.seq, **record}) + "\n").encode()
        self._file.write(line)
        self._file.flush()
        self.size += len(line)
        if self.size > self.limit:
            self.compact()

    def compact(self) -> None:
        """The whole state as the new snapshot (written beside and renamed), then an empty tail."""
        data = _text({"seq": self.seq, "state": self.state()})
        part = self.snapshot.with_name(self.snapshot.name + ".part")
        part.write_text(data)
        part.replace(self.snapshot)
        if self._file is not None:
            self._file.close()
        self._file = open(self.tail, "wb")  # noqa: SIM115 - held open for the actor's life
        self.size = 0
        self.limit = max(self.min_bytes, 2 * len(data))
