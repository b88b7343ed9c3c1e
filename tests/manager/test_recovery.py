"""Recovery: the pure placement plan, and the manager carrying it out after a repack move whose destination or
source dies (in-process replicas from `tests.manager.local` over the real pools and buffer)."""

from __future__ import annotations

import asyncio

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool, PartialTrajectory
from laminar.data.records import PromptGroup, Trajectory
from laminar.manager.recovery import GroupWork, engine_items, plan_recovery
from laminar.rollout.inflight import sample_seed
from tests.manager.local import Replica, item, manager_over

ROW = {"prompt": "abc", "answer": "cba", "sampling": {"max_new_tokens": 9}}
GROUP = PromptGroup(group_id=7, prompt_ids=[1, 5, 6, 3], n=3, meta=ROW)


def entry(idx: int, version: int, tokens: list[int]) -> PartialTrajectory:
    pool = PartialPool()
    pool.start(GROUP, replica=0, version=version)
    pool.progress({GROUP.traj_id(idx): (tokens, [-0.5] * len(tokens))})
    return pool.get(GROUP.traj_id(idx))


def test_same_version_continues_with_its_tokens_its_row_and_its_own_sampling_stream():
    e = entry(0, 3, [4, 4, 2])
    work = GroupWork(e.group(), [e], unstarted=[2], versions={3})
    [p] = plan_recovery([work], {1: 2, 2: 3})
    assert p.replica == 2 and p.version == 3 and not p.restart
    (exported, state), (fresh, fresh_state) = engine_items(p, {"temperature": 1.0}, 11, 0.0)
    assert exported.output_token_ids == [4, 4, 2] and exported.logprobs == [-0.5] * 3 and state.reported == 3
    assert exported.params.seed == sample_seed(11, "7:0") and exported.params.max_new_tokens == 9
    assert state.group.meta == ROW and state.group.n == 3  # the group rebuilt from the pool keeps its row
    assert fresh.request_id == "7:2" and fresh.output_token_ids == [] and fresh_state.version == 3


def test_no_replica_of_its_version_restarts_the_whole_group_on_one_replica():
    work = GroupWork(GROUP, [entry(1, 3, [4, 4])], versions={3})
    [p] = plan_recovery([work], {1: 5, 2: 6})
    assert p.restart and p.replica == 1 and p.version == 5
    items = engine_items(p, {}, 11, 0.0)
    assert [e.request_id for e, _ in items] == ["7:0", "7:1", "7:2"]
    assert all(e.output_token_ids == [] and s.version == 5 for e, s in items)


def test_a_group_already_of_two_versions_restarts_whole_even_where_one_of_them_lives():
    work = GroupWork(GROUP, [entry(0, 3, [1])], versions={3, 4})
    [p] = plan_recovery([work], {1: 3, 2: 4})
    assert p.restart and len(p.samples) == 3


def test_groups_spread_over_the_least_loaded_replicas_and_nothing_alive_means_no_plan():
    other = PromptGroup(8, [1], n=1)
    work = [GroupWork(GROUP, [entry(0, 3, [1])], versions={3}), GroupWork(other, [], [0], versions={3})]
    assert sorted(p.replica for p in plan_recovery(work, {1: 3, 2: 3})) == [1, 2]
    assert plan_recovery(work, {}) == []


def _moved_from_0_to_1():
    """Replica 0's tail 7:0 repacked onto replica 1 (both at version 3); 7:1 has finished into the buffer and
    7:2 still runs on a busy replica 2."""
    pool, buffer = PartialPool(), ExperienceBuffer(group_size=3)
    pool.start(GROUP, replica=0, version=3)
    pool.progress({"7:0": ([4], [-0.5])})
    buffer.add(Trajectory("7:1", 7, 1, list(GROUP.prompt_ids), [2], [-0.1], 3))
    pool.finish("7:1")
    pool.move(["7:2"], 2)
    src = Replica(0, 3, [item(GROUP, 0, 3, [4])], blocks=1)
    dst = Replica(1, 3, [item(PromptGroup(8, [1], n=1), 0, 3)], blocks=3)
    busy = Replica(2, 3, [item(GROUP, 2, 3)], waiting=1)
    manager = manager_over([src, dst, busy], pool, buffer)
    manager.fleet.owe(0, GROUP)
    asyncio.run(manager.repack.round(None))
    assert manager.repack.stats.moved == 1 and "7:0" in dst.running
    return manager, pool, buffer, (src, dst, busy)


def _dies(manager, replica) -> None:
    replica.kill()
    del manager.fleet.handles[replica.id]
    asyncio.run(manager.supervisor.recover(replica.id))


def test_a_moved_group_is_owed_by_its_destination_and_recovered_with_its_row_when_it_dies():
    manager, pool, buffer, (src, dst, busy) = _moved_from_0_to_1()
    assert manager.fleet.owed[1][7].meta == ROW
    _dies(manager, dst)
    # 7:0 continues on a replica of version 3 with its tokens and its row
    exported, state = next((e, s) for r in (src, busy) for rid, (e, s) in r.running.items() if rid == "7:0")
    assert exported.output_token_ids == [4] and state.group.meta == ROW and state.version == 3
    assert (
        manager.fleet.failures["recovered_trajectories"] == 1
        and manager.fleet.failures["restarted_groups"] == 0
    )
    assert "7:1" in buffer.seen  # its finished sample stays: the group is still of one version


def test_samples_moved_away_from_a_source_that_dies_are_not_started_again():
    manager, pool, buffer, (src, dst, busy) = _moved_from_0_to_1()
    before = (list(dst.imported), list(busy.imported))  # dst: the repack move itself
    _dies(manager, src)
    assert (dst.imported, busy.imported) == before  # nothing restarted or continued twice
    assert pool.get("7:0").replica == 1 and manager.fleet.failures["restarted_trajectories"] == 0


def test_when_its_version_is_gone_the_group_restarts_whole_and_the_buffer_forgets_its_old_samples():
    manager, pool, buffer, (src, dst, busy) = _moved_from_0_to_1()
    src.version = busy.version = 4  # src drained (released) and pulled; imagine busy on version 4 as well
    busy.running.clear()
    pool.finish("7:2")
    buffer.add(Trajectory("7:2", 7, 2, list(GROUP.prompt_ids), [2], [-0.1], 3))
    _dies(manager, dst)
    [target] = [r for r in (src, busy) if any(ids[0].startswith("7:") for ids in r.imported)]
    assert sorted(target.running) == ["7:0", "7:1", "7:2"]
    assert {s.version for _, s in target.running.values()} == {4}
    assert not buffer.pending and buffer.required[7] == 4
    assert manager.fleet.failures["restarted_groups"] == 1
    assert all(pool.get(t).version == 4 and pool.get(t).restarts == 1 for t in ("7:0", "7:1", "7:2"))
