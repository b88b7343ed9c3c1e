"""Carrying out a repack plan: plan with the pure planner over the replicas' snapshots, move each trajectory
with the engine's export/import, and record it against its destination. A moved trajectory keeps its version,
its sampling stream and its tokens so far, so it ends exactly as it would have where it was."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import ray

from laminar.data.records import PromptGroup
from laminar.manager.repack import ReplicaLoad, plan_repack
from laminar.rollout.replica import InFlight


@dataclass
class RepackStats:
    count: int = 0  # repacks that moved something
    moved: int = 0
    released: int = 0
    refused: int = (
        0  # moves a destination refused (it changed version in between); offered back to the source
    )
    orphaned: int = 0  # refused by the source too (it had moved on to newer weights): placed by recovery
    overhead_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        o = self.overhead_s
        return {
            "count": self.count,
            "moved": self.moved,
            "released": self.released,
            "refused": self.refused,
            "orphaned": self.orphaned,
            "overhead_s": {"mean": sum(o) / len(o) if o else 0.0, "max": max(o) if o else 0.0},
        }


@dataclass
class RepackRound:
    events: list[dict[str, Any]] = field(default_factory=list)  # one per (source, destination) pair moved
    moved: list[tuple[int, PromptGroup]] = field(default_factory=list)  # (destination, group) now owed there
    orphans: list[tuple[Any, InFlight]] = field(default_factory=list)  # taken by neither end: for recovery


def load_of(snapshot: dict[str, Any]) -> ReplicaLoad:
    return ReplicaLoad(
        replica=snapshot["replica"],
        version=snapshot["version"],
        waiting=snapshot["waiting"],
        running=snapshot["running"],
        kv_blocks_used=snapshot["kv_used"],
        kv_blocks_total=snapshot["kv_total"],
        peak_kv_blocks=snapshot["peak_kv"],
        requests=tuple((rid, b) for rid, b in snapshot["requests"] if b > 0),
    )


async def _import(handle: Any, items: list[tuple[Any, InFlight]]) -> set[str]:
    """The ids the replica refused: all of them if it is dead or its loop has stopped."""
    try:
        return set(await handle.import_requests.remote(items))
    except ray.exceptions.RayError:
        return {state.group.traj_id(state.sample_idx) for _, state in items}


async def repack_once(
    handles: dict[int, Any],
    snapshots: list[dict[str, Any]],
    *,
    batch_limit_b: int,
    kv_capacity: float,
    stats: RepackStats,
    partial_pool: Any,
    max_released: int | None = None,
) -> RepackRound:
    """One repack round. `max_released` caps the replicas freed (the manager passes how many it has work for).
    Nothing exported is dropped: what the destination refuses goes back to its source, and what the source
    refuses too comes back as `orphans` for the recovery path."""
    t0 = time.perf_counter()
    plan = plan_repack(
        [load_of(s) for s in snapshots],
        batch_limit_b=batch_limit_b,
        kv_capacity_frac=kv_capacity,
        max_released=max_released,
    )
    out = RepackRound()
    if not plan.moves:
        return out
    by_pair: dict[tuple[int, int], list[str]] = defaultdict(list)
    for m in plan.moves:
        by_pair[(m.source, m.destination)].append(m.request_id)
    kept_back: set[int] = set()  # sources that still hold a planned trajectory (refused by its destination)
    for (src, dst), rids in sorted(by_pair.items()):
        try:
            items = await handles[src].export_requests.remote(rids)
        except ray.exceptions.RayError:
            continue  # the source died: its work is in the partial pool, under its name, for recovery
        if not items:  # they finished meanwhile
            continue
        refused = await _import(handles[dst], items)
        if refused:
            back = [it for it in items if it[1].group.traj_id(it[1].sample_idx) in refused]
            again = await _import(handles[src], back)  # a source that drained meanwhile pulled new weights
            out.orphans += [it for it in back if it[1].group.traj_id(it[1].sample_idx) in again]
            stats.refused += len(refused)
            stats.orphaned += len(again)
            if len(again) < len(back):
                kept_back.add(src)
        moved = [it for it in items if it[1].group.traj_id(it[1].sample_idx) not in refused]
        ids = [state.group.traj_id(state.sample_idx) for _, state in moved]
        if ids:
            await partial_pool.move.remote(ids, dst)
            out.moved += list({state.group.group_id: (dst, state.group) for _, state in moved}.values())
        stats.moved += len(ids)
        out.events.append(
            {"kind": "repack", "source": src, "destination": dst, "moved": len(ids), "ids": ids}
        )
    if out.events:
        stats.count += 1
        stats.released += len(set(plan.released) - kept_back)
        stats.overhead_s.append(time.perf_counter() - t0)
    return out
