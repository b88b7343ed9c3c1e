"""The dispatcher: hands prompt groups to replicas when they ask and the schedule's dispatch rule allows, and
keeps the replicas' timeline (KV use, version) that the plots and the repack gate read.

What a schedule changes here is only *when* a replica may have work: `Dispatch` is that decision
(`laminar.schedules.dispatch`, the schedule's rule); the dispatcher itself is schedule-agnostic.

Its counters, the evaluations waiting and each replica's last answer are journaled with the fleet (`apply`), so
a restarted manager keeps the dispatch bound, and a replica asking again after the manager's loss (the same
request) gets the same groups."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from laminar.data.records import PromptGroup, ReplicaSnapshot
from laminar.manager.fleet import Fleet
from laminar.schedules.dispatch import Dispatch


class Dispatcher:
    def __init__(self, fleet: Fleet, prompt_pool: Any, dispatch: Dispatch, poll_s: float = 0.5) -> None:
        self.fleet, self.prompt_pool, self.dispatch, self.poll_s = fleet, prompt_pool, dispatch, poll_s
        self.trainer_version = 0
        self.first_version = 0  # the version this segment's counts start from (a resumed run's checkpoint)
        self.dispatched_groups = 0
        self.consumed_groups = 0
        self.refused: set[int] = set()  # replicas refused work while there was room: they must pull first
        self.timeline: list[dict[str, Any]] = []
        self.stopped = False
        # (at least this version, groups left, a replica's share) in order
        self.evals: list[tuple[int, list[PromptGroup], int]] = []
        self.replicas = 1  # how many replicas share an evaluation (set at start)
        # replica -> its last request and the answer (a request made again is answered the same)
        self.answers: dict[int, tuple[int | None, list[PromptGroup]]] = {}
        self.eval_low = 0  # the lowest evaluation group id submitted (they go down from -1)
        self.synced = asyncio.Event()  # cleared while a restarted manager adopts what the pool handed out
        self.synced.set()
        self.changed = asyncio.Event()  # wakes replicas waiting for work
        self.updated = asyncio.Event()  # a trainer update: a moment to repack (design section 5)

    # ---- what lasts ---------------------------------------------------------------------------------------
    def change(self, op: str, **fields: Any) -> Any:
        record = {"op": op, **fields}
        out = self.apply(record)
        self.fleet.journal({"part": "dispatch", **record})
        return out

    def apply(self, r: dict[str, Any]) -> Any:
        """One change, as the live manager makes it and as its restarted self replays it."""
        op = r["op"]
        if op == "dispatch":
            groups = [PromptGroup(**g) for g in r["groups"]]
            self.answers[r["replica"]] = (r["request"], groups)
            if r["eval"]:
                handed = {g.group_id for g in groups}
                evals = [(v, [g for g in gs if g.group_id not in handed], n) for v, gs, n in self.evals]
                self.evals = [e for e in evals if e[1]]
            else:
                self.dispatched_groups += len(groups)
                for g in groups:
                    owe = {
                        "op": "owe",
                        "replica": r["replica"],
                        "group": asdict(g),
                        "version": r.get("version"),
                    }
                    self.fleet.apply(owe)
            return groups
        if op == "trainer":  # totals, so a call made twice counts once
            self.trainer_version = max(self.trainer_version, r["version"])
            self.consumed_groups = max(self.consumed_groups, r["consumed"])
        elif op == "resume":  # the checkpoint's version, and its complete groups the buffer holds: dispatched
            self.first_version = self.trainer_version = r["version"]
            self.dispatched_groups += r["held"]
        elif op == "eval":
            groups = [PromptGroup(**g) for g in r["groups"]]
            self.evals.append((r["min_version"], groups, r["share"]))
            self.eval_low = min(self.eval_low, *(g.group_id for g in groups))
        elif op == "start":
            self.replicas = r["replicas"]
        elif op == "stop":
            self.stopped = True
        else:
            raise ValueError(f"manager journal: unknown dispatch record {op!r}")
        return None

    def state(self) -> dict[str, Any]:
        return {
            "trainer_version": self.trainer_version,
            "first_version": self.first_version,
            "dispatched": self.dispatched_groups,
            "consumed": self.consumed_groups,
            "replicas": self.replicas,
            "stopped": self.stopped,
            "eval_low": self.eval_low,
            "evals": [[v, [asdict(g) for g in gs], n] for v, gs, n in self.evals],
            "answers": [[rid, q, [asdict(g) for g in gs]] for rid, (q, gs) in self.answers.items()],
        }

    def load(self, s: dict[str, Any]) -> None:
        self.trainer_version, self.dispatched_groups = s["trainer_version"], s["dispatched"]
        self.first_version = s["first_version"]
        self.consumed_groups, self.replicas, self.stopped = s["consumed"], s["replicas"], s["stopped"]
        self.eval_low = s["eval_low"]
        self.evals = [(v, [PromptGroup(**g) for g in gs], n) for v, gs, n in s["evals"]]
        self.answers = {rid: (q, [PromptGroup(**g) for g in gs]) for rid, q, gs in s["answers"]}

    # ---- the replicas ------------------------------------------------------------------------------------
    async def next_work(self, replica: int, version: int, request: int | None = None) -> list[PromptGroup]:
        """Long-poll: groups as soon as the dispatch rule allows, or [] after `poll_s` (the replica asks again
        after re-checking its relay, so a new version is picked up while it waits). `request`: the replica's
        number for this call; asked again (its call retried after the manager's loss), the same answer."""
        await self.synced.wait()
        answered = self.answers.get(replica)
        if request is not None and answered is not None and answered[0] == request:
            return answered[1]
        deadline = time.monotonic() + self.poll_s
        while not self.stopped:
            self.refused.discard(replica)
            if groups := self._eval_work(replica, version):
                self.fleet.event("dispatch_eval", replica=replica, version=version, groups=len(groups))
                return self.change(
                    "dispatch",
                    replica=replica,
                    request=request,
                    eval=True,
                    groups=[asdict(g) for g in groups],
                )
            quota = self.dispatch.quota(
                version,
                self.trainer_version,
                self.dispatched_groups,
                self.consumed_groups,
                self.fleet.oldest_owed(),
                self.first_version,
            )
            if quota <= 0 and self.dispatch.room(self.dispatched_groups, self.consumed_groups) > 0:
                # behind the trainer (`Dispatch.max_lag`), or held by the staleness bound: the room is its own
                self.refused.add(replica)
            if quota > 0:
                # Reserve before awaiting: other replicas' requests run while this one waits for the pool,
                # which answers this request once (asked again after our loss, the same groups).
                self.dispatched_groups += quota
                try:
                    groups = await self.prompt_pool.next_groups.remote(quota, replica, request)
                finally:
                    self.dispatched_groups -= quota
                if groups:
                    groups = self.change(
                        "dispatch",
                        replica=replica,
                        request=request,
                        eval=False,
                        groups=[asdict(g) for g in groups],
                        version=version,
                    )
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

    async def adopt(self) -> None:
        """A restarted manager first takes over what the prompt pool handed out for a replica's request after
        the journal's last record of that replica (lost between the pool's answer and ours): those groups are
        the replica's, whether or not our answer reached it. Replicas asking meanwhile wait."""
        try:
            for replica, (request, groups) in (await self.prompt_pool.answered.remote()).items():
                mine = self.answers.get(replica)
                if mine is not None and mine[0] is not None and mine[0] >= request:
                    continue
                self.change(
                    "dispatch",
                    replica=replica,
                    request=request,
                    eval=False,
                    groups=[asdict(g) for g in groups],
                )
                self.fleet.event(
                    "dispatch", replica=replica, groups=[g.group_id for g in groups], adopted=True
                )
        finally:
            self.synced.set()

    def submit_eval(self, groups: list[PromptGroup], min_version: int) -> None:
        """An evaluation of the weights at `min_version` or newer: handed out before training work, spread over
        the replicas, outside the dispatch rule (it is not training work; the rollouts never stop for it).
        Evaluation ids go down from -1: groups not below every id seen before were submitted already."""
        if not groups or max(g.group_id for g in groups) >= self.eval_low:
            return
        share = -(-len(groups) // max(self.replicas, 1))  # of the whole evaluation, so it takes R requests
        self.change("eval", min_version=min_version, groups=[asdict(g) for g in groups], share=share)
        self.changed.set()

    def _eval_work(self, replica: int, version: int) -> list[PromptGroup]:
        """The next share of an evaluation this replica's version may take (handed out by `next_work`)."""
        for min_version, groups, share in self.evals:
            if version >= min_version:
                return groups[:share]
        return []

    def replicas_with_work(self) -> int:
        """How many freed replicas the dispatch rule would give work now (the repack gate), less those already
        idle and refused until they pull."""
        return self.dispatch.replicas_with_work(
            self.dispatched_groups,
            self.consumed_groups,
            len(self.refused),
            self.trainer_version,
            self.fleet.oldest_owed(),
        )

    def heartbeat(self, snapshot: ReplicaSnapshot, t: float) -> None:
        rid = snapshot.replica
        for err in snapshot.reward_errors:
            key = f"reward_error/{rid}/{t}/{err.get('traj_id')}"  # a heartbeat sent twice logs it once
            self.fleet.event("reward_error", key=key, t=t, replica=rid, **err)
        self.timeline.append({**snapshot.row(), "t": t - self.fleet.t0})

    def record_pull(self, replica: int, version: int, seconds: float, t: float) -> None:
        key = f"pull/{replica}/{version}"
        self.fleet.event("pull", key=key, t=t, replica=replica, version=version, seconds=seconds)

    def resume(self, version: int, held_groups: int) -> None:
        """A resumed run: the trainer at the checkpoint's `version`, whose buffer holds `held_groups` complete
        groups; they count as dispatched in this segment, so a schedule's batch bound (and the outstanding bound)
        counts them instead of generating their batch again."""
        self.change("resume", version=version, held=held_groups)
        self.wake()

    def trainer_update(self, version: int, consumed_groups: int) -> None:
        """The trainer's version and how many groups it has consumed in all (totals: a call made twice, or two
        calls in another order, leave the same)."""
        self.change("trainer", version=version, consumed=consumed_groups)
        self.wake()

    def wake(self) -> None:
        self.changed.set()
        self.updated.set()

    def stop(self) -> None:
        if not self.stopped:
            self.change("stop")
        self.wake()
