"""The dispatcher: hands prompt groups to replicas when they ask and the schedule's dispatch rule allows, and
keeps the replicas' timeline (KV use, version) that the plots and the repack gate read.

What a schedule changes here is only *when* a replica may have work: `Dispatch` is that decision
(`laminar.manager.dispatch`, the schedule's rule); the dispatcher itself is schedule-agnostic."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from laminar.data.records import PromptGroup
from laminar.manager.dispatch import Dispatch
from laminar.manager.fleet import Fleet


class Dispatcher:
    def __init__(self, fleet: Fleet, prompt_pool: Any, dispatch: Dispatch, poll_s: float = 0.5) -> None:
        self.fleet, self.prompt_pool, self.dispatch, self.poll_s = fleet, prompt_pool, dispatch, poll_s
        self.trainer_version = 0
        self.dispatched_groups = 0
        self.consumed_groups = 0
        self.refused: set[int] = set()  # replicas refused work while there was room: they must pull first
        self.timeline: list[dict[str, Any]] = []
        self.stopped = False
        # (at least this version, groups left, a replica's share) in order
        self.evals: list[tuple[int, list[PromptGroup], int]] = []
        self.replicas = 1  # how many replicas share an evaluation (set at start)
        self.changed = asyncio.Event()  # wakes replicas waiting for work
        self.updated = asyncio.Event()  # a trainer update: a moment to repack (design section 5)

    async def next_work(self, replica: int, version: int) -> list[PromptGroup]:
        """Long-poll: groups as soon as the dispatch rule allows, or [] after `poll_s` (the replica asks again
        after re-checking its relay, so a new version is picked up while it waits)."""
        deadline = time.monotonic() + self.poll_s
        while not self.stopped:
            self.refused.discard(replica)
            if groups := self._eval_work(replica, version):
                return groups
            quota = self.dispatch.quota(
                version, self.trainer_version, self.dispatched_groups, self.consumed_groups
            )
            if quota <= 0 and self.dispatch.room(self.dispatched_groups, self.consumed_groups) > 0:
                self.refused.add(replica)  # behind the trainer (`Dispatch.max_lag`): the room is its own
            if quota > 0:
                # Reserve before awaiting: other replicas' requests run while this one waits for the pool.
                self.dispatched_groups += quota
                groups = await self.prompt_pool.next_groups.remote(quota)
                self.dispatched_groups -= quota - len(groups)
                if groups:
                    for g in groups:
                        self.fleet.owe(replica, g)
                    self.fleet.event(
                        "dispatch", replica=replica, version=version, groups=[g.group_id for g in groups]
                    )
                    return groups
            remaining = deadline - time.monotonic()
            if remaining <= 0 or version < self.trainer_version:
                return []  # a replica behind the trainer pulls before asking again
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                return []
        return []

    def submit_eval(self, groups: list[PromptGroup], min_version: int) -> None:
        """An evaluation of the weights at `min_version` or newer: handed out before training work, spread over
        the replicas, outside the dispatch rule (it is not training work; the rollouts never stop for it)."""
        share = -(-len(groups) // max(self.replicas, 1))  # of the whole evaluation, so it takes R requests
        self.evals.append((min_version, list(groups), share))
        self.changed.set()

    def _eval_work(self, replica: int, version: int) -> list[PromptGroup]:
        for i, (min_version, groups, share) in enumerate(self.evals):
            if version < min_version:
                continue
            out, self.evals[i] = groups[:share], (min_version, groups[share:], share)
            if not self.evals[i][1]:
                del self.evals[i]
            self.fleet.event("dispatch_eval", replica=replica, version=version, groups=len(out))
            return out
        return []

    def replicas_with_work(self) -> int:
        """How many freed replicas the dispatch rule would give work now (the repack gate), less those already
        idle and refused until they pull."""
        return self.dispatch.replicas_with_work(
            self.dispatched_groups, self.consumed_groups, len(self.refused)
        )

    def heartbeat(self, snapshot: dict[str, Any], t: float) -> None:
        for err in snapshot.get("reward_errors", ()):
            self.fleet.events.append(
                {"kind": "reward_error", "t": t - self.fleet.t0, "replica": snapshot["replica"], **err}
            )
        skip = ("inflight", "error", "error_line", "error_kind", "reward_errors")
        row = {k: v for k, v in snapshot.items() if k not in skip}
        row["t"] = t - self.fleet.t0
        row["busy"] = snapshot["running"] + snapshot["waiting"] > 0
        self.timeline.append(row)

    def record_pull(self, replica: int, version: int, seconds: float, t: float) -> None:
        self.fleet.events.append(
            {
                "kind": "pull",
                "t": t - self.fleet.t0,
                "replica": replica,
                "version": version,
                "seconds": seconds,
            }
        )

    def trainer_update(self, version: int, consumed_groups: int) -> None:
        self.trainer_version = version
        self.consumed_groups += consumed_groups
        self.wake()

    def wake(self) -> None:
        self.changed.set()
        self.updated.set()

    def stop(self) -> None:
        self.stopped = True
        self.wake()
