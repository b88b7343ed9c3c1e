"""The repack loop: every `interval_s` and right after each trainer update, plan with the pure planner over the
replicas' snapshots, move each trajectory with the engine's export/import, and record it against its
destination. A moved trajectory keeps its version, its sampling stream and its tokens so far, so it ends exactly
as it would have where it was; one that neither end would take goes through recovery."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from laminar.config import RepackConfig
from laminar.data.records import PromptGroup, ReplicaSnapshot
from laminar.manager.fleet import Fleet
from laminar.manager.repack import ReplicaLoad, plan_with, split_groups
from laminar.rollout.inflight import InFlight

log = logging.getLogger(__name__)


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
    # after each round that moved something, the groups left on more than one replica by its plan (each such
    # request drafts its speculative tokens from its own replica's part of the group only)
    split_groups: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        o, s = self.overhead_s, self.split_groups
        return {
            "count": self.count,
            "moved": self.moved,
            "released": self.released,
            "refused": self.refused,
            "orphaned": self.orphaned,
            "overhead_s": {"mean": sum(o) / len(o) if o else 0.0, "max": max(o) if o else 0.0},
            "split_groups": {
                "mean": sum(s) / len(s) if s else 0.0,
                "max": max(s) if s else 0,
                "last": s[-1] if s else 0,
            },
        }


@dataclass
class RepackRound:
    events: list[dict[str, Any]] = field(default_factory=list)  # one per (source, destination) pair moved
    moved: list[tuple[int, PromptGroup]] = field(default_factory=list)  # (destination, group) now owed there
    orphans: list[tuple[Any, InFlight]] = field(default_factory=list)  # taken by neither end: for recovery


def load_of(snapshot: ReplicaSnapshot) -> ReplicaLoad:
    return ReplicaLoad(
        replica=snapshot.replica,
        version=snapshot.version,
        waiting=snapshot.waiting,
        running=snapshot.running + snapshot.parked,  # a request waiting for its tool moves too
        kv_blocks_used=snapshot.kv_blocks_used,
        kv_blocks_total=snapshot.kv_blocks_total,
        peak_kv_blocks=snapshot.peak_kv_blocks,
        requests=tuple((rid, b) for rid, b in snapshot.requests if b > 0),
    )


async def _import(handle: Any, items: list[tuple[Any, InFlight]]) -> set[str]:
    """The ids the replica refused: all of them if it is dead or its loop has stopped."""
    try:
        return set(await handle.import_requests.remote(items))
    except ray.exceptions.RayError:
        return {state.group.traj_id(state.sample_idx) for _, state in items}


async def repack_once(
    handles: dict[int, Any],
    snapshots: list[ReplicaSnapshot],
    *,
    policy: RepackConfig,
    trainer_version: int,
    stats: RepackStats,
    partial_pool: Any,
    max_released: int | None = None,
) -> RepackRound:
    """One repack round of the run's repack `policy` (`plan_with`). `max_released` caps the replicas freed (the
    manager passes how many it has work for); with `policy.move_kv` the moved requests take their cached keys
    and values along.
    Nothing exported is dropped: what the destination refuses goes back to its source, and what the source
    refuses too comes back as `orphans` for the recovery path."""
    t0 = time.perf_counter()
    loads = [load_of(s) for s in snapshots]
    plan = plan_with(policy, loads, trainer_version=trainer_version, max_released=max_released)
    out = RepackRound()
    if not plan.moves:
        return out
    by_pair: dict[tuple[int, int], list[str]] = defaultdict(list)
    for m in plan.moves:
        by_pair[(m.source, m.destination)].append(m.request_id)
    kept_back: set[int] = set()  # sources that still hold a planned trajectory (refused by its destination)
    for (src, dst), rids in sorted(by_pair.items()):
        try:
            items = await handles[src].export_requests.remote(rids, policy.move_kv)
        except ray.exceptions.RayError:
            continue  # the source died: its work is in the partial pool, under its name, for recovery
        exported = {state.group.traj_id(state.sample_idx) for _, state in items}
        if len(exported) < len(rids) and await _still_holds(handles[src], set(rids) - exported):
            kept_back.add(src)  # a request parked on a call that outlasted the export's wait stayed behind
        if not items:  # they finished meanwhile, or stayed
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
        stats.split_groups.append(split_groups(loads, plan))
    return out


async def _still_holds(handle: Any, rids: set[str]) -> bool:
    """Whether the replica still has any of these requests (not finished): the source is not released then."""
    try:
        snap = await handle.snapshot.remote()
    except ray.exceptions.RayError:
        return False  # it died: recovery owns its work
    return bool(rids & set(snap.inflight))


class RepackLoop:
    """Runs beside the dispatcher and the supervisor on the manager's event loop; `place` is the supervisor's
    (recovery), used for moves neither end would take."""

    def __init__(
        self,
        fleet: Fleet,
        settings: RepackConfig,
        dispatcher: Any,
        partial_pool: Any,
        place: Any,
        answer_s: float,
    ) -> None:
        self.fleet, self.settings, self.dispatcher = fleet, settings, dispatcher
        self.partial_pool, self.place = partial_pool, place
        self.answer_s = answer_s  # rollout.dead_after_s: a replica silent this long sits the round out
        self.stats = RepackStats()

    def apply(self, r: dict[str, Any]) -> None:
        """The stats after a round, as the manager's journal has them."""
        self.stats = RepackStats(**r["stats"])

    async def run(self) -> None:
        updated = self.dispatcher.updated
        while not self.dispatcher.stopped:
            try:
                await asyncio.wait_for(updated.wait(), self.settings.interval_s)
            except TimeoutError:
                pass
            updated.clear()
            if self.dispatcher.stopped:
                return
            try:
                await self.once()
            except Exception as e:  # noqa: BLE001 - a failed round is reported, the loop goes on
                log.warning("repack round failed: %r", e)
                self.fleet.event("repack_error", error=repr(e))

    async def once(self) -> None:
        """A round, unless the dispatch rule has no work for a freed replica (`only_with_work`): then the tails
        stay where they run fastest."""
        max_released = None
        if self.settings.only_with_work:
            max_released = self.dispatcher.replicas_with_work()
            if max_released == 0:
                return
        async with self.fleet.placing:
            await self.round(max_released)

    async def round(self, max_released: int | None) -> None:
        """Moved groups are owed by their destination too (so its death recovers them with their row), and
        moves neither end would take go through recovery. The caller holds `fleet.placing`."""
        fleet = self.fleet
        before = asdict(self.stats)
        snaps = await asyncio.gather(  # a hung replica must not hold `placing` (recovery waits for it)
            *[asyncio.wait_for(h.snapshot.remote(), self.answer_s) for h in fleet.handles.values()],
            return_exceptions=True,
        )
        done = await repack_once(
            fleet.handles,
            [s for s in snaps if isinstance(s, ReplicaSnapshot) and not s.error],
            policy=self.settings,
            trainer_version=self.dispatcher.trainer_version,
            stats=self.stats,
            partial_pool=self.partial_pool,
            max_released=max_released,
        )
        if asdict(self.stats) != before:
            fleet.journal({"part": "repack", "op": "stats", "stats": asdict(self.stats)})
        now = time.time()
        for e in done.events:
            fleet.event(e.pop("kind"), t=now, **e)
        for dst, group in done.moved:
            fleet.owe(dst, group)
        if done.orphans:
            # from what the partial pool holds (tokens, mask and tool turns), so its record stays whole; the rest
            # is made again
            ids = {exported.request_id for exported, _ in done.orphans}
            groups = sorted({state.group.group_id for _, state in done.orphans})
            homeless = [e for e in await self.partial_pool.of_groups.remote(groups) if e.traj_id in ids]
            placed = await self.place(homeless, {s.group.group_id: s.group for _, s in done.orphans})
            fleet.event("recovery", orphans=len(homeless), **placed)
