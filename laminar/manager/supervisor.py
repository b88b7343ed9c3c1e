"""The supervisor: starts the fleet (replicas, one relay per machine that hosts them, the chain), watches it,
and keeps it whole. A replica or relay that does not answer within `dead_after_s` is dead, and so is a replica
whose generation loop raised; relays are checked before replicas (a replacement replica must find its machine's
relay in the chain), every question is asked at once (a lost machine costs one timeout, not one per actor on
it), and dead replicas are replaced in parallel after their work is recovered onto live ones.

Replicas and relays are made by the run's factory (`laminar.runtime.factory.Factory`), the same way at start
and on replacement, and named by it, so a restarted manager finds them again (`resume`); recovery decisions are
the pure `plan_recovery`."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass
from typing import Any

import ray

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.manager.fleet import Fleet
from laminar.manager.recovery import GroupWork, Placement, plan_recovery
from laminar.relay.chain import build_chain

log = logging.getLogger(__name__)
UNREACHABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, TimeoutError)
RELINK_TRIES = 3  # a relink that timed out is tried again this many times in all, a watch period apart


class MachineLost(RuntimeError):
    """A relay could not start on a machine: it is gone, or going."""


class NoLiveReplica(RuntimeError):
    """Work to place and no live replica to take it."""


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def repeated_failure(signatures: list[str], in_a_row: int) -> bool:
    """True when the last `in_a_row` replica errors are the same error (`describe_error`'s signature)."""
    return len(signatures) >= in_a_row and len(set(signatures[-in_a_row:])) == 1


def engine_items(p: Placement, sampling: dict[str, Any], run_seed: int, now: float) -> list[tuple[Any, Any]]:
    """A placement as the engine imports it: each sample with its own sampling stream (seeded by its id, so it
    continues exactly), its tokens so far with their loss mask, its tool state (parked on its call if it waited
    for one), and the replica-side record of it."""
    from laminar.engine import ExportedRequest, SamplingParams
    from laminar.rollout.inflight import InFlight, sample_seed
    from laminar.tools.turns import TurnState

    g, v, items = p.group, p.version, []
    for idx, e in p.samples:
        tid = g.traj_id(idx)
        tokens, logprobs = (list(e.response_ids), list(e.logprobs)) if e is not None else ([], [])
        mask = list(e.loss_mask) if e is not None and len(e.loss_mask) == len(tokens) else []
        tool = TurnState.of(e.tool) if e is not None and e.tool is not None else None
        params = SamplingParams(seed=sample_seed(run_seed, tid), **{**sampling, **g.meta.get("sampling", {})})
        exported = ExportedRequest(
            tid,
            list(g.prompt_ids),
            tokens,
            logprobs,
            [v] * len(tokens),
            params,
            v,
            output_mask=mask,
            parked=tool is not None and tool.parked,
        )
        state = InFlight(g, idx, v, now, list(tokens), list(logprobs), reported=len(tokens), tool=tool)
        items.append((exported, state))
    return items


def lost_calls(items: list[tuple[Any, Any]]) -> int:
    """Tool calls these recovered samples waited for whose result was lost: their new replica runs them again."""
    return sum(s.tool is not None and s.tool.parked and s.tool.result is None for _, s in items)


@dataclass(frozen=True)
class Watch:
    heartbeat_s: float = 1.0  # the watch period
    dead_after_s: float = 15.0  # no answer for this long: dead
    timeout_s: float = 120.0  # longest a placement, a relay's start or a relink may take
    max_failures_in_a_row: int = 3  # the same replica error this often stops the run
    start_timeout_s: float = 600.0  # longest a replica's start may take (model, engine warm-up, CUDA graphs)


class Supervisor:
    def __init__(
        self,
        fleet: Fleet,
        partial_pool: Any,
        sampling: dict[str, Any],
        run_seed: int,
        watch: Watch,
        on_fatal: Any = None,
    ) -> None:
        self.fleet, self.partial_pool, self.sampling, self.run_seed = fleet, partial_pool, sampling, run_seed
        self.watch = watch
        self.on_fatal = on_fatal or (lambda: None)  # wakes replicas waiting for work
        self.factory: Any = None  # the run's, bound to this manager
        self.buffer: Any = None
        self.relays_made = 0
        self.error_signatures: list[str] = []  # every replica error, in the order seen
        self.fatal: str | None = None  # why the run must stop; the driver asks

    # ---- what lasts ---------------------------------------------------------------------------------------
    def change(self, op: str, **fields: Any) -> None:
        record = {"op": op, **fields}
        self.apply(record)
        self.fleet.journal({"part": "supervisor", **record})

    def apply(self, r: dict[str, Any]) -> None:
        if r["op"] == "error":
            self.error_signatures.append(r["signature"])
        elif r["op"] == "fatal":
            self.fatal = r["why"]
        elif r["op"] == "relay_made":
            self.relays_made = r["n"]
        else:
            raise ValueError(f"manager journal: unknown supervisor record {r['op']!r}")

    def state(self) -> dict[str, Any]:
        return {"errors": self.error_signatures, "fatal": self.fatal, "relays_made": self.relays_made}

    def load(self, s: dict[str, Any]) -> None:
        self.error_signatures, self.fatal, self.relays_made = list(s["errors"]), s["fatal"], s["relays_made"]

    # ---- start -------------------------------------------------------------------------------------------
    async def start(self, master: Any, master_node: str, replicas: int) -> None:
        """Start `replicas` replicas, a relay on every machine they landed on, and the chain (master first)."""
        fleet, t, factory = self.fleet, self.watch.timeout_s, self.factory
        fleet.master_node = master_node
        fleet.relay_names[master._actor_id] = (await _within("master relay", [master.ping.remote()], t, ""))[
            0
        ]["name"]
        handles = {rid: factory.replica(rid) for rid in range(replicas)}
        nodes = await _within(
            "rollout replicas placed",
            [h.node_id.remote() for h in handles.values()],
            t,
            "Ray found no room for them: the cluster lacks the CPUs or GPUs that rollout.num_cpus and "
            "rollout.num_gpus ask of each replica",
        )
        fleet.relays = [master]
        for node in dict.fromkeys(nodes):  # one relay per machine that hosts rollouts, in first-seen order
            name = f"relay-{len(fleet.relay_of_node)}"
            fleet.relay_of_node[node] = relay = factory.relay(node, name)
            fleet.relay_names[relay._actor_id] = name
            fleet.relays.append(relay)
        fleet.chain_changed()
        # every relay answers before the chain is linked through them
        await _within("relays ready", [factory.ready(r) for r in fleet.relays], t, "")
        await self.relink()
        await _within(
            "rollout replicas started",
            [h.start.remote(fleet.relay_of_node[n]) for h, n in zip(handles.values(), nodes)],
            self.watch.start_timeout_s,
            "each replica loads the model, warms up its engine and captures its CUDA graphs (compiling its "
            "kernels the first time on a machine); where that is slow, a larger rollout.start_timeout_s lets "
            "it finish",
            setting="rollout.start_timeout_s",
        )
        for (rid, handle), node in zip(handles.items(), nodes):
            fleet.add_replica(rid, handle, node)

    # ---- watching ----------------------------------------------------------------------------------------
    async def watch_loop(self) -> None:
        """Until the run stops or a failure repeats (`fatal`)."""
        while self.fatal is None:
            await asyncio.sleep(self.watch.heartbeat_s)  # the watch period, not a synchronisation
            try:
                await self.check_once()
            except Exception as e:  # noqa: BLE001 - the watch must outlive any one failed recovery
                log.warning("failure watch: %r", e)
                self.fleet.event("watch_error", error=repr(e), where=traceback.format_exc(limit=-3))

    async def check_once(self, replace: bool = True) -> None:
        """Ask every relay, then every replica; the dead are logged, counted and replaced (with `replace`, else
        only logged and counted, and a dead replica's work recovered)."""
        fleet = self.fleet
        relays = list(fleet.relays)
        answers = await asyncio.gather(*[self._answers(r.ping.remote()) for r in relays])
        for relay, alive in zip(relays, answers):
            if not alive:
                await self._replace_relay(relay, replace)
        rids = list(fleet.handles)
        snapshots = await asyncio.gather(*[self._snapshot_of(fleet.handles[rid]) for rid in rids])
        dead = []
        for rid, snapshot in zip(rids, snapshots):
            if snapshot is None:
                dead.append(rid)
            elif snapshot.get("error"):
                self.replica_error(snapshot)
                dead.append(rid)
        if self.fatal is None or not replace:
            await asyncio.gather(*[self._replace_replica(rid, replace) for rid in dead])

    async def settle(self) -> None:
        """The run's last look, once no more work is handed out: every relay and replica is asked once more, so
        a failure not noticed yet (a machine lost in the last steps: its actors answer nothing for `dead_after_s`)
        is logged and counted, and a dead replica's work is recovered onto a live replica, in flight there when
        the run ends, not lost. Nothing is replaced or relinked: the run is ending. Work that no live replica can
        take stays where it is (a `recovery_failed` record), and the run's audit counts it lost."""
        await self.check_once(replace=False)

    # ---- the manager's restarted self ---------------------------------------------------------------------
    def fleet_names(self) -> list[str]:
        """The names of the replicas and relays the journal lists (a restarted manager looks them up)."""
        return [self.factory.replica_name(rid) for rid in self.fleet.handles] + list(self.fleet.chain_names)

    def reattach(self, found: dict[str, Any]) -> tuple[list[int], list[tuple[str | None, bool]]]:
        """The replicas and relays the journal lists, by the handles `found` for their names (None: gone).
        Returns the replicas gone and the relays gone (each its machine, and whether it was the master), which
        `resume` deals with."""
        fleet = self.fleet
        for rid in list(fleet.handles):
            fleet.handles[rid] = found.get(self.factory.replica_name(rid))
        gone = [rid for rid, h in fleet.handles.items() if h is None]
        relays = {name: found.get(name) for name in fleet.chain_names}
        lost = []
        for i, name in enumerate(fleet.chain_names):
            node = next((n for n, m in fleet.node_names.items() if m == name), None)
            if relays[name] is None:
                lost.append((fleet.master_node if i == 0 and node is None else node, i == 0 and node is None))
        fleet.relays = [r for r in relays.values() if r is not None]
        fleet.relay_of_node = {n: relays[m] for n, m in fleet.node_names.items() if relays.get(m) is not None}
        fleet.relay_names = {r._actor_id: name for name, r in relays.items() if r is not None}
        return gone, lost

    async def resume(self, gone: list[int], lost_relays: list[tuple[str | None, bool]]) -> None:
        """After the manager's loss: what died meanwhile, and what a step cut short left, is dealt with as the
        watch would have. Actors of the run that the fleet does not name (a replacement half made) go; the chain
        is linked again; relays and replicas gone are replaced (their work recovered); a dead replica whose
        recovery or replacement was cut short gets them; and trajectories the partial pool places on no replica
        that holds them (a repack move cut short between export and import) are placed again."""
        fleet = self.fleet
        for rid in gone:  # died while the manager was away: out of the fleet, counted, replaced below
            fleet.drop_replica(rid, replace=True)
            fleet.event("failure", what="rollout", replica=rid)
        keep = {self.factory.replica_name(rid) for rid in fleet.handles} | set(fleet.relay_names.values())
        await asyncio.get_running_loop().run_in_executor(None, self.factory.sweep, keep)
        if lost_relays:
            fleet.chain_changed()
        if fleet.relays:
            await self._step(self.relink())
        for node, was_master in lost_relays:
            await self._step(self._relay_lost(node, was_master))
        for dead in sorted(fleet.replacing):
            await self._step(self.replace(dead))
        in_pool = {e.replica for e in await self.partial_pool.entries.remote()}
        for dead in sorted((set(fleet.owed) | in_pool) - set(fleet.handles)):
            await self._step(self.recover(dead))
        await self._step(self.adopt_orphans())

    async def _step(self, step: Any) -> None:
        """One step of `resume`: one that fails is logged as the watch logs its own, and the others go on."""
        try:
            await step
        except Exception as e:  # noqa: BLE001 - the manager must come back whatever one step met
            log.warning("resuming the manager: %r", e)
            self.fleet.event("watch_error", error=repr(e), where=traceback.format_exc(limit=-3))

    async def adopt_orphans(self) -> None:
        """Place the trajectories no live replica holds or has finished, though the partial pool puts them on a
        live one; one held by another replica than the pool says is recorded there."""
        fleet = self.fleet
        async with fleet.placing:
            entries = await self.partial_pool.entries.remote()
            rids = list(fleet.handles)
            snaps = await asyncio.gather(*[self._snapshot_of(fleet.handles[rid]) for rid in rids])
            answered = {rid for rid, s in zip(rids, snaps) if s and not s.get("error")}
            held = {
                tid: s["replica"]
                for s in snaps
                if s and not s.get("error")
                for tid in [*s["inflight"], *s.get("finishing", ())]
            }
            ours = [e for e in entries if e.replica in answered]
            for e in ours:
                if e.traj_id in held and held[e.traj_id] != e.replica:
                    await self.partial_pool.move.remote([e.traj_id], held[e.traj_id])
            homeless = [e for e in ours if e.traj_id not in held]
            if homeless:
                stored = set(await self.buffer.seen.remote([e.traj_id for e in homeless]))
                homeless = [e for e in homeless if e.traj_id not in stored]
            if not homeless:
                return
            placed = await self.place(homeless, {e.group_id: e.group() for e in homeless})
            fleet.event("recovery", orphans=len(homeless), **placed)

    async def _snapshot_of(self, handle: Any) -> dict[str, Any] | None:
        """A replica's snapshot; None if it does not answer in time ({} if it answered with an error)."""
        try:
            return await asyncio.wait_for(handle.snapshot.remote(), self.watch.dead_after_s)
        except UNREACHABLE:
            return None  # dead, or unreachable (its machine is gone) for as long as we wait
        except ray.exceptions.RayTaskError:
            return {}

    async def _answers(self, ref: Any) -> bool:
        try:
            await asyncio.wait_for(ref, self.watch.dead_after_s)
            return True
        except UNREACHABLE:
            return False
        except ray.exceptions.RayTaskError:
            return True  # it answered, with an error of its own: alive

    def replica_error(self, snapshot: dict[str, Any]) -> None:
        """Log a dead loop's traceback; the same error `max_failures_in_a_row` times in a row is fatal."""
        line, rid = snapshot.get("error_line") or "unknown error", snapshot["replica"]
        kind = snapshot.get("error_kind", "")
        for err in snapshot.get(
            "reward_errors", ()
        ):  # scored before the loop died, never sent with a heartbeat
            self.fleet.event(
                "reward_error", key=f"reward_error/{rid}/dead/{err.get('traj_id')}", replica=rid, **err
            )
        self.fleet.event(
            "replica_error", replica=rid, error=line, error_kind=kind, traceback=snapshot["error"]
        )
        self.change("error", signature=kind or line)
        n = self.watch.max_failures_in_a_row
        if repeated_failure(self.error_signatures, n):
            why = (
                f"rollout replicas failed {n} times in a row with the same error, last replica {rid}: {line} "
                "(tracebacks in metrics.jsonl, kind replica_error)"
            )
            self.change("fatal", why=why)
            self.on_fatal()

    # ---- replicas ----------------------------------------------------------------------------------------
    async def _replace_replica(self, dead: int, replace: bool = True) -> None:
        """Recover its work on the live replicas first, then start a replacement that pulls from its relay
        (without `replace`: the run is ending, only the recovery)."""
        fleet = self.fleet
        handle = fleet.drop_replica(dead, replace)
        if handle is not None:
            ray.kill(handle)  # a hung one too
        fleet.event("failure", what="rollout", replica=dead)
        if not replace:
            fleet.count("rollouts")
            try:
                await self.recover(dead)
            except RuntimeError as e:  # no live replica is left to take it
                fleet.event("recovery_failed", replica=dead, error=str(e))
            return
        await self.replace(dead)

    async def replace(self, dead: int) -> None:
        """Recover a dead replica's work on the live replicas, then start its replacement; with no live replica
        left (every one lost at once), the replacement starts first and takes the work."""
        try:
            await self.recover(dead)
        except NoLiveReplica:
            await self._start_replacement(dead)
            await self.recover(dead)
            return
        await self._start_replacement(dead)

    async def _start_replacement(self, dead: int) -> None:
        fleet = self.fleet
        last = None
        for _ in range(5):  # a machine going away may still be offered for a few seconds: try again
            new_id = max([*fleet.handles, dead, *fleet.node_of_replica]) + 1
            # reserved: a replacement made meanwhile, or by a restarted manager, takes the next id
            fleet.reserve(new_id)
            new = self.factory.replica(new_id)
            try:
                node = await asyncio.wait_for(new.node_id.remote(), self.watch.timeout_s)
                fleet.node_of_replica[new_id] = node
                relay = fleet.relay_of_node.get(node) or await self._new_relay(node)
                await asyncio.wait_for(new.start.remote(relay), self.watch.start_timeout_s)
            except (TimeoutError, ray.exceptions.RayError, MachineLost) as e:
                ray.kill(new)
                last = e
                continue
            except asyncio.CancelledError:  # the run stopped meanwhile: the half-started replacement goes too
                ray.kill(new)
                raise
            fleet.event("replacement", replica=new_id, **{"for": dead})
            fleet.add_replica(new_id, new, node, replacing=dead)
            fleet.count("rollouts")  # counted once handled: recovered and replaced
            return
        raise RuntimeError(f"no replacement for replica {dead} could start: {last!r}")

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
            live = {s["replica"]: s["version"] for s in snaps if s and not s.get("error")}
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

    # ---- relays ------------------------------------------------------------------------------------------
    async def _new_relay(self, node: str, master: bool = False) -> Any:
        """A relay started on `node` and placed in the chain, first if it is the master, else last; the caller
        relinks."""
        fleet = self.fleet
        self.change("relay_made", n=self.relays_made + 1)
        name = f"relay-{'master' if master else node[:6]}-r{self.relays_made}"  # unique within the run
        relay = self.factory.relay(node, name)
        fleet.relay_names[relay._actor_id] = name
        try:  # a machine that is going away (not yet known dead) never starts it: do not wait on it forever
            await asyncio.wait_for(self.factory.ready(relay), self.watch.dead_after_s * 2)
        except (TimeoutError, ray.exceptions.RayError) as e:
            ray.kill(relay)
            raise MachineLost(f"no relay could start on machine {node}: {e!r}") from e
        if master:
            fleet.relays.insert(0, relay)
        else:
            fleet.relay_of_node[node] = relay
            fleet.relays.append(relay)
        fleet.chain_changed()
        return relay

    async def _replace_relay(self, dead: Any, replace: bool = True) -> None:
        """Relink the chain without it at once, then start a new one on its node if that machine is alive (a
        node relay's replicas re-point to it; a new master is picked up by the trainer after its next step,
        `Runtime.train`). A relay whose machine is gone is not replaced there: that machine's replicas are
        dead too, and their replacements bring up a relay wherever they land. Without `replace` (the run is
        ending) it is only dropped from the chain, logged and counted."""
        fleet = self.fleet
        ray.kill(dead)  # a hung one too
        was_master = bool(fleet.relays) and fleet.relays[0]._actor_id == dead._actor_id
        fleet.relays = [r for r in fleet.relays if r._actor_id != dead._actor_id]
        node = fleet.master_node if was_master else None
        if not was_master:
            node = next((n for n, r in fleet.relay_of_node.items() if r._actor_id == dead._actor_id), None)
            if node is not None:
                del fleet.relay_of_node[node]
        fleet.chain_changed()
        await self._relay_lost(node, was_master, replace)

    async def _relay_lost(self, node: str | None, was_master: bool, replace: bool = True) -> None:
        """A relay gone from the chain (already relinked out of `fleet`): counted, and, where its machine is
        alive, replaced. Its `failure` record is written once the outcome is known (`replaced`, and the `error`
        that kept it from being replaced), so the log never says `replaced: false` of a relay that was; its time
        is when the loss was found."""
        fleet = self.fleet
        fleet.count("relays")
        found, outcome = time.time(), {"replaced": False}
        try:
            if replace:
                await self._replace_lost_relay(node, was_master, outcome)
        except Exception as e:
            outcome["error"] = repr(e)
            raise
        finally:  # timed when it was found, not when the replacement was done
            fleet.event("failure", t=found, what="relay", node=node, **outcome)

    async def _replace_lost_relay(self, node: str | None, was_master: bool, outcome: dict[str, Any]) -> None:
        fleet = self.fleet
        alive = node is not None and node in await asyncio.get_running_loop().run_in_executor(
            None, alive_nodes
        )
        if fleet.relays:  # the rest of the chain keeps flowing while the replacement starts
            try:
                await self._relink_retried()
            except ray.exceptions.ActorDiedError:  # another relay died too: the watch replaces it next
                pass
        if not alive:
            return
        try:
            relay = await self._new_relay(node, master=was_master)
        except MachineLost as e:  # the machine went with its relay; its replicas' replacements go elsewhere
            outcome["error"] = str(e)
            return
        outcome["replaced"] = True
        if not was_master:  # a master is picked up by the trainer after its next step
            await asyncio.gather(
                *[
                    fleet.handles[rid].set_relay.remote(relay)
                    for rid, n in fleet.node_of_replica.items()
                    if n == node and fleet.handles.get(rid) is not None
                ]
            )
        try:
            await self._relink_retried()
        except ray.exceptions.ActorDiedError as e:  # another relay died meanwhile: the watch replaces it next
            outcome["relink_error"] = repr(e)

    async def _relink_retried(self) -> None:
        """`relink`, tried `RELINK_TRIES` times a watch period apart: a relink that timed out under load is not
        the chain's loss. A relay that died meanwhile still fails it: the watch finds that one and replaces it."""
        for attempt in range(1, RELINK_TRIES + 1):
            try:
                await self.relink()
                return
            except ray.exceptions.ActorDiedError:
                raise
            except (TimeoutError, ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as e:
                if attempt == RELINK_TRIES:
                    raise
                log.warning("relinking the relay chain (try %d of %d): %r", attempt, RELINK_TRIES, e)
                await asyncio.sleep(self.watch.heartbeat_s)

    async def relink(self) -> None:
        relays, timeout = list(self.fleet.relays), self.watch.timeout_s
        await asyncio.get_running_loop().run_in_executor(None, lambda: build_chain(relays, timeout=timeout))

    async def move_master(self, node: str) -> list[Any]:
        """The trainer came back on another machine: a new master relay there heads the chain (the old one,
        alive or not, is dropped). Returns the new chain."""
        fleet = self.fleet
        head = fleet.relays[0] if fleet.relays else None
        node_relays = {r._actor_id for r in fleet.relay_of_node.values()}
        if (
            fleet.master_node == node
            and head is not None
            and head._actor_id not in node_relays
            and await self._answers(head.ping.remote())
        ):  # asked again (the driver's call retried after the manager's loss): it is there already
            return list(fleet.relays)
        if head is not None and head._actor_id not in node_relays:
            ray.kill(fleet.relays.pop(0))
        fleet.master_node = node
        fleet.chain_changed()
        await self._new_relay(node, master=True)
        await self._relink_retried()
        return list(fleet.relays)


async def _within(
    what: str, waits: list, timeout_s: float, hint: str, setting: str = "run.timeout_s"
) -> list:
    """Every one of `waits` (Ray object refs or coroutines), or a TimeoutError that says how many of them were
    still missing after `timeout_s` (the config field `setting`) and what the wait covers."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    if pending:
        for task in pending:
            task.cancel()
        raise TimeoutError(
            f"{what}: {len(pending)} of {len(tasks)} not done after {setting} = {timeout_s:g} s"
            + (f"; {hint}" if hint else "")
        )
    return [task.result() for task in tasks]
