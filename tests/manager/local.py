"""In-process stand-ins for the actors the manager talks to: the real pools and buffer behind a `.remote` that
returns an awaitable, and a replica without an engine that keeps the real replica's import rule."""

from __future__ import annotations

from typing import Any

import ray

from laminar.config import Config, RepackConfig
from laminar.data.records import PromptGroup, ReplicaSnapshot
from laminar.engine import ExportedRequest, SamplingParams
from laminar.manager.manager import RolloutManager
from laminar.manager.spec import ManagerSpec
from laminar.rollout.inflight import InFlight, sample_seed
from laminar.schedules.dispatch import Dispatch
from laminar.schedules.schedule import Schedule


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args, **kwargs)

        return call()


class Local:
    """`Local(obj).method.remote(*args)` awaits `obj.method(*args)`: a plain object where an actor is expected."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.obj, name))


def item(
    group: PromptGroup, idx: int, version: int, tokens: list[int] = (), reported: int | None = None
) -> tuple[ExportedRequest, InFlight]:
    """A running trajectory as a replica exports it; `reported` of its tokens are in the partial pool (all)."""
    tokens = list(tokens)
    reported = len(tokens) if reported is None else reported
    params = SamplingParams(seed=sample_seed(0, group.traj_id(idx)), max_new_tokens=32)
    exported = ExportedRequest(
        group.traj_id(idx),
        list(group.prompt_ids),
        tokens,
        [-0.5] * len(tokens),
        [version] * len(tokens),
        params,
        version,
    )
    return exported, InFlight(group, idx, version, 0.0, tokens, [-0.5] * len(tokens), reported=reported)


class Replica:
    """A replica's running trajectories at one version, without an engine. Like a real replica it takes a
    trajectory only at its own version, and once drained it loads newer weights (`pulls_to`) before its next
    command; `finishes` end before its next command (a tail that completes between a snapshot and a move).
    `kill()` makes every later call fail as a dead actor's does; `stays` are never exported (parked on a call
    still running when an export's wait ends)."""

    def __init__(
        self,
        rid: int,
        version: int,
        items: list[tuple[ExportedRequest, InFlight]] = (),
        *,
        blocks: int = 2,
        waiting: int = 0,
        pulls_to: int | None = None,
        finishes: tuple[str, ...] = (),
        dies_before: str = "",
        stays: tuple[str, ...] = (),
    ) -> None:
        self.id, self.version, self.blocks, self.waiting = rid, version, blocks, waiting
        self.running = {e.request_id: (e, s) for e, s in items}
        self.pulls_to, self.finishes = pulls_to, set(finishes)
        self.imported: list[list[str]] = []  # ids of every import call it accepted, in order
        self.dead, self.dies_before = False, dies_before
        self.stays = set(stays)  # parked on a call that outlasts an export's wait: never exported

    def kill(self) -> None:
        self.dead = True

    def _tick(self, command: str) -> None:
        self.dead = self.dead or command == self.dies_before
        if self.dead:
            raise ray.exceptions.RayActorError()
        for rid in self.finishes & set(self.running):
            del self.running[rid]
        if not self.running and self.pulls_to is not None:
            self.version, self.pulls_to = self.pulls_to, None

    def snapshot(self) -> ReplicaSnapshot:
        if self.dead:
            raise ray.exceptions.RayActorError()
        return ReplicaSnapshot(
            replica=self.id,
            version=self.version,
            waiting=self.waiting,
            running=len(self.running),
            kv_blocks_used=self.blocks * len(self.running),
            kv_blocks_total=100,
            peak_kv_blocks=50,
            requests=[(rid, self.blocks) for rid in sorted(self.running)],
            inflight=sorted(self.running),
        )

    def export_requests(
        self, rids: list[str], with_kv: bool = False
    ) -> list[tuple[ExportedRequest, InFlight]]:
        self._tick("export_requests")
        return [self.running.pop(r) for r in rids if r in self.running and r not in self.stays]

    def import_requests(self, items: list[tuple[ExportedRequest, InFlight]]) -> list[str]:
        self._tick("import_requests")
        refused = [e.request_id for e, s in items if s.version != self.version]
        accepted = [(e, s) for e, s in items if s.version == self.version]
        for e, s in accepted:
            self.running[e.request_id] = (e, s)
        if accepted:
            self.imported.append([e.request_id for e, _ in accepted])
        return refused


def manager_over(
    replicas: list[Replica], partial_pool: Any, buffer: Any, only_with_work: bool = False
) -> RolloutManager:
    """A manager over in-process parts, as `RolloutManager.start` wires it to actors: its dispatcher, supervisor
    and repack loop are the real ones."""
    cfg = Config()
    cfg.repack = RepackConfig(
        interval_s=0.01, batch_limit_b=16, kv_capacity=0.9, only_with_work=only_with_work
    )
    cfg.rollout.max_new_tokens = 32
    manager = RolloutManager(
        ManagerSpec.of(cfg), Schedule.from_config(cfg), None, Local(partial_pool), t0=0.0
    )
    manager.dispatcher.dispatch = Dispatch(groups_per_batch=4, max_outstanding_groups=24)
    manager.fleet.handles = {r.id: Local(r) for r in replicas}
    manager.supervisor.buffer = Local(buffer)
    return manager
