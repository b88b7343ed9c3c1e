"""The supervisor: starts the fleet (replicas, one relay per machine that hosts them, the chain), watches it,
and keeps it whole. A replica or relay that does not answer within `dead_after_s` is dead, and so is a replica
whose generation loop raised; relays are checked before replicas (a replacement replica must find its machine's
relay in the chain), every question is asked at once (a lost machine costs one timeout, not one per actor on
it), and dead replicas are replaced in parallel after their work is recovered onto live ones.

Replicas and relays are made by the run's factory (`laminar.runtime.factory.Factory`), the same way at start
and on replacement, and named by it, so a restarted manager finds them again (`resume`); recovery decisions are
the pure `plan_recovery`. Its other jobs are mixed in: recovery (`recovering.py`) and the relay chain's repair
(`relay_repair.py`)."""

from __future__ import annotations

import asyncio
import logging
import traceback
from dataclasses import dataclass
from typing import Any

import ray

from laminar.data.records import ReplicaSnapshot
from laminar.manager.fleet import Fleet
from laminar.manager.recovering import NoLiveReplica, Recovering
from laminar.manager.relay_repair import MachineLost, RelayRepair

log = logging.getLogger(__name__)
UNREACHABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, TimeoutError)


def repeated_failure(signatures: list[str], in_a_row: int) -> bool:
    """True when the last `in_a_row` replica errors are the same error (`describe_error`'s signature)."""
    return len(signatures) >= in_a_row and len(set(signatures[-in_a_row:])) == 1


@dataclass(frozen=True)
class Watch:
    heartbeat_s: float = 1.0  # the watch period
    dead_after_s: float = 15.0  # no answer for this long: dead
    timeout_s: float = 120.0  # longest a placement, a relay's start or a relink may take
    max_failures_in_a_row: int = 3  # the same replica error this often stops the run
    start_timeout_s: float = 600.0  # longest a replica's start may take (model, engine warm-up, CUDA graphs)


class Supervisor(Recovering, RelayRepair):
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
            elif snapshot.error:
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
            read = [s for s in snaps if s is not None and s.live]
            answered = {s.replica for s in read}
            held = {tid: s.replica for s in read for tid in [*s.inflight, *s.finishing]}
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

    async def _snapshot_of(self, handle: Any) -> ReplicaSnapshot | None:
        """A replica's snapshot; None if it does not answer in time (one with its id unknown, -1, and no error
        if it answered with an error of the call's own: alive)."""
        try:
            return await asyncio.wait_for(handle.snapshot.remote(), self.watch.dead_after_s)
        except UNREACHABLE:
            return None  # dead, or unreachable (its machine is gone) for as long as we wait
        except ray.exceptions.RayTaskError:
            return ReplicaSnapshot(-1)

    async def _answers(self, ref: Any) -> bool:
        try:
            await asyncio.wait_for(ref, self.watch.dead_after_s)
            return True
        except UNREACHABLE:
            return False
        except ray.exceptions.RayTaskError:
            return True  # it answered, with an error of its own: alive

    def replica_error(self, snapshot: ReplicaSnapshot) -> None:
        """Log a dead loop's traceback; the same error `max_failures_in_a_row` times in a row is fatal."""
        line, rid = snapshot.error_line or "unknown error", snapshot.replica
        kind = snapshot.error_kind
        for err in snapshot.reward_errors:  # scored before the loop died, never sent with a heartbeat
            self.fleet.event(
                "reward_error", key=f"reward_error/{rid}/dead/{err.get('traj_id')}", replica=rid, **err
            )
        self.fleet.event("replica_error", replica=rid, error=line, error_kind=kind, traceback=snapshot.error)
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
        if self.factory is not None:  # a hung one too, and every rank of a tensor-parallel one
            self.factory.end_replica(dead, handle)
        elif handle is not None:  # an in-process manager's replica (no factory made it)
            ray.kill(handle)
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
                self.factory.end_replica(new_id, new)
                last = e
                continue
            except asyncio.CancelledError:  # the run stopped meanwhile: the half-started replacement goes too
                self.factory.end_replica(new_id, new)
                raise
            fleet.event("replacement", replica=new_id, **{"for": dead})
            fleet.add_replica(new_id, new, node, replacing=dead)
            fleet.count("rollouts")  # counted once handled: recovered and replaced
            return
        raise RuntimeError(f"no replacement for replica {dead} could start: {last!r}")

    # ---- relays ------------------------------------------------------------------------------------------


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
