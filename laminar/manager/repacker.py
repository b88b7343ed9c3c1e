"""Carrying out a repack plan: snapshot the replicas, plan with the pure planner, move each trajectory with
the engine's export/import. A moved trajectory keeps its version, its sampling stream and its tokens so far,
so it ends exactly as it would have where it was."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from laminar.manager.repack import ReplicaLoad, plan_repack


@dataclass
class RepackStats:
    count: int = 0  # repacks that moved something
    moved: int = 0
    released: int = 0
    refused: int = 0  # moves a destination refused (it changed version in between); put back on the source
    overhead_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        o = self.overhead_s
        return {
            "count": self.count,
            "moved": self.moved,
            "released": self.released,
            "refused": self.refused,
            "overhead_s": {"mean": sum(o) / len(o) if o else 0.0, "max": max(o) if o else 0.0},
        }


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


async def repack_once(
    handles: dict[int, Any],
    snapshots: list[dict[str, Any]],
    *,
    batch_limit_b: int,
    kv_capacity: float,
    stats: RepackStats,
    partial_pool: Any,
    max_released: int | None = None,
) -> list[dict[str, Any]]:
    """One repack round; returns the events to log (one per source emptied). `max_released` caps the replicas
    freed (the manager passes how many it has work for)."""
    t0 = time.perf_counter()
    plan = plan_repack(
        [load_of(s) for s in snapshots],
        batch_limit_b=batch_limit_b,
        kv_capacity_frac=kv_capacity,
        max_released=max_released,
    )
    if not plan.moves:
        return []
    by_pair: dict[tuple[int, int], list[str]] = defaultdict(list)
    for m in plan.moves:
        by_pair[(m.source, m.destination)].append(m.request_id)
    events = []
    kept_back: set[int] = set()  # sources that still hold a planned trajectory (refused by its destination)
    for (src, dst), rids in sorted(by_pair.items()):
        items = await handles[src].export_requests.remote(rids)
        if not items:  # they finished meanwhile
            continue
        refused = set(await handles[dst].import_requests.remote(items))
        if refused:  # back where they came from; same version there, since it had not drained
            back = [it for it in items if it[1].group.traj_id(it[1].sample_idx) in refused]
            await handles[src].import_requests.remote(back)
            stats.refused += len(refused)
            kept_back.add(src)
        moved = [
            it[1].group.traj_id(it[1].sample_idx)
            for it in items
            if it[1].group.traj_id(it[1].sample_idx) not in refused
        ]
        for rid in moved:
            partial_pool.move.remote(rid, dst)
        stats.moved += len(moved)
        events.append(
            {"kind": "repack", "source": src, "destination": dst, "moved": len(moved), "ids": moved}
        )
    if not events:
        return []
    stats.count += 1
    stats.released += len(set(plan.released) - kept_back)
    stats.overhead_s.append(time.perf_counter() - t0)
    return events
