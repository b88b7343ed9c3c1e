"""The rollout manager: one async Ray actor on the driver's machine that hosts the control plane's three parts
on one event loop, over the state they share (`Fleet`):

- the dispatcher (`laminar.manager.dispatcher`): work to replicas when the schedule's dispatch rule allows;
- the supervisor (`laminar.manager.supervisor`): starts the fleet, watches it, replaces and recovers;
- the repack loop (`laminar.manager.repacker`): moves long tails onto few replicas, when the schedule repacks.

Every method is short and never blocks the event loop. This module only wires the parts and answers the
replicas, the buffer and the driver.

The manager survives its own loss. Each part writes what it changes to the manager's journal (`journal_dir`), and
Ray restarts a lost manager with its constructor's arguments: the constructor replays the journal, finds the
replicas and relays again by name (the factory names them, and they outlive the manager's process), and the
supervisor finishes what the loss cut short (`Supervisor.resume`). Ray sends again every call the lost process
had not answered; each is safe to apply twice (a replica's request number, the driver's totals and event count).
Trajectories in flight on the replicas go on meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from laminar.data.records import PromptGroup, ReplicaSnapshot
from laminar.journal import Journal
from laminar.manager.dispatcher import Dispatcher
from laminar.manager.fleet import Fleet
from laminar.manager.repacker import RepackLoop, RepackStats
from laminar.manager.spec import ManagerSpec
from laminar.manager.supervisor import Supervisor
from laminar.schedules.schedule import Schedule


class RolloutFailure(RuntimeError):
    """Replicas keep failing the same way: replacing them again would only fail again."""


class RolloutManager:
    def __init__(
        self,
        spec: ManagerSpec,
        schedule: Schedule,
        prompt_pool: Any,
        partial_pool: Any,
        t0: float,
        factory: Any = None,
        journal_dir: str | Path | None = None,
    ) -> None:
        """`factory` makes (and finds) the run's replicas and relays; `journal_dir`: where the journal goes (None:
        none, an in-process manager)."""
        self.fleet = Fleet(t0)
        self.dispatcher = Dispatcher(self.fleet, prompt_pool, schedule.dispatch)
        self.supervisor = Supervisor(
            self.fleet, partial_pool, spec.sampling, spec.run_seed, spec.watch, on_fatal=self.dispatcher.wake
        )
        self.repack: RepackLoop | None = None
        if schedule.repack:
            self.repack = RepackLoop(
                self.fleet,
                spec.repack,
                self.dispatcher,
                partial_pool,
                self.supervisor.place,
                spec.watch.dead_after_s,
            )
        self._tasks: list[asyncio.Task] = []
        self.factory = factory
        self._resuming: asyncio.Task | None = None
        self.parts = {"fleet": self.fleet, "dispatch": self.dispatcher, "supervisor": self.supervisor}
        if self.repack is not None:
            self.parts["repack"] = self.repack
        if journal_dir is None:
            return
        journal = Journal(journal_dir, "manager", self._state)
        state, records = journal.replay()
        if state is not None:
            self._load(state)
        for record in records:
            self.parts[record["part"]].apply(record)
        self.fleet.journal = journal.append
        if state is not None or records:  # restarted by Ray: the fleet is found again, then resumed
            self.dispatcher.synced.clear()
            self._resuming = asyncio.get_event_loop().create_task(self._resume())

    def _state(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet.state(),
            "dispatch": self.dispatcher.state(),
            "supervisor": self.supervisor.state(),
            "repack": asdict(self.repack.stats) if self.repack is not None else None,
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.fleet.load(state["fleet"])
        self.dispatcher.load(state["dispatch"])
        self.supervisor.load(state["supervisor"])
        if self.repack is not None and state["repack"] is not None:
            self.repack.apply({"stats": state["repack"]})

    async def _bind(self) -> None:
        """The factory makes replicas that talk to this manager, the partial pool and the buffer (found by name,
        off the event loop)."""
        me = ray.get_runtime_context().current_actor
        loop = asyncio.get_running_loop()
        factory = await loop.run_in_executor(None, self.factory.for_manager, me)
        self.supervisor.factory, self.supervisor.buffer = factory, factory.buffer

    async def _resume(self) -> None:
        """The restarted manager: the groups the pool handed out that it missed, its replicas and relays found by
        name, then what else it missed dealt with."""
        await self.dispatcher.adopt()
        await self._bind()
        names = self.supervisor.fleet_names()
        find = self.supervisor.factory.find
        found = await asyncio.get_running_loop().run_in_executor(None, lambda: {n: find(n) for n in names})
        gone, lost_relays = self.supervisor.reattach(found)
        if not self.dispatcher.stopped:
            try:
                await self.supervisor.resume(gone, lost_relays)
            finally:
                self._loops()

    async def resumed(self) -> None:
        """Returns once a restarted manager has resumed (at once otherwise)."""
        if self._resuming is not None:
            await asyncio.gather(self._resuming, return_exceptions=True)

    async def start(self, master: Any, master_node: str, replicas: int) -> list[Any]:
        """Start the fleet and the background loops; returns the relay chain, master first."""
        await self._bind()
        self.dispatcher.change("start", replicas=replicas)
        await self.supervisor.start(master, master_node, replicas)
        self._loops()
        return list(self.fleet.relays)

    def _loops(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.supervisor.watch_loop()))
        if self.repack is not None:
            self._tasks.append(loop.create_task(self.repack.run()))

    # ---- replicas and the buffer -------------------------------------------------------------------------
    async def next_work(self, replica: int, version: int, request: int | None = None) -> list[PromptGroup]:
        if self.supervisor.fatal is not None:
            return []
        return await self.dispatcher.next_work(replica, version, request)

    def heartbeat(self, snapshot: ReplicaSnapshot, t: float) -> None:
        self.dispatcher.heartbeat(snapshot, t)

    def record_pull(self, replica: int, version: int, seconds: float, t: float) -> None:
        self.dispatcher.record_pull(replica, version, seconds, t)

    def group_done(self, replica: int, group_id: int) -> None:
        self.fleet.settle(group_id)
        self.dispatcher.changed.set()  # it may have been the oldest group out: the staleness bound may allow more

    # ---- the driver --------------------------------------------------------------------------------------
    def trainer_update(self, version: int, consumed_groups: int) -> None:
        self.dispatcher.trainer_update(version, consumed_groups)

    def resume(self, version: int, held_groups: int) -> None:
        self.dispatcher.resume(version, held_groups)

    def submit_eval(self, groups: list[PromptGroup], min_version: int) -> None:
        self.dispatcher.submit_eval(groups, min_version)

    async def move_master(self, node: str) -> list[Any]:
        await self.resumed()
        return await self.supervisor.move_master(node)

    async def stop(self, settle: bool = False) -> dict[str, Any]:
        """No more work for anyone; the background loops end. `settle` (the run ended normally): then the
        supervisor's last look at every replica and relay (`Supervisor.settle`)."""
        self.dispatcher.stop()
        await self.resumed()  # a restarted manager finishes resuming first (bounded by its timeouts)
        # A repack round or a recovery under way finishes first: cancelled between a source's export and the
        # destination's import, it would leave the moved trajectories on no replica at all.
        async with self.fleet.placing:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if settle:
            await self.supervisor.settle()
        return self.report()

    def report(self) -> dict[str, Any]:
        return {
            "repacks": (self.repack.stats if self.repack else RepackStats()).summary(),
            "failures": dict(self.fleet.failures),
            "replicas": sorted(self.live_replicas()),
            "relays": len(self.fleet.relays),
        }

    def fatal_error(self) -> str | None:
        return self.supervisor.fatal

    def live_replicas(self) -> dict[int, Any]:
        return {rid: h for rid, h in self.fleet.handles.items() if h is not None}

    def chain(self) -> list[Any]:
        """The relay chain as it stands now, master first (relinked after a relay died)."""
        return list(self.fleet.relays)

    def head_and_chain(self) -> tuple[Any, list[Any]]:
        """The master relay heading the chain (None while a dead one is being replaced: the chain is then headed
        by a node relay, which the trainer must not publish into) and the chain, in one call (the driver asks
        after every step)."""
        node_relays = {r._actor_id for r in self.fleet.relay_of_node.values()}
        head = self.fleet.relays[0] if self.fleet.relays else None
        return (None if head is None or head._actor_id in node_relays else head), self.chain()

    def placement(self) -> dict[str, Any]:
        """Which machine each relay of the chain (master first) and each replica is on."""
        node_of_relay = {r._actor_id: n for n, r in self.fleet.relay_of_node.items()}
        return {
            "relays": [node_of_relay.get(r._actor_id, self.fleet.master_node) for r in self.fleet.relays],
            "replicas": {rid: self.fleet.node_of_replica.get(rid, "") for rid in self.live_replicas()},
        }

    def drain_records(self, acked: int) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
        """The replicas' timeline since the last call, and the events from number `acked` on (the driver passes
        how many it has logged, so events whose answer was lost with the manager come again): (timeline, the
        first event's number, events)."""
        timeline, self.dispatcher.timeline = self.dispatcher.timeline, []
        first, events = self.fleet.take_events(acked)
        return timeline, first, events
