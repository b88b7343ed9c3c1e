"""The control plane's data actors: the prompt pool, the partial response pool (here) and the experience buffer
(`journaled_buffer.py`), each a Ray actor around its plain component (`laminar.data`) that survives its own loss.

Each changes its component, writes the change to its journal (`laminar.journal`, in the run folder), and
only then answers. Ray restarts a lost one (`max_restarts=-1`) with the same constructor arguments, and the
constructor replays the journal, so the new process stands where the lost one stood while the run goes on. Ray
also sends every call again that the lost process had not answered (`max_task_retries=-1`), so every call that
changes something is safe to apply twice: by a request id (`next_groups`, `take`), by the tokens' offset
(`progress`), or by its nature (`done`, `finish_many`, `move`, `trained`, an `add` of an id seen before)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import ray

from laminar.data.partial_pool import PartialPool, PartialTrajectory
from laminar.data.prompt_pool import PromptPool
from laminar.data.records import PromptGroup
from laminar.journal import Journal

# Ray brings a lost control actor back, and sends the calls it had not answered again.
RESTARTS = {"max_restarts": -1, "max_task_retries": -1}


@dataclass(frozen=True)
class MadeHere:
    """A constructor argument a control actor makes in its own process, and its restarted self again: `fn(*args)`.
    Ray keeps an actor's constructor arguments for its restarts, and one over 100 KB (a dataset) in the object
    store, where only the process that created the actor holds it."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()

    def __call__(self) -> Any:
        return self.fn(*self.args)


