"""The rollout manager: hands prompt groups to replicas when they ask, keeps their states, and records the
timeline (KV use, version) that the plots and the repack planner read.

What a schedule changes here is only *when* a replica may have work: `Dispatch` is that decision
(`laminar.manager.dispatch`), the schedule's rule (`laminar.schedules.Schedule`). The manager is schedule-agnostic.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import ray

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.manager.dispatch import Dispatch
from laminar.manager.recovery import GroupWork, plan_recovery
from laminar.manager.repacker import RepackStats, repack_once

log = logging.getLogger(__name__)


class RolloutFailure(RuntimeError):
    """Replicas keep failing the same way: replacing them again would only fail again."""


class MachineLost(RuntimeError):
    """A relay could not start on a machine: it is gone, or going."""


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def repeated_failure(signatures: list[str], in_a_row: int) -> bool:
    """True when the last `in_a_row` replica errors are the same error (`describe_error`'s signature)."""
    return len(signatures) >= in_a_row and len(set(signatures[-in_a_row:])) == 1


@dataclass
class ReplicaState:
    replica: int
    snapshot: dict[str, Any] = field(default_factory=dict)
    last_beat: float = 0.0
    groups: dict[int, PromptGroup] = field(default_factory=dict)  # dispatched, not yet complete


class RolloutManager:
    """Runs as an async Ray actor (`laminar.runtime`); every method is short and never blocks the event loop."""

    def __init__(self, prompt_pool: Any, dispatch: Dispatch, t0: float, poll_s: float = 0.5) -> None:
        self.prompt_pool = prompt_pool
        self.dispatch = dispatch
        self.t0 = t0
        self.poll_s = poll_s
        self.replicas: dict[int, ReplicaState] = {}
        self.trainer_version = 0
        self.dispatched_groups = 0
        self.consumed_groups = 0
        self.timeline: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.stopped = False
        self._changed = asyncio.Event()
        self._updated = asyncio.Event()  # a trainer update: a moment to repack (design section 5)
        self.handles: dict[int, Any] = {}
        self.relays_made = 0
        self.repack_cfg: dict[str, Any] | None = None
        self.repack_stats = RepackStats()
        self.failures = {
            "rollouts": 0,
            "relays": 0,
            "trainer": 0,
            "recovered_trajectories": 0,
            "restarted_trajectories": 0,
            "restarted_groups": 0,
        }
        self._placing = asyncio.Lock()  # a repack round's moves and a recovery never interleave
        self._tasks: list[asyncio.Task] = []
        self.error_signatures: list[str] = []  # every replica error, in the order seen
        self.max_failures_in_a_row = 3
        self.fatal: str | None = None  # why the run must stop; the driver asks (`fatal_error`)

    def configure(
        self,
        handles: dict[int, Any],
        *,
        partial_pool: Any,
        buffer: Any,
        sampling: dict[str, Any],
        run_seed: int,
        repack: dict[str, Any] | None,
        replica_spec: dict[str, Any],
        relays: list[Any],
        relay_settings: Any,
        relay_of_node: dict[str, Any],
        master_node: str,
        node_of_replica: dict[int, str],
        heartbeat_s: float,
        dead_after_s: float,
        timeout_s: float,
        max_failures_in_a_row: int = 3,
    ) -> None:
        """What the background loops need: the replicas and relays, and how to make new ones."""
        self.handles = dict(handles)
        self.partial_pool, self.buffer, self.sampling, self.run_seed = (
            partial_pool,
            buffer,
            sampling,
            run_seed,
        )
        self.repack_cfg, self.replica_spec = repack, replica_spec
        self.relays, self.relay_of_node, self.node_of_replica = (
            list(relays),
            dict(relay_of_node),
            node_of_replica,
        )
        self.master_node = master_node
        self.relay_settings = (
            relay_settings  # a replacement relay gets the run's secret, slots and chunk size
        )
        self.heartbeat_s, self.dead_after_s, self.timeout_s = heartbeat_s, dead_after_s, timeout_s
        self.max_failures_in_a_row = max_failures_in_a_row

    async def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_loop()))
        if self.repack_cfg:
            self._tasks.append(loop.create_task(self._repack_loop()))

    # ---- replicas -------------------------------------------------------------------------------------------
    async def next_work(self, replica: int, version: int) -> list[PromptGroup]:
        """Long-poll: returns groups as soon as the dispatch rule allows, or [] after `poll_s` (the replica asks
        again after re-checking its relay, so a new version is picked up while it waits)."""
        state = self.replicas.setdefault(replica, ReplicaState(replica))
        deadline = time.monotonic() + self.poll_s
        while not self.stopped:
            quota = self.dispatch.quota(
                version, self.trainer_version, self.dispatched_groups, self.consumed_groups
            )
            if quota > 0:
                # Reserve before awaiting: other replicas' requests run while this one waits for the pool.
                self.dispatched_groups += quota
                groups = await self.prompt_pool.next_groups.remote(quota)
                self.dispatched_groups -= quota - len(groups)
                if groups:
                    for g in groups:
                        state.groups[g.group_id] = g
                    self.events.append(
                        {
                            "kind": "dispatch",
                            "t": time.time() - self.t0,
                            "replica": replica,
                            "version": version,
                            "groups": [g.group_id for g in groups],
                        }
                    )
                    return groups
            remaining = deadline - time.monotonic()
            if remaining <= 0 or version < self.trainer_version:
                return []  # a replica behind the trainer pulls before asking again
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return []
        return []

    def heartbeat(self, snapshot: dict[str, Any], t: float) -> None:
        state = self.replicas.setdefault(snapshot["replica"], ReplicaState(snapshot["replica"]))
        state.snapshot, state.last_beat = snapshot, t
        for err in snapshot.get("reward_errors", ()):
            self.events.append(
                {"kind": "reward_error", "t": t - self.t0, "replica": snapshot["replica"], **err}
            )
        skip = ("inflight", "error", "error_line", "error_kind", "reward_errors")
        row = {k: v for k, v in snapshot.items() if k not in skip}
        row["t"] = t - self.t0
        row["busy"] = snapshot["running"] + snapshot["waiting"] > 0
        self.timeline.append(row)

    def record_pull(self, replica: int, version: int, seconds: float, t: float) -> None:
        self.events.append(
            {"kind": "pull", "t": t - self.t0, "replica": replica, "version": version, "seconds": seconds}
        )

    def group_done(self, replica: int, group_id: int) -> None:
        """Complete in the buffer: no replica owes it any more (repack may have spread it over several)."""
        for state in self.replicas.values():
            state.groups.pop(group_id, None)

    # ---- trainer side --------------------------------------------------------------------------------------
    def trainer_update(self, version: int, consumed_groups: int) -> None:
        self.trainer_version = version
        self.consumed_groups += consumed_groups
        self._changed.set()
        self._updated.set()

    async def stop(self) -> dict[str, Any]:
        self.stopped = True
        self._changed.set()
        self._updated.set()
        # A repack round or a recovery under way finishes first: cancelled between a source's export and the
        # destination's import, it would leave the moved trajectories on no replica at all.
        async with self._placing:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        return self.report()

    def report(self) -> dict[str, Any]:
        return {
            "repacks": self.repack_stats.summary(),
            "failures": dict(self.failures),
            "replicas": sorted(self.handles),
            "relays": len(self.relays),
        }

    def fatal_error(self) -> str | None:
        return self.fatal

    def live_replicas(self) -> dict[int, Any]:
        return dict(self.handles)

    def chain(self) -> list[Any]:
        """The relay chain as it stands now, master first (rebuilt after a relay died)."""
        return list(self.relays)

    # ---- repack ------------------------------------------------------------------------------------------
    async def _repack_loop(self) -> None:
        """Every `interval_s`, and right after each trainer update."""
        while not self.stopped:
            try:
                await asyncio.wait_for(self._updated.wait(), self.repack_cfg["interval_s"])
            except TimeoutError:
                pass
            self._updated.clear()
            if self.stopped:
                return
            try:
                await self._repack()
            except Exception as e:  # noqa: BLE001 - a failed round is reported, the loop goes on
                log.warning("repack round failed: %r", e)
                self.events.append({"kind": "repack_error", "t": time.time() - self.t0, "error": repr(e)})

    async def _repack(self) -> None:
        """A round, unless the dispatch rule has no work for a freed replica (`only_with_work`): then the tails
        stay where they run fastest."""
        max_released = None
        if self.repack_cfg.get("only_with_work", True):
            max_released = self.dispatch.replicas_with_work(self.dispatched_groups, self.consumed_groups)
            if max_released == 0:
                return
        async with self._placing:
            await self._repack_round(max_released)

    async def _repack_round(self, max_released: int | None) -> None:
        """One round: moved groups are owed by their destination too (so its death recovers them with their
        row), and moves neither end would take go through recovery."""
        cfg = self.repack_cfg
        snaps = await asyncio.gather(
            *[h.snapshot.remote() for h in self.handles.values()], return_exceptions=True
        )
        done = await repack_once(
            self.handles,
            [s for s in snaps if isinstance(s, dict) and not s.get("error")],
            batch_limit_b=cfg["batch_limit_b"],
            kv_capacity=cfg["kv_capacity"],
            stats=self.repack_stats,
            partial_pool=self.partial_pool,
            max_released=max_released,
        )
        now = time.time() - self.t0
        self.events.extend({**e, "t": now} for e in done.events)
        for dst, group in done.moved:
            self._owe(dst, group)
        if done.orphans:
            # from the tokens the partial pool holds, so its record stays whole; the rest is made again
            homeless = [
                PartialTrajectory(
                    exported.request_id,
                    state.group.group_id,
                    state.sample_idx,
                    state.group.n,
                    list(state.group.prompt_ids),
                    state.version,
                    replica=-1,
                    response_ids=list(exported.output_token_ids[: state.reported]),
                    logprobs=list(exported.logprobs[: state.reported]),
                    meta=dict(state.group.meta),
                )
                for exported, state in done.orphans
            ]
            placed = await self._place(homeless, {s.group.group_id: s.group for _, s in done.orphans})
            self.events.append({"kind": "recovery", "t": now, "orphans": len(homeless), **placed})

    # ---- failures ----------------------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        """Heartbeats by asking: a replica or relay that does not answer within `dead_after_s` is dead, and so is
        a replica whose generation loop raised (it still answers). The same loop error `max_failures_in_a_row`
        times in a row stops replacing: the run ends with that error (`fatal_error`)."""
        while not self.stopped and self.fatal is None:
            await asyncio.sleep(self.heartbeat_s)  # the watch period, not a synchronisation
            try:
                # Relays first: a replacement replica must find its machine's relay in the chain. Every
                # question is asked at once, so a lost machine costs one timeout, not one per actor on it.
                relays = list(self.relays)
                answers = await asyncio.gather(*[self._answers(r.ping.remote()) for r in relays])
                for relay, alive in zip(relays, answers):
                    if not alive:
                        await self._replace_relay(relay)
                rids = list(self.handles)
                snapshots = await asyncio.gather(*[self._snapshot_of(self.handles[rid]) for rid in rids])
                dead = []
                for rid, snapshot in zip(rids, snapshots):
                    if snapshot is None:
                        dead.append(rid)
                    elif snapshot.get("error"):
                        self._replica_error(snapshot)
                        dead.append(rid)
                if self.fatal is not None:
                    return
                await asyncio.gather(*[self._replace_replica(rid) for rid in dead])
            except Exception as e:  # noqa: BLE001 - the watch must outlive any one failed recovery
                log.warning("failure watch: %r", e)
                self.events.append(
                    {
                        "kind": "watch_error",
                        "t": time.time() - self.t0,
                        "error": repr(e),
                        "where": traceback.format_exc(limit=-3),
                    }
                )

    async def _snapshot_of(self, handle: Any) -> dict[str, Any] | None:
        """A replica's snapshot; None if it does not answer in time ({} if it answered with an error)."""
        try:
            return await asyncio.wait_for(handle.snapshot.remote(), self.dead_after_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, TimeoutError):
            return None  # dead, or unreachable (its machine is gone) for as long as we wait
        except ray.exceptions.RayTaskError:
            return {}

    def _replica_error(self, snapshot: dict[str, Any]) -> None:
        """Log a dead loop's traceback; the same error `max_failures_in_a_row` times in a row is fatal."""
        line, rid = snapshot.get("error_line") or "unknown error", snapshot["replica"]
        self.events.append(
            {
                "kind": "replica_error",
                "t": time.time() - self.t0,
                "replica": rid,
                "error": line,
                "error_kind": snapshot.get("error_kind", ""),
                "traceback": snapshot["error"],
            }
        )
        self.error_signatures.append(snapshot.get("error_kind") or line)
        n = self.max_failures_in_a_row
        if repeated_failure(self.error_signatures, n):
            self.fatal = (
                f"rollout replicas failed {n} times in a row with the same error, last replica {rid}: {line} "
                "(tracebacks in metrics.jsonl, kind replica_error)"
            )
            self._changed.set()

    async def _answers(self, ref: Any) -> bool:
        try:
            await asyncio.wait_for(ref, self.dead_after_s)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, TimeoutError):
            return False
        except ray.exceptions.RayTaskError:
            return True  # it answered, with an error of its own: alive

    async def _replace_replica(self, dead: int) -> None:
        """Recover its work on the live replicas first, then start a replacement that pulls from its relay."""
        handle = self.handles.pop(dead)
        ray.kill(handle)  # a hung one too
        self.events.append(
            {"kind": "failure", "t": time.time() - self.t0, "what": "rollout", "replica": dead}
        )
        await self._recover(dead)
        from laminar.runtime.actors import ReplicaActor

        spec, last = self.replica_spec, None
        for _ in range(5):  # a machine going away may still be offered for a few seconds: try again
            new_id = max([*self.handles, dead, *self.node_of_replica]) + 1
            self.node_of_replica[new_id] = ""  # reserved: a replacement made meanwhile takes the next id
            new = ReplicaActor.options(**spec["options"]).remote(new_id, *spec["args"], **spec["kwargs"])
            try:
                node = await asyncio.wait_for(new.node_id.remote(), self.timeout_s)
                self.node_of_replica[new_id] = node
                relay = self.relay_of_node.get(node) or await self._new_relay(node)
                await asyncio.wait_for(new.start.remote(relay), self.timeout_s)
            except (TimeoutError, ray.exceptions.RayError, MachineLost) as e:
                ray.kill(new)
                last = e
                continue
            self.events.append(
                {"kind": "replacement", "t": time.time() - self.t0, "replica": new_id, "for": dead}
            )
            self.handles[new_id] = new
            self.failures["rollouts"] += 1  # counted once handled: recovered and replaced
            return
        raise RuntimeError(f"no replacement for replica {dead} could start: {last!r}")

    async def _recover(self, dead: int) -> None:
        """Every trajectory the dead replica owed: in flight (from the partial pool, which keeps each group's row)
        or dispatched to it and never begun (neither in the pool nor in the buffer). Samples repack moved away are
        in the pool under their destination and stay there."""
        async with self._placing:
            entries = await self.partial_pool.on_replica.remote(dead)
            state = self.replicas.pop(dead, None)
            groups = dict(state.groups) if state is not None else {}
            for e in entries:
                groups.setdefault(e.group_id, e.group())
            placed = await self._place(entries, groups)
            self.events.append(
                {
                    "kind": "recovery",
                    "t": time.time() - self.t0,
                    "replica": dead,
                    "in_flight": len(entries),
                    **placed,
                }
            )

    async def _place(
        self, homeless: list[PartialTrajectory], groups: dict[int, PromptGroup]
    ) -> dict[str, int]:
        """Find a replica for each group with homeless samples (`plan_recovery`), version by version: a group
        whose version no live replica holds restarts whole, and the buffer forgets what it held of it. A target
        that changed version before the import refuses it; the group is planned again (bounded)."""
        done = {"recovered": 0, "restarted": 0, "restarted_groups": 0}
        by_group: dict[int, list[PartialTrajectory]] = {}
        for e in homeless:
            by_group.setdefault(e.group_id, []).append(e)
        pending = set(groups)
        for _ in range(3):
            work = await self._group_work(
                {g: groups[g] for g in pending}, {g: by_group.get(g, []) for g in pending}
            )
            snaps = await asyncio.gather(
                *[h.snapshot.remote() for h in self.handles.values()], return_exceptions=True
            )
            live = {s["replica"]: s["version"] for s in snaps if isinstance(s, dict) and not s.get("error")}
            if not live:
                raise RuntimeError(f"no live replica is left to take the work of groups {sorted(pending)}")
            pending = set()
            for p in plan_recovery(work, live, self.sampling, self.run_seed, time.time()):
                gid, ids = p.group.group_id, [e.request_id for e, _ in p.items]
                if p.restart and not await self.buffer.restart_group.remote(
                    gid, [p.group.traj_id(i) for i in range(p.group.n)], p.version
                ):
                    continue  # it completed meanwhile
                try:
                    refused = await self.handles[p.replica].import_requests.remote(p.items)
                except ray.exceptions.RayError:
                    refused = ids  # it died or its loop stopped: plan again without it
                if refused:
                    pending.add(gid)
                    continue
                fresh = [s.sample_idx for e, s in p.items if not e.output_token_ids]
                if p.restart or fresh:
                    await self.partial_pool.restart.remote(p.group, fresh, p.replica, p.version)
                kept = [e.request_id for e, _ in p.items if e.output_token_ids]
                if kept:
                    await self.partial_pool.move.remote(kept, p.replica)
                done["recovered"] += len(kept)
                done["restarted"] += len(fresh)
                done["restarted_groups"] += p.restart
                self._owe(p.replica, p.group)
            if not pending:
                break
        else:
            self.events.append(
                {"kind": "recovery_failed", "t": time.time() - self.t0, "groups": sorted(pending)}
            )
        self.failures["recovered_trajectories"] += done["recovered"]
        self.failures["restarted_trajectories"] += done["restarted"]
        self.failures["restarted_groups"] += done["restarted_groups"]
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

    def _owe(self, replica: int, group: PromptGroup) -> None:
        self.replicas.setdefault(replica, ReplicaState(replica)).groups[group.group_id] = group

    async def _new_relay(self, node: str, master: bool = False) -> Any:
        """A relay on `node`, linked into the chain: first if it is the master, else last."""
        from laminar.relay.chain import relay_on_node
        from laminar.runtime.launch import import_engine

        self.relays_made += 1
        name = f"relay-{'master' if master else node[:6]}-r{self.relays_made}"  # unique within the chain
        relay = relay_on_node(node, name, self.relay_settings)
        try:  # a machine that is going away (not yet known dead) never starts it: do not wait on it forever
            await asyncio.wait_for(relay.__ray_call__.remote(import_engine), self.dead_after_s * 2)
        except (TimeoutError, ray.exceptions.RayError) as e:
            ray.kill(relay)
            raise MachineLost(f"no relay could start on machine {node}: {e!r}") from e
        if master:
            self.relays.insert(0, relay)
        else:
            self.relay_of_node[node] = relay
            self.relays.append(relay)
        await self._relink()
        return relay

    async def _replace_relay(self, dead: Any) -> None:
        """Relink the chain without it at once, then start a new one on its node if that machine is alive (a
        node relay's replicas re-point to it; a new master is picked up by the trainer after its next step,
        `Runtime.train`). A relay whose machine is gone is not replaced there: that machine's replicas are
        dead too, and their replacements bring up a relay wherever they land."""
        ray.kill(dead)  # a hung one too
        self.failures["relays"] += 1
        was_master = bool(self.relays) and self.relays[0]._actor_id == dead._actor_id
        self.relays = [r for r in self.relays if r._actor_id != dead._actor_id]
        node = self.master_node if was_master else None
        if not was_master:
            node = next((n for n, r in self.relay_of_node.items() if r._actor_id == dead._actor_id), None)
            if node is not None:
                del self.relay_of_node[node]
        alive = node is not None and node in await asyncio.get_running_loop().run_in_executor(
            None, alive_nodes
        )
        event = {
            "kind": "failure",
            "t": time.time() - self.t0,
            "what": "relay",
            "node": node,
            "replaced": False,
        }
        self.events.append(event)
        if self.relays:
            await self._relink()
        if not alive:
            return
        try:
            relay = await self._new_relay(node, master=was_master)
        except MachineLost as e:  # the machine went with its relay; its replicas' replacements go elsewhere
            event["error"] = str(e)
            return
        event["replaced"] = True
        if was_master:  # picked up by the trainer after its next step (a lost machine restarts the trainer)
            return
        await asyncio.gather(
            *[
                self.handles[rid].set_relay.remote(relay)
                for rid, n in self.node_of_replica.items()
                if n == node and rid in self.handles
            ]
        )

    async def _relink(self) -> None:
        from laminar.relay.chain import build_chain

        relays = list(self.relays)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: build_chain(relays, timeout=self.timeout_s)
        )

    async def move_master(self, node: str) -> list[Any]:
        """The trainer came back on another machine: a new master relay there heads the chain (the old one,
        alive or not, is dropped). Returns the new chain."""
        if self.relays:
            old = self.relays.pop(0)
            ray.kill(old)
        self.master_node = node
        await self._new_relay(node, master=True)
        return list(self.relays)

    def drain_records(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        timeline, events = self.timeline, self.events
        self.timeline, self.events = [], []
        return timeline, events
