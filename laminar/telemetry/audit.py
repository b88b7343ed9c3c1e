"""`laminar audit RUN_DIR`: every trajectory the prompt pool issued was trained exactly once, or is lost for a
named reason, checked from the run folder's own records over every segment of a resumed run.

The records it reads, all in `metrics.jsonl` (plus `trajectories.jsonl` when the run saved it):
- `segment`: one per `laminar train` (a resume starts a new one), with the group size and how many groups the
  prompt pool had issued when it started;
- `step`: the ids trained by each trainer step (a step skipped for a non-finite loss consumed its ids without
  training on them: they are lost, for that reason), and with `trainer.filter_groups` the ids it set aside
  (`filtered_ids`: groups whose rewards were all equal, consumed without training; accounted for, not lost);
- `end`: what a segment left behind when it stopped: groups issued, ids in flight, held by the buffer, queued
  for re-issue, and ids the buffer dropped with the reason (evicted, stale).

A resumed segment continues from a checkpoint: the steps an earlier segment took past it were rolled back (their
weights were never kept), so a step record for step s drops every earlier record of a step >= s. Group ids are
issued in order from 0, so `issued_groups` names every id issued. A group trained with samples begun at
different versions is a fault too. `summary.json` takes its `lost` and `duplicated` from `audit_run`, so the
summary and the files cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from laminar.data.records import group_of, traj_id


@dataclass
class Audit:
    segments: int = 0
    issued: int = 0  # trajectory ids issued (every sample of every group)
    trained: int = 0  # distinct ids trained by the steps kept
    filtered: int = 0  # ids consumed without training: their group's rewards were all equal (filter_groups)
    filtered_groups: int = 0
    rolled_back_steps: int = 0  # step records of a segment, past the checkpoint the next segment resumed from
    pending: int = 0  # issued, not trained yet, and in flight, in the buffer or queued at the end: not lost
    duplicated: dict[str, int] = field(default_factory=dict)  # id -> times trained, when more than once
    lost: dict[str, str] = field(
        default_factory=dict
    )  # id -> why: issued, never trained, and nowhere at the end
    problems: list[str] = field(default_factory=list)  # records that contradict each other

    @property
    def unexplained(self) -> list[str]:
        return sorted(tid for tid, why in self.lost.items() if why == "unexplained")

    @property
    def ok(self) -> bool:
        return not self.duplicated and not self.unexplained and not self.problems

    def counts(self) -> dict[str, int]:
        """The numbers `summary.json` reports under `trajectories`."""
        return {
            "issued": self.issued,
            "trained": self.trained,
            "filtered": self.filtered,
            "lost": len(self.lost),
            "duplicated": sum(n - 1 for n in self.duplicated.values()),
        }


def _lineage(steps: Iterable[tuple[int, Any]]) -> tuple[dict[int, Any], int]:
    """The steps the final weights went through: a step s drops every earlier step >= s (a resume rolled them
    back). Returns the kept steps and how many were dropped."""
    kept: dict[int, Any] = {}
    dropped = 0
    for step, value in steps:
        stale = [s for s in kept if s >= step]
        dropped += len(stale)
        for s in stale:
            del kept[s]
        kept[step] = value
    return kept, dropped


def _mixed_groups(traj_versions: dict[str, list[int]]) -> set[int]:
    """Groups of one step whose samples began at different versions (a trajectory's first version is the
    lowest of its tokens': partial rollout only ever moves a trajectory forward)."""
    began: dict[int, set[int]] = {}
    for tid, versions in traj_versions.items():
        began.setdefault(group_of(tid), set()).add(min(versions))
    return {g for g, v in began.items() if len(v) > 1}


def audit_records(
    records: Iterable[dict[str, Any]],
    trajectories: Iterable[dict[str, Any]] | None = None,
    group_size: int | None = None,
) -> Audit:
    """The audit of one run from its records (`metrics.jsonl` rows, in order) and, if saved, its
    `trajectories.jsonl` rows. `group_size` is only needed for runs written before segments were recorded."""
    audit = Audit()
    # step -> ({id: versions of its tokens}, skipped for a non-finite loss, ids set aside by filter_groups)
    steps: list[tuple[int, tuple[dict[str, list[int]], bool, list[str]]]] = []
    last_start: dict[str, Any] = {}
    last_end: dict[str, Any] | None = None
    dispatched: set[int] = set()  # by the last segment
    ever_dispatched: set[int] = set()  # by any segment
    for r in records:
        kind = r.get("kind")
        if kind == "segment":
            audit.segments += 1
            last_start, last_end, dispatched = r, None, set()
            group_size = r.get("group_size", group_size)
        elif kind == "step":
            steps.append(
                (r["step"], (r["traj_versions"], bool(r.get("nonfinite")), r.get("filtered_ids", [])))
            )
        elif kind == "dispatch":
            dispatched.update(r["groups"])
            ever_dispatched.update(r["groups"])
        elif kind == "end":
            last_end = r
    audit.segments = max(audit.segments, 1)
    if group_size is None:
        raise ValueError("audit: the records name no group size (no `segment` record and no config)")

    kept, audit.rolled_back_steps = _lineage(steps)
    times = Counter(tid for ids, skipped, _ in kept.values() if not skipped for tid in ids)
    consumed = Counter(tid for ids, _, _ in kept.values() for tid in ids)
    skipped = {tid for ids, skip, _ in kept.values() if skip for tid in ids} - set(times)
    filtered = Counter(tid for _, _, ids in kept.values() for tid in ids)
    audit.trained = len(times)
    audit.filtered, audit.filtered_groups = len(filtered), len({group_of(t) for t in filtered})
    twice = sorted(tid for tid, n in filtered.items() if n > 1 or tid in consumed)
    if twice:
        audit.problems.append(f"set aside by filter_groups and also trained or set aside again: {twice[:5]}")
    audit.duplicated = {tid: n for tid, n in sorted(times.items()) if n > 1}

    if trajectories is not None:
        order: list[tuple[int, list[tuple[str, bool]]]] = []
        for row in trajectories:  # rows of one step are consecutive; a step number going back is a resume
            step = row["trained_at"]
            if not order or order[-1][0] != step:
                order.append((step, []))
            order[-1][1].append((row["traj_id"], bool(row.get("filtered"))))
        by_step, _ = _lineage(order)
        saved = Counter(tid for rows in by_step.values() for tid, aside in rows if not aside)
        saved_aside = Counter(tid for rows in by_step.values() for tid, aside in rows if aside)
        for what, files, records in (("trained", saved, consumed), ("set aside", saved_aside, filtered)):
            if files != records:
                differ = sorted(set(files.items()) ^ set(records.items()))[:5]
                audit.problems.append(
                    f"trajectories.jsonl and metrics.jsonl disagree on what was {what} (e.g. {differ})"
                )

    if last_end is not None:
        issued_groups = last_end["issued_groups"]
        pending = set(last_end["in_flight"]) | set(last_end["held"])
        queued = set(last_end["queued_groups"])
        dropped = dict(last_end["dropped"])
    else:
        # The last segment stopped without writing its frontier: what it issued is known from its dispatches.
        issued_groups = max([last_start.get("issued_groups", 0), *(g + 1 for g in dispatched)])
        pending, queued, dropped = set(), set(), {}
        audit.problems.append(
            f"segment {audit.segments} has no `end` record (the run did not stop cleanly): what it had in "
            "flight is unknown; resume it (`laminar train --resume RUN_DIR`) and audit again"
        )
    mixed = sorted(g for versions, _, _ in kept.values() for g in _mixed_groups(versions))
    if mixed:
        audit.problems.append(f"groups trained with samples of different versions: {mixed[:5]}")
    beyond = sorted(g for g in dispatched if g >= issued_groups)
    if beyond:
        audit.problems.append(
            f"groups {beyond[:5]} were dispatched but the prompt pool counts {issued_groups}"
        )
    never_issued = sorted(tid for tid in consumed + filtered if group_of(tid) >= issued_groups)
    if never_issued:
        audit.problems.append(f"trained but never issued: {never_issued[:5]} ({len(never_issued)} in all)")

    audit.issued = issued_groups * group_size
    # Every group issued is named by a record (its dispatch, its step, the end's frontier). The ids checked go
    # as far past the last one named as the records name groups, never to any count a record claims (a
    # tampered one would take forever): a count past that is a fault of its own.
    named = {group_of(t) for t in [*consumed, *filtered, *pending, *dropped]} | queued | ever_dispatched
    last = max((g for g in named if g < issued_groups), default=-1)
    checked = min(issued_groups, last + 1 + len(named))
    if issued_groups > checked:
        audit.problems.append(
            f"the prompt pool counts {issued_groups} groups issued, but the records name {len(named)} groups, "
            f"none past {last}"
        )
    for g in range(checked):
        for i in range(group_size):
            tid = traj_id(g, i)
            if tid in times or tid in filtered:
                continue
            if tid in skipped:
                audit.lost[tid] = "skipped_step"
            elif tid in pending or g in queued:
                audit.pending += 1
            else:
                audit.lost[tid] = dropped.get(tid, "unexplained")
    return audit


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A run log's rows; a cut last line (the run was killed mid-write) is left out, any other is an error."""
    lines = path.read_text().splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):  # a crash can cut the last line short
                break
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def audit_run(run_dir: str | Path) -> Audit:
    """The audit of a run folder written by `laminar train`."""
    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{run} holds no metrics.jsonl: not a run folder of `laminar train`")
    group_size = None
    config = run / "config.yaml"
    if config.is_file():
        group_size = (yaml.safe_load(config.read_text()) or {}).get("trainer", {}).get("group_size")
    saved = run / "trajectories.jsonl"
    return audit_records(read_jsonl(metrics), read_jsonl(saved) if saved.is_file() else None, group_size)


