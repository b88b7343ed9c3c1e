"""The rollout manager: hands prompt groups to replicas when they ask, keeps their states, and records the
timeline (KV use, version) that the plots and the repack planner read.

What a schedule changes is only *when* a replica may have work: `Dispatch` is that decision, one small class per
schedule in `laminar.schedules`. The manager itself is schedule-agnostic.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from laminar.data.records import PromptGroup


@dataclass
class Dispatch:
    """Laminar's rule: a replica that asks gets work at once, with whatever version it holds, as long as fewer
    than `max_outstanding_groups` are dispatched and not yet trained on (flow control, so a fast rollout tier
    cannot run arbitrarily far ahead of the trainer). Schedules subclass it to say when else work may start."""

    groups_per_batch: int
    max_outstanding_groups: int

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        return max(0, min(self.groups_per_batch, self.max_outstanding_groups - (dispatched - consumed)))


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

    # ---- replicas -------------------------------------------------------------------------------------------
    async def next_work(self, replica: int, version: int) -> list[PromptGroup]:
        """Long-poll: returns groups as soon as the dispatch rule allows, or [] after `poll_s` (the replica asks
        again after re-checking its relay, so a new version is picked up while it waits)."""
        state = self.replicas.setdefault(replica, ReplicaState(replica))
        deadline = time.monotonic() + self.poll_s
        while not self.stopped:
            quota = self.dispatch.quota(version, self.trainer_version, self.dispatched_groups,
                                        self.consumed_groups)
            if quota > 0:
                groups = await self.prompt_pool.next_groups.remote(quota)
                if groups:
                    self.dispatched_groups += len(groups)
                    for g in groups:
                        state.groups[g.group_id] = g
                    self.events.append({"kind": "dispatch", "t": time.time() - self.t0, "replica": replica,
                                        "version": version, "groups": [g.group_id for g in groups]})
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
        row = {k: v for k, v in snapshot.items() if k not in ("inflight", "error")}
        row["t"] = t - self.t0
        row["busy"] = snapshot["running"] + snapshot["waiting"] > 0
        self.timeline.append(row)

    def record_pull(self, replica: int, version: int, seconds: float, t: float) -> None:
        self.events.append({"kind": "pull", "t": t - self.t0, "replica": replica, "version": version,
                            "seconds": seconds})

    def group_done(self, replica: int, group_id: int) -> None:
        state = self.replicas.get(replica)
        if state is not None:
            state.groups.pop(group_id, None)

    # ---- trainer side --------------------------------------------------------------------------------------
    def trainer_update(self, version: int, consumed_groups: int) -> None:
        self.trainer_version = version
        self.consumed_groups += consumed_groups
        self._changed.set()

    def stop(self) -> None:
        self.stopped = True
        self._changed.set()

    def drain_records(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        timeline, events = self.timeline, self.events
        self.timeline, self.events = [], []
        return timeline, events
