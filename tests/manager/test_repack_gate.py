"""The manager's repack round frees only as many replicas as the dispatch rule has work for
(`repack.only_with_work`), driven with in-process replicas (`tests.manager.local`)."""

from __future__ import annotations

import asyncio

import pytest

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup
from tests.manager.local import Replica, item, manager_over


def _round(only_with_work: bool, dispatched: int, consumed: int) -> int:
    """Two replicas in their ramp-down tail, one running request each (2 and 3 KV blocks, nothing waiting)."""

    async def go() -> int:
        tails = [PromptGroup(g, [1, 2], n=1) for g in (0, 1)]
        pool = PartialPool()
        for g in tails:
            pool.start(g, replica=g.group_id, version=3)
        replicas = [Replica(g.group_id, 3, [item(g, 0, 3)], blocks=2 + g.group_id) for g in tails]
        manager = manager_over(replicas, pool, ExperienceBuffer(group_size=1), only_with_work=only_with_work)
        manager.dispatcher.dispatched_groups, manager.dispatcher.consumed_groups = dispatched, consumed
        await manager.repack.once()
        return manager.repack.stats.released

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