def report(audit: Audit) -> str:
    """A few lines a person reads: the counts, then each kind of fault with a few ids."""
    reasons = Counter(audit.lost.values())
    lines = [
        f"segments {audit.segments}, issued {audit.issued}, trained {audit.trained}"
        + (f", set aside by filter_groups {audit.filtered}" if audit.filtered else "")
        + f", pending at end "
        f"{audit.pending}, lost {len(audit.lost)}"
        + (f" ({', '.join(f'{why} {n}' for why, n in sorted(reasons.items()))})" if reasons else "")
        + f", duplicated {audit.counts()['duplicated']}",
    ]
    if audit.rolled_back_steps:
        lines.append(
            f"rolled back on resume: {audit.rolled_back_steps} steps past a checkpoint (not counted)"
        )
    if audit.duplicated:
        few = ", ".join(f"{t} x{n}" for t, n in list(audit.duplicated.items())[:5])
        lines.append(f"DUPLICATED: {len(audit.duplicated)} ids trained more than once, e.g. {few}")
    if audit.unexplained:
        lines.append(
            f"LOST without a reason: {len(audit.unexplained)} ids issued, never trained, and nowhere at the "
            f"end, e.g. {', '.join(audit.unexplained[:5])}"
        )
    lines += [f"PROBLEM: {p}" for p in audit.problems]
    lines.append("ok" if audit.ok else "FAILED")
    return "\n".join(lines)


def headline(audit: Audit) -> str:
    """What failed, in one line (`laminar train` exits with it); `report` has the rest."""
    parts = []
    if audit.unexplained:
        parts.append(
            f"{len(audit.unexplained)} ids lost without a reason (issued, never trained and nowhere at the end, "
            f"e.g. {', '.join(audit.unexplained[:3])})"
        )
    if audit.duplicated:
        parts.append(
            f"{len(audit.duplicated)} ids trained more than once (e.g. {next(iter(audit.duplicated))})"
        )
    parts += audit.problems[:1]
    if len(audit.problems) > 1:
        parts.append(f"{len(audit.problems) - 1} more problems")
    return "; ".join(parts) or "ok"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="laminar audit",
        description="Check that every trajectory of a run was trained exactly once or is lost for a reason.",
    )
    ap.add_argument("run_dir", help="a run folder written by `laminar train`")
    args = ap.parse_args(argv)
    try:
        audit = audit_run(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"laminar audit: {e}", file=sys.stderr)
        return 2
    print(report(audit))
    return 0 if audit.ok else 1