def rows_digest(rows: list[dict[str, Any]]) -> str:
    """A fingerprint of a run's training rows (their JSON, in order)."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def process_id(_actor: Any) -> int:
    """A control actor's process, asked through `__ray_call__` to tell a restart. It lives in this light module,
    which the control actors load anyway: Ray imports the module of a function it sends, and one from the driver's
    modules would load torch into every control actor."""
    return os.getpid()


class JournaledPromptPool:
    """The prompt pool. `next_groups` answers each request of an asker once: the same request again (the
    manager's call retried, or made again by its own restarted self) gets the same groups."""

    def __init__(
        self,
        rows: list[dict[str, Any]] | MadeHere,
        encode: Callable[[Any], list[int]],
        n: int,
        seed: int,
        journal_dir: str,
        digest: str | None = None,
    ) -> None:
        """`rows`, or what reads them here (`MadeHere`: the run passes its data that way); `digest`
        (`rows_digest`): the rows the run started with, so that a restart over changed data stops."""
        if isinstance(rows, MadeHere):
            rows = rows()
        if digest is not None and rows_digest(rows) != digest:
            raise RuntimeError(
                "the prompt pool's training rows are not those the run started with (a data file changed while "
                "the run was going): restore them, or start a new run"
            )
        self.pool = PromptPool(rows, encode, n, seed=seed)
        self.answers: dict[int, tuple[int, list[PromptGroup]]] = {}  # asker -> (its last request, the groups)
        self.journal = Journal(journal_dir, "prompt_pool", self._state)
        state, records = self.journal.replay()
        if state is not None:
            self.pool.load_state_dict(state["pool"])
            self.answers = {a: (q, [PromptGroup(**g) for g in gs]) for a, q, gs in state["answers"]}
        for record in records:
            self._apply(record)

    def _state(self) -> dict[str, Any]:
        answers = [[a, q, [asdict(g) for g in gs]] for a, (q, gs) in self.answers.items()]
        return {"pool": self.pool.state_dict(), "answers": answers}

    def _apply(self, r: dict[str, Any]) -> Any:
        if r["op"] == "next":
            groups = self.pool.next_groups(r["count"])
            if r["asker"] is not None and r["request"] is not None:
                self.answers[r["asker"]] = (r["request"], groups)
            return groups
        if r["op"] == "done":
            return self.pool.done(r["group"])
        if r["op"] == "reissue":
            return self.pool.reissue_outstanding()
        raise ValueError(f"prompt pool journal: unknown record {r['op']!r}")

    def _change(self, op: str, **fields: Any) -> Any:
        record = {"op": op, **fields}
        out = self._apply(record)
        self.journal.append(record)
        return out

    def next_groups(
        self, count: int, asker: int | None = None, request: int | None = None
    ) -> list[PromptGroup]:
        answered = self.answers.get(asker) if asker is not None else None
        if answered is not None and request is not None and answered[0] == request:
            return answered[1]
        return self._change("next", count=count, asker=asker, request=request)

    def answered(self) -> dict[int, tuple[int, list[PromptGroup]]]:
        """Each asker's last request and the groups it got (a restarted manager adopts those it never recorded)."""
        return dict(self.answers)

    def done(self, group_id: int) -> None:
        if group_id in self.pool.outstanding:
            self._change("done", group=group_id)

    def reissue_outstanding(self) -> int:
        return self._change("reissue")

    def queued_group_ids(self) -> list[int]:
        return self.pool.queued_group_ids()

    def stats(self) -> dict[str, int]:
        return self.pool.stats()

    def state_dict(self) -> dict[str, Any]:
        return self.pool.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume: the checkpoint's pool, and a journal that starts from it."""
        self.pool.load_state_dict(state)
        self.answers.clear()
        self.journal.compact()

    def pid(self) -> int:
        return os.getpid()


class JournaledPartialPool:
    """The in-flight frontier. Progress carries each trajectory's offset, so a retried call adds its tokens once."""

    def __init__(self, journal_dir: str) -> None:
        self.pool = PartialPool()
        self.journal = Journal(journal_dir, "partial_pool", self.pool.snapshot)
        state, records = self.journal.replay()
        if state is not None:
            self.pool.restore(state)
        for record in records:
            self._apply(record)

    def _apply(self, r: dict[str, Any]) -> None:
        op, pool = r["op"], self.pool
        if op == "start":
            pool.start(PromptGroup(**r["group"]), r["replica"], r["version"])
        elif op == "progress":
            pool.progress(r["updates"], r["at"])
        elif op == "finish":
            pool.finish_many(r["ids"])
        elif op == "move":
            pool.move(r["ids"], r["replica"])
        elif op == "restart":
            pool.restart(PromptGroup(**r["group"]), r["samples"], r["replica"], r["version"])
        else:
            raise ValueError(f"partial pool journal: unknown record {op!r}")

    def _change(self, op: str, **fields: Any) -> None:
        record = {"op": op, **fields}
        self._apply(record)
        self.journal.append(record)

    def start(self, group: PromptGroup, replica: int, version: int) -> None:
        self._change("start", group=asdict(group), replica=replica, version=version)

    def progress(self, updates: dict[str, tuple], at: dict[str, int] | None = None) -> None:
        known = {tid: list(u) for tid, u in updates.items() if tid in self.pool}
        if known:
            self._change("progress", updates=known, at=at)

    def finish_many(self, traj_ids: list[str]) -> None:
        known = [tid for tid in traj_ids if tid in self.pool]
        if known:
            self._change("finish", ids=known)

    def move(self, traj_ids: list[str], replica: int) -> None:
        moving = [tid for tid in traj_ids if tid in self.pool and self.pool.entries[tid].replica != replica]
        if moving:
            self._change("move", ids=moving, replica=replica)

    def restart(self, group: PromptGroup, sample_idxs: list[int], replica: int, version: int) -> None:
        self._change(
            "restart", group=asdict(group), samples=list(sample_idxs), replica=replica, version=version
        )

    def get(self, traj_id: str) -> PartialTrajectory:
        return self.pool.get(traj_id)

    def on_replica(self, replica: int) -> list[PartialTrajectory]:
        return self.pool.on_replica(replica)

    def of_groups(self, group_ids: list[int]) -> list[PartialTrajectory]:
        return self.pool.of_groups(group_ids)

    def entries(self) -> list[PartialTrajectory]:
        """Everything in flight (a restarted manager looks for work that is on no replica)."""
        return [self.pool.get(tid) for tid in list(self.pool.entries)]

    def stats(self) -> dict[str, int]:
        return self.pool.stats()

    def snapshot(self) -> dict[str, Any]:
        return self.pool.snapshot()

    def pid(self) -> int:
        return os.getpid()


PromptPoolActor = ray.remote(num_cpus=0, **RESTARTS)(JournaledPromptPool)
PartialPoolActor = ray.remote(num_cpus=0, **RESTARTS)(JournaledPartialPool)
