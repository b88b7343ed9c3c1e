"""A repack move its destination refuses goes back to its source; one the source refuses too (it drained and
pulled newer weights meanwhile) goes through recovery, never vanishes. The manager drives in-process replicas
(`tests.manager.local`) over the real partial pool and experience buffer."""

from __future__ import annotations

import asyncio

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup, Trajectory
from tests.manager.local import Replica, item, manager_over

ROW = {"prompt": "abc", "answer": "cba", "row": 3}


def group(gid: int = 7) -> PromptGroup:
    return PromptGroup(gid, [1, 5, 6, 3], n=2, meta=dict(ROW))


def finished(g: PromptGroup, idx: int, version: int) -> Trajectory:
    return Trajectory(g.traj_id(idx), g.group_id, idx, list(g.prompt_ids), [4, 2], [-0.1, -0.2], version)


def _setup(same_version_elsewhere: bool):
    """Replica 0's tail (7:0) is planned onto replica 1; replica 1's own tail (8:0) ends before the move
    arrives, so it has pulled version 4 and refuses; replica 0, emptied by the export, has pulled version 4 too
    and refuses it back. 7:1 runs on a busy replica 2 at version 3, or has finished into the buffer."""
    g, other = group(7), PromptGroup(8, [1, 2], n=1)
    pool, buffer = PartialPool(), ExperienceBuffer(group_size=2)
    pool.start(g, replica=0, version=3)
    pool.start(other, replica=1, version=3)
    pool.progress({"7:0": ([4, 4], [-0.5, -0.5])})
    src = Replica(0, 3, [item(g, 0, 3, [4, 4, 9], reported=2)], blocks=1, pulls_to=4)  # 9: not yet reported
    dst = Replica(1, 3, [item(other, 0, 3)], blocks=3, pulls_to=4, finishes=("8:0",))
    replicas = [src, dst]
    if same_version_elsewhere:
        replicas.append(Replica(2, 3, [item(g, 1, 3)], waiting=1))  # busy: not part of the plan
        pool.move(["7:1"], 2)
    else:
        buffer.add(finished(g, 1, 3))
        pool.finish("7:1")
    return g, pool, buffer, replicas


def test_a_move_refused_by_both_ends_continues_on_a_replica_of_its_version():
    g, pool, buffer, replicas = _setup(same_version_elsewhere=True)
    manager = manager_over(replicas, pool, buffer)
    asyncio.run(manager.repack.round(None))
    s = manager.repack.stats
    assert (s.moved, s.refused, s.orphaned, s.released) == (0, 1, 1, 1)  # the source is free all the same
    keeper = replicas[2]
    exported, state = keeper.running["7:0"]
    # its version kept, and the tokens the pool holds: the pool's record stays whole, 9 is made again
    assert exported.output_token_ids == [4, 4] and state.reported == 2 and state.version == 3
    assert state.group.meta == ROW
    assert pool.get("7:0").replica == 2 and pool.get("7:0").response_ids == [4, 4]
    assert (
        manager.fleet.failures["recovered_trajectories"] == 1
        and manager.fleet.failures["restarted_groups"] == 0
    )
    assert manager.fleet.owed[2][7].meta == ROW  # owed by its new replica, with its row
    assert all("7:0" not in r.running for r in replicas[:2])


def test_a_move_nobody_of_its_version_can_take_restarts_its_whole_group_on_one_version():
    g, pool, buffer, replicas = _setup(same_version_elsewhere=False)
    manager = manager_over(replicas, pool, buffer)
    asyncio.run(manager.repack.round(None))
    assert manager.repack.stats.orphaned == 1
    [target] = [r for r in replicas if r.imported]
    assert target.imported == [["7:0", "7:1"]]  # both samples, in one import, at the target's version
    assert {s.version for _, s in target.running.values()} == {4}
    assert all(not e.output_token_ids for e, _ in target.running.values())
    # the buffer forgot 7:1 of version 3 and takes the group only at version 4 now
    assert not buffer.pending and "7:1" not in buffer.seen
    assert not buffer.add(finished(g, 1, 3))  # a late copy of the old version is ignored
    assert buffer.add(finished(g, 0, 4)) and buffer.add(finished(g, 1, 4))
    assert [t.version for t in buffer.ready[0]] == [4, 4]
    assert (
        manager.fleet.failures["restarted_groups"] == 1
        and manager.fleet.failures["restarted_trajectories"] == 2
    )


def test_a_dead_destination_hands_the_move_back_to_its_source():
    g = group(7)
    pool, buffer = PartialPool(), ExperienceBuffer(group_size=2)
    pool.start(g, replica=0, version=3)
    src = Replica(0, 3, [item(g, 0, 3, [4])], blocks=1)  # no newer weights to pull: it takes it back
    dst = Replica(1, 3, [item(PromptGroup(8, [1], n=1), 0, 3)], blocks=3, dies_before="import_requests")
    manager = manager_over([src, dst, Replica(2, 3, [item(g, 1, 3)], waiting=1)], pool, buffer)
    asyncio.run(manager.repack.round(None))
    s = manager.repack.stats
    assert dst.dead and (s.refused, s.orphaned, s.released) == (1, 0, 0)
    assert src.running["7:0"][0].output_token_ids == [4] and pool.get("7:0").replica == 0


def test_a_source_whose_parked_request_stayed_behind_is_not_counted_released():
    """Both of replica 0's requests are planned onto replica 1; one is parked on a call that outlasts the
    export's wait and stays. One moves, and replica 0, still holding the other, is not free."""
    g, other = group(7), PromptGroup(8, [1, 2], n=1)
    pool, buffer = PartialPool(), ExperienceBuffer(group_size=2)
    pool.start(g, replica=0, version=3)
    pool.start(other, replica=1, version=3)
    src = Replica(0, 3, [item(g, 0, 3), item(g, 1, 3)], blocks=1, stays=("7:1",))
    dst = Replica(1, 3, [item(other, 0, 3)], blocks=3)
    manager = manager_over([src, dst], pool, buffer)
    asyncio.run(manager.repack.round(None))
    s = manager.repack.stats
    assert (s.moved, s.released) == (1, 0), s
    assert set(src.running) == {"7:1"} and set(dst.running) == {"8:0", "7:0"}
    assert pool.get("7:0").replica == 1 and pool.get("7:1").replica == 0
