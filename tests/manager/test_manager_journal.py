"""The rollout manager's journal, without Ray: a second manager over the same journal folder is its restarted
process. It keeps the dispatch bound, what each replica owes and the events the driver has not logged; a replica's
call made again gets the same answer; and groups the prompt pool handed out that the lost manager never recorded
are adopted."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from laminar.configure import load_config
from laminar.data.records import ReplicaSnapshot
from laminar.manager.manager import RolloutManager
from laminar.manager.spec import ManagerSpec
from laminar.runtime.control import JournaledPromptPool
from laminar.schedules.schedule import Schedule
from tests.manager.local import Local

ROWS = [{"prompt": f"{i}", "answer": str(i)} for i in range(8)]
BEAT = ReplicaSnapshot(0, reward_errors=[{"traj_id": "0:1", "error": "x"}])


def manager(journal, pool) -> RolloutManager:
    cfg = load_config(None, ["trainer.groups_per_step=2", "rollout.groups_per_batch=1"])
    return RolloutManager(
        ManagerSpec.of(cfg), Schedule.from_config(cfg), Local(pool), None, t0=0.0, journal_dir=journal
    )


def test_a_restarted_manager_answers_as_the_lost_one_would_have_and_adopts_what_it_missed(
    tmp_path, monkeypatch
):
    # without Ray there are no replicas and relays to find again: the restart only adopts what the pool handed out
    monkeypatch.setattr(RolloutManager, "_resume", lambda self: self.dispatcher.adopt())
    pool = JournaledPromptPool(ROWS, lambda text: [int(text) + 3], 2, 0, str(tmp_path / "pool"))

    async def lost() -> tuple[list, list]:
        m = manager(tmp_path / "manager", pool)
        groups = await m.next_work(0, 0, request=1)
        assert groups and await m.next_work(0, 0, request=1) == groups  # its call made again
        m.trainer_update(1, 1)
        m.trainer_update(1, 1)  # made again: totals, counted once
        m.group_done(0, groups[0].group_id)
        m.fleet.event("failure", what="rollout", replica=5)
        m.heartbeat(BEAT, 2.0)
        m.heartbeat(BEAT, 2.0)  # sent again: its reward error is logged once
        _, first, events = m.drain_records(0)
        assert first == 0 and [e["kind"] for e in events] == ["dispatch", "failure", "reward_error"]
        assert m.drain_records(0)[2] == events  # not logged yet by the driver: given again
        assert m.drain_records(1)[1:] == (1, events[1:])
        return groups, m._state()

    groups, before = asyncio.run(lost())
    missed = pool.next_groups(1, asker=1, request=4)  # answered by the pool, never recorded by the manager

    async def restarted() -> None:
        m = manager(tmp_path / "manager", pool)
        await m.resumed()
        assert m._state()["supervisor"] == before["supervisor"]
        assert m._state()["fleet"]["owed"] == before["fleet"]["owed"] + [[1, [asdict(g) for g in missed]]]
        d = m.dispatcher
        assert (d.trainer_version, d.consumed_groups) == (1, 1)
        assert d.dispatched_groups == before["dispatch"]["dispatched"] + len(missed)
        assert await m.next_work(0, 0, request=1) == groups
        assert await m.next_work(1, 0, request=4) == missed  # the replica's call, made again
        assert list(m.fleet.owed[1]) == [g.group_id for g in missed]
        assert groups[0].group_id not in m.fleet.owed.get(0, {})  # settled before the loss
        _, first, events = m.drain_records(1)
        assert first == 1 and [e["kind"] for e in events] == ["failure", "reward_error", "dispatch"]
        assert events[2]["adopted"] and events[2]["groups"] == [g.group_id for g in missed]
        m.heartbeat(BEAT, 2.0)  # and after the restart
        assert len(m.drain_records(1)[2]) == 3

    asyncio.run(restarted())
