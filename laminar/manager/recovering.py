"""Recovery: the work of a dead replica (what the partial pool holds of its samples in flight, and the groups
dispatched to it and never begun) placed on live replicas, group by group, by the pure `plan_recovery`; a group
whose version no live replica holds restarts whole. Repack's moves that neither end would take come here too."""

from __future__ import annotations

import asyncio
import time

import ray

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.manager.recovery import GroupWork, engine_items, lost_calls, plan_recovery


class NoLiveReplica(RuntimeError):
    """Work to place and no live replica to take it."""


class Recovering:
    """`Supervisor`'s recovery (its fleet, partial pool, buffer, sampling and run seed)."""

    async def recover(self, dead: int) -> None:
        """Every trajectory the dead replica owed: in flight (from the partial pool, which keeps each group's row)
        or dispatched to it and never begun (neither in the pool nor in the buffer). Samples repack moved away are
        in the pool under their destination and stay there."""
        async with self.fleet.placing:
            entries = await self.partial_pool.on_replica.remote(dead)
            groups = dict(self.fleet.owed.get(dead, {}))
            for e in entries:
                groups.setdefault(e.group_id, e.group())
            placed = await self.place(entries, groups)
            self.fleet.forget(dead)  # only now: a manager lost meanwhile recovers it again
            self.fleet.event("recovery", replica=dead, in_flight=len(entries), **placed)

    async def place(
        self, homeless: list[PartialTrajectory], groups: dict[int, PromptGroup]
    ) -> dict[str, int]:
        """Find a replica for each group with homeless samples (`plan_recovery`), version by version: a group
        whose version no live replica holds restarts whole, and the buffer forgets what it held of it. A target
        that changed version before the import refuses it; the group is planned again (bounded). The caller
        holds `fleet.placing`."""
        fleet = self.fleet
        done = {"recovered": 0, "restarted": 0, "restarted_groups": 0, "tool_reruns": 0}
        by_group: dict[int, list[PartialTrajectory]] = {}
        for e in homeless:
            by_group.setdefault(e.group_id, []).append(e)
        pending = set(groups)
        for _ in range(3):
            work = await self._group_work(
                {g: groups[g] for g in pending}, {g: by_group.get(g, []) for g in pending}
            )
            # one that does not answer in time (hung, or its machine going) takes nothing: the watch deals with it
            snaps = await asyncio.gather(*[self._snapshot_of(h) for h in fleet.handles.values()])
            live = {s.replica: s.version for s in snaps if s is not None and s.live}
            if not live:
                raise NoLiveReplica(f"no live replica is left to take the work of groups {sorted(pending)}")
            pending = set()
            for p in plan_recovery(work, live):
                items = engine_items(p, self.sampling, self.run_seed, time.time())
                gid, ids = p.group.group_id, [e.request_id for e, _ in items]
                if p.restart and not await self.buffer.restart_group.remote(
                    gid, [p.group.traj_id(i) for i in range(p.group.n)], p.version
                ):
                    continue  # it completed meanwhile
                try:
                    refused = await fleet.handles[p.replica].import_requests.remote(items)
                except ray.exceptions.RayError:
                    refused = ids  # it died or its loop stopped: plan again without it
                if refused:
                    pending.add(gid)
                    continue
                fresh = [s.sample_idx for e, s in items if not e.output_token_ids]
                if p.restart or fresh:
                    await self.partial_pool.restart.remote(p.group, fresh, p.replica, p.version)
                kept = [e.request_id for e, _ in items if e.output_token_ids]
                if kept:
                    await self.partial_pool.move.remote(kept, p.replica)
                done["recovered"] += len(kept)
                done["tool_reruns"] += lost_calls(items)
                done["restarted"] += len(fresh)
                done["restarted_groups"] += p.restart
                fleet.owe(p.replica, p.group, p.version)
            if not pending:
                break
        else:
            fleet.event("recovery_failed", groups=sorted(pending))
        fleet.count("recovered_trajectories", done["recovered"])
        fleet.count("restarted_trajectories", done["restarted"])
        fleet.count("restarted_groups", done["restarted_groups"])
        fleet.count("tool_reruns", done["tool_reruns"])
        return done

    async def _group_work(
        self, groups: dict[int, PromptGroup], homeless: dict[int, list[PartialTrajectory]]
    ) -> list[GroupWork]:
        """What the planner needs of each group: its homeless samples, those never begun, and every version its
        samples run or ran at (in flight anywhere, or held by the buffer)."""
        flying = await self.partial_pool.of_groups.remote(sorted(groups))
        work = []
        for gid, group in groups.items():
            ids = [group.traj_id(i) for i in range(group.n)]
            seen, held_versions = await self.buffer.group_state.remote(gid, ids)
            here = {e.traj_id for e in flying if e.group_id == gid}
            lost = {e.traj_id for e in homeless[gid]}
            unstarted = [i for i, t in enumerate(ids) if t not in here and t not in seen and t not in lost]
            versions = {e.version for e in flying if e.group_id == gid} | held_versions
            versions |= {e.version for e in homeless[gid]}
            work.append(GroupWork(group, homeless[gid], unstarted, versions))
        return work
