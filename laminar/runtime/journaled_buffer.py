"""The experience buffer's control actor: `ExperienceBuffer` journaled as the pools are (`control.py` says how a
lost one comes back), with the driver's takes kept by request id and the groups lent to a step held until
it is trained."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from functools import partial
from typing import Any

import ray

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.records import Trajectory
from laminar.journal import Journal
from laminar.runtime.control import RESTARTS


def _exactly(wanted: set[int], ready: list, count: int, version: int) -> list[int]:
    return [i for i, g in enumerate(ready) if g[0].group_id in wanted]


def _in_order(group_ids: list[int], ready: list, count: int, version: int) -> list[int]:
    at = {g[0].group_id: i for i, g in enumerate(ready)}
    return [at[g] for g in group_ids if g in at]


def _trajs(records: list[dict[str, Any]]) -> list[Trajectory]:
    return [Trajectory(**t) for t in records]


class JournaledBuffer:
    """The experience buffer; `take` blocks (with a timeout) until enough complete groups are ready. A take
    carries the driver's request id: asked again, it hands out the same groups."""

    def __init__(
        self,
        group_size: int,
        capacity: int,
        max_staleness: int | None,
        prompt_pool: Any,
        manager: Any,
        sampler: str,
        journal_dir: str,
    ) -> None:
        self.buffer = ExperienceBuffer(
            group_size, capacity=capacity, max_staleness=max_staleness, sampler=sampler
        )
        self.prompt_pool, self.manager = prompt_pool, manager
        self.cond = threading.Condition()
        # Groups handed to the driver and not yet trained: a driver interrupted between `take` and the end of
        # its step (Ctrl-C) must not lose them, so they stay here until `trained` and go back on `return_lent`.
        self.lent: dict[int, list[Trajectory]] = {}
        self.requests: dict[int, list[int]] = {}  # the driver's take -> the groups it was given, in order
        self.lending = True
        # evaluation groups' samples, by group and id (never trained)
        self.evaluated: dict[int, dict[str, Trajectory]] = {}
        self.journal = Journal(journal_dir, "buffer", self._state)
        state, records = self.journal.replay()
        if state is not None:
            self._load(state)
        for record in records:
            self._apply(record)
        if state is not None or records:  # a restart: complete groups are told again (it may have died first)
            self._tell_complete(self.buffer.ready + list(self.lent.values()))

    # ---- the journal -------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer.state_dict(),
            "lent": [[asdict(t) for t in g] for g in self.lent.values()],
            "requests": [[q, gids] for q, gids in self.requests.items()],
            "lending": self.lending,
            "evaluated": [[asdict(t) for t in g.values()] for g in self.evaluated.values()],
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.lent = {g[0]["group_id"]: _trajs(g) for g in state["lent"]}
        self.requests = {q: gids for q, gids in state["requests"]}
        self.lending = state["lending"]
        self.evaluated = {}
        for g in state["evaluated"]:
            self._add_eval(_trajs(g))

    def _apply(self, r: dict[str, Any]) -> Any:
        op = r["op"]
        if op == "add":
            return [self.buffer.add(t) for t in _trajs(r["trajs"])]
        if op == "take":
            groups = self._sample(partial(_in_order, r["groups"]), len(r["groups"]), r["version"])
            self._lend(r["request"], groups or [])
        elif op == "trained":
            self._trained(r["groups"])
        elif op == "return_lent":
            return self._return_lent()
        elif op == "restart_group":
            return self.buffer.restart_group(r["group"], r["ids"], r["version"])
        elif op == "eval":
            self._add_eval(_trajs(r["trajs"]))
        elif op == "eval_keep":
            self.evaluated = {g: s for g, s in self.evaluated.items() if g in set(r["groups"])}
        else:
            raise ValueError(f"buffer journal: unknown record {op!r}")
        return None

    def _change(self, op: str, **fields: Any) -> Any:
        record = {"op": op, **fields}
        out = self._apply(record)
        self.journal.append(record)
        return out

    # ---- evaluation ----------------------------------------------------------------------------------------
    def _add_eval(self, trajs: list[Trajectory]) -> None:
        for t in trajs:
            self.evaluated.setdefault(t.group_id, {})[t.traj_id] = t

    def add_eval_many(self, trajs: list[Trajectory]) -> None:
        """Samples of evaluation groups: kept aside for the driver's evaluator, never in the buffer."""
        with self.cond:
            self._change("eval", trajs=[asdict(t) for t in trajs])

    def take_eval(
        self, group_ids: list[int], have: dict[int, int] | None = None
    ) -> dict[int, list[Trajectory]]:
        """The evaluation samples of `group_ids` past the `have` the evaluator holds of each, in arrival order
        (asked twice, the same answer); samples of groups no longer asked for are forgotten."""
        with self.cond:
            wanted = set(group_ids)
            if any(g not in wanted for g in self.evaluated):
                self._change("eval_keep", groups=sorted(wanted))
            have = have or {}
            out = {
                g: list(self.evaluated[g].values())[have.get(g, 0) :]
                for g in group_ids
                if g in self.evaluated
            }
            return {g: s for g, s in out.items() if s}

    # ---- training samples --------------------------------------------------------------------------------
    def add_many(self, trajs: list[Trajectory]) -> list[bool]:
        """Several trajectories in one call (a replica sends all it has scored at once); per trajectory, False
        if it was ignored (`ExperienceBuffer.add`: an id seen before is ignored, so a retried call adds nothing)."""
        with self.cond:
            added = self._change("add", trajs=[asdict(t) for t in trajs])
            complete = {
                t.group_id: t for t, a in zip(trajs, added) if a and t.group_id not in self.buffer.pending
            }
            self.cond.notify_all()
        self._tell_complete([[t] for t in complete.values()])
        return added

    def _tell_complete(self, groups: list[list[Trajectory]]) -> None:
        """A whole group: nobody needs to re-issue it any more."""
        for g in groups:
            self.prompt_pool.done.remote(g[0].group_id)
            self.manager.group_done.remote(g[0].replica, g[0].group_id)

    def take(
        self,
        count: int,
        version: int,
        timeout_s: float,
        group_ids: list[int] | None = None,
        request: int | None = None,
    ) -> list[list[Trajectory]]:
        """`count` complete groups: the buffer's sampler (`buffer.sampler`), or exactly `group_ids` (in dispatch
        order). A `request` already answered gets the same groups again."""
        deadline = time.monotonic() + timeout_s
        sampler = self.buffer.sampler
        if group_ids is not None:
            sampler = partial(_exactly, set(group_ids))
        with self.cond:
            if request is not None and request in self.requests:
                return [self.lent[g] for g in self.requests[request] if g in self.lent]
            while (groups := self._sample(sampler, count, version)) is None:
                if not self.lending:
                    return []
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"experience buffer: {count} complete groups did not arrive within {timeout_s:.0f}s "
                        f"(ready {self.buffer.num_ready()}, pending {len(self.buffer.pending)}); are the rollouts "
                        "alive? see their errors in metrics.jsonl"
                    )
                self.cond.wait(left)
            if not self.lending:  # stopped while we waited: they stay in the buffer
                self.buffer.ready[:0] = groups
                return []
            self._lend(request, groups)
            self.journal.append(
                {
                    "op": "take",
                    "request": request,
                    "version": version,
                    "groups": [g[0].group_id for g in groups],
                }
            )
            return groups

    def _lend(self, request: int | None, groups: list[list[Trajectory]]) -> None:
        for g in groups:
            self.lent[g[0].group_id] = g
        if request is not None:
            self.requests[request] = [g[0].group_id for g in groups]

    def trained(self, group_ids: list[int]) -> None:
        """The driver trained on these: they are no longer the buffer's to give back."""
        with self.cond:
            if any(g in self.lent for g in group_ids):
                self._change("trained", groups=list(group_ids))

    def _trained(self, group_ids: list[int]) -> None:
        for gid in group_ids:
            self.lent.pop(gid, None)
        self.requests = {q: gids for q, gids in self.requests.items() if any(g in self.lent for g in gids)}

    def return_lent(self) -> int:
        """Stop lending and put every group handed out but not trained back at the front, in order."""
        with self.cond:
            back = self._change("return_lent")
            self.cond.notify_all()
            return back

    def _return_lent(self) -> int:
        self.lending = False
        back = list(self.lent.values())
        self.buffer.ready[:0] = back
        self.lent.clear()
        self.requests.clear()
        return len(back)

    def _sample(self, sampler, count: int, version: int) -> list[list[Trajectory]] | None:
        ready = sampler(self.buffer.ready, count, version)
        if len(ready) < count:
            return None
        default, self.buffer.sampler = self.buffer.sampler, sampler
        try:
            return self.buffer.sample(count, version)
        finally:
            self.buffer.sampler = default

    def group_state(self, group_id: int, traj_ids: list[str]) -> tuple[list[str], set[int]]:
        """Which of a group's ids the buffer has (or had), and the versions it holds them at (recovery)."""
        with self.cond:
            return self.buffer.group_state(group_id, traj_ids)

    def seen(self, traj_ids: list[str]) -> list[str]:
        """Which of these ids the buffer has (or had): they are not anybody's work any more."""
        with self.cond:
            return [t for t in traj_ids if t in self.buffer.seen]

    def restart_group(self, group_id: int, traj_ids: list[str], version: int) -> bool:
        with self.cond:
            return self._change("restart_group", group=group_id, ids=list(traj_ids), version=version)

    def num_ready(self) -> int:
        return self.buffer.num_ready()

    def stats(self) -> dict[str, Any]:
        with self.cond:
            return self.buffer.stats()

    def held_ids(self) -> tuple[set[str], dict[str, str]]:
        """The ids held now, and those dropped with the reason (the audit's end record)."""
        with self.cond:
            return self.buffer.held_ids(), dict(self.buffer.dropped)

    def state_dict(self) -> dict[str, Any]:
        with self.cond:
            return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume: the restored buffer, with no group held to a version of the stopped run (`resumed`), and
        a journal that starts from it."""
        with self.cond:
            self.buffer.load_state_dict(state)
            self.buffer.resumed()
            self.journal.compact()

    def pid(self) -> int:
        return os.getpid()


BufferActor = ray.remote(num_cpus=0, max_concurrency=16, **RESTARTS)(JournaledBuffer)
