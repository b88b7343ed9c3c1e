"""The manager's repack round frees only as many replicas as the dispatch rule has work for
(`repack.only_with_work`), driven with in-process stand-ins for the replica actors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from laminar.manager.dispatch import Dispatch
from laminar.manager.manager import RolloutManager


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)

        return call()


class TailReplica:
    """A replica in its ramp-down tail: one running request of `blocks` KV blocks, nothing waiting."""

    def __init__(self, rid: int, blocks: int) -> None:
        self.rid, self.requests = rid, {f"r{rid}": blocks}
        self.snapshot = _Remote(self._snapshot)
        self.export_requests = _Remote(self._export)
        self.import_requests = _Remote(self._import)

    def _snapshot(self) -> dict:
        return {
            "replica": self.rid,
            "version": 3,
            "waiting": 0,
            "running": len(self.requests),
            "kv_used": sum(self.requests.values()),
            "kv_total": 100,
            "peak_kv": 50,
            "requests": sorted(self.requests.items()),
        }

    def _export(self, rids):
        items = []
        for rid in rids:
            blocks = self.requests.pop(rid)
            state = SimpleNamespace(sample_idx=0, group=SimpleNamespace(traj_id=lambda _i, rid=rid: rid))
            items.append((blocks, state))
        return items

    def _import(self, items):
        for blocks, state in items:
            self.requests[state.group.traj_id(0)] = blocks
        return []  # nothing refused


def _round(only_with_work: bool, dispatched: int, consumed: int) -> int:
    async def go() -> int:
        manager = RolloutManager(None, Dispatch(groups_per_batch=4, max_outstanding_groups=24), t0=0.0)
        manager.handles = {0: TailReplica(0, 2), 1: TailReplica(1, 3)}
        manager.partial_pool = SimpleNamespace(
            move=SimpleNamespace(remote=lambda rid, dst: None)
        )  # not awaited
        manager.repack_cfg = {
            "interval_s": 0.01,
            "batch_limit_b": 16,
            "kv_capacity": 0.9,
            "only_with_work": only_with_work,
        }
        manager.dispatched_groups, manager.consumed_groups = dispatched, consumed
        loop = asyncio.create_task(manager._repack_loop())
        await asyncio.sleep(0.1)
        manager.stopped = True
        manager._updated.set()
        await loop
        return manager.repack_stats.released

    return asyncio.run(go())


@pytest.mark.parametrize(
    "only_with_work, dispatched, consumed, released",
    [
        (True, 24, 0, 0),  # the dispatch bound is reached: a freed replica would sit idle, so no repack
        (True, 24, 8, 1),  # two batches of room: the one replica the plan can free is freed
        (False, 24, 0, 1),  # without the gate it repacks anyway
    ],
)
def test_repack_waits_for_work_for_the_freed_replica(only_with_work, dispatched, consumed, released):
    assert _round(only_with_work, dispatched, consumed) == released
