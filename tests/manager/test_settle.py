"""The run's last look (`RolloutManager.stop(settle=True)`): a replica that died in the last steps, unnoticed, is
counted and its work recovered onto a live replica, so the run ends with that work in flight rather than lost;
nothing is replaced any more. With no live replica left, the work stays where it is and a record says why."""

from __future__ import annotations

import asyncio

import pytest

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup
from tests.manager.local import Replica, item, manager_over

GROUP = PromptGroup(group_id=3, prompt_ids=[1, 5, 6], n=2, meta={"prompt": "ab", "answer": "ba"})


@pytest.fixture
def no_actor_kill(monkeypatch):
    """The replicas here are in-process objects, not actors: `ray.kill` has nothing to kill."""
    monkeypatch.setattr("laminar.manager.supervisor.ray.kill", lambda actor: None)


def _fleet(live: bool):
    pool, buffer = PartialPool(), ExperienceBuffer(group_size=2)
    pool.start(GROUP, replica=0, version=2)
    pool.progress({"3:0": ([4, 4], [-0.5, -0.5])})
    dead = Replica(0, 2, [item(GROUP, 0, 2, [4, 4]), item(GROUP, 1, 2)])
    dead.kill()
    others = [Replica(1, 2)] if live else []
    manager = manager_over([dead, *others], pool, buffer)
    manager.fleet.owe(0, GROUP)
    return manager, pool, others


def test_a_replica_dead_at_the_end_is_counted_and_its_work_ends_in_flight_on_a_live_one(no_actor_kill):
    manager, pool, (live,) = _fleet(live=True)
    report = asyncio.run(manager.stop(settle=True))
    assert report["failures"]["rollouts"] == 1 and report["replicas"] == [1]
    assert [e["replica"] for e in manager.fleet.events if e["kind"] == "failure"] == [0]
    assert sorted(live.running) == ["3:0", "3:1"]  # continued from its tokens, and the one never begun
    assert live.running["3:0"][0].output_token_ids == [4, 4]
    assert pool.get("3:0").replica == 1 and pool.get("3:1").replica == 1
    assert not any(e["kind"] == "replacement" for e in manager.fleet.events)


def test_with_no_live_replica_left_the_work_stays_and_a_record_says_why(no_actor_kill):
    manager, pool, _ = _fleet(live=False)
    asyncio.run(manager.stop(settle=True))  # returns: the run's audit reports the loss
    [failed] = [e for e in manager.fleet.events if e["kind"] == "recovery_failed"]
    assert failed["replica"] == 0 and "no live replica" in failed["error"]
    assert pool.get("3:0").replica == 0
