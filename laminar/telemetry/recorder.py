"""Append-only run log: every record goes to `metrics.jsonl` as it happens and stays in memory for the summary.

The run's files are strict JSON (`laminar.jsonio`): a NaN or inf (a skipped step's loss, say) is written as null,
so a reader in any language can parse every line."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from laminar.jsonio import dumps, finite_or_null, write_json
from laminar.telemetry.console import Console
from laminar.telemetry.tracking import Trackers

__all__ = ["Recorder", "dumps", "finite_or_null", "write_json"]


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

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A step's trajectories as text (`laminar.telemetry.samples`): appended to `samples.jsonl`, and shown
        by the trackers."""
        with open(self.out_dir / "samples.jsonl", "a") as f:
            f.writelines(dumps(row) + "\n" for row in rows)
        if self.trackers is not None:
            self.trackers.samples(step, rows)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def close(self) -> None:
        self._file.close()
        if self.trackers is not None:
            self.trackers.close()
        if self.console is not None:
            self.console.flush()


def write_trajectories(
    run_dir: Path,
    groups: list[list[Any]],
    version: int,
    filtered: Sequence[list[Any]] = (),
    text: Callable[[list[int], list[int]], str] | None = None,
) -> None:
    """What a step trained, as data: `trajectories.jsonl` in the run folder (one line per trajectory); those
    the step set aside (`trainer.filter_groups`) follow with `filtered: true`. `text(response_ids, loss_mask)`
    adds the response as the reward read it (`TaskCodec.response_text`), for a person reading the run."""
    rows = [(t, False) for g in groups for t in g] + [(t, True) for g in filtered for t in g]
    with open(Path(run_dir) / "trajectories.jsonl", "a") as f:
        for t, dropped in rows:
            row = {
                "traj_id": t.traj_id,
                "group_id": t.group_id,
                "version": t.version,
                "trained_at": version,
                "replica": t.replica,
                "reward": t.reward,
                "finish_reason": t.finish_reason,
                "prompt_ids": t.prompt_ids,
                "response_ids": t.response_ids,
                **({"response_text": text(t.response_ids, t.loss_mask)} if text is not None else {}),
                **({"loss_mask": t.loss_mask} if t.loss_mask else {}),  # 0: a tool's output
                **({"filtered": True} if dropped else {}),
            }
            f.write(dumps(row) + "\n")  # strict JSON, as every file of the run
