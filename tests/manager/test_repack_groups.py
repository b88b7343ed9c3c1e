"""Repack keeps a group's requests on one replica where that costs nothing (speculation drafts from the group's
text on the request's own replica): whole groups onto sibling holders, never more moves, blocks or fewer
replicas released than the plan without groups, and a group no one destination can take split as before."""

from __future__ import annotations

import asyncio
import random

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup, group_of
from laminar.manager.repack import (
    RepackPlan,
    ReplicaLoad,
    plan_repack,
    split_groups,
)
from tests.manager.local import Replica, item, manager_over
from tests.manager.test_repack import _check_valid


def _replica(replica: int, requests: dict[str, int], *, total: int = 100, version: int = 0) -> ReplicaLoad:
    used = sum(requests.values())
    return ReplicaLoad(replica, version, 0, len(requests), used, total, used + 10, tuple(requests.items()))


def _blocks(loads: list[ReplicaLoad], plan: RepackPlan) -> int:
    blocks = {rid: b for r in loads for rid, b in r.requests}
    return sum(blocks[m.request_id] for m in plan.moves)


def test_group_of_and_split_groups() -> None:
    assert group_of("12:3") == 12 and group_of("-4:0") == -4
    assert group_of("0-1") is None  # no group: one of its own
    loads = [_replica(0, {"1:0": 5, "2:0": 5, "x": 1}), _replica(1, {"1:1": 5, "y": 1})]
    assert split_groups(loads, RepackPlan()) == 1
    assert split_groups([_replica(0, {"x": 1}), _replica(1, {"y": 1})], RepackPlan()) == 0


def test_a_group_goes_to_the_replica_that_holds_its_sibling() -> None:
    """Best fit sends both of replica 0's requests to the fullest replica, 2, away from their sibling on 1."""
    loads = [
        _replica(0, {"7:0": 5, "7:1": 5}),
        _replica(1, {"7:2": 20, "8:0": 20}),
        _replica(2, {"9:0": 60}),
    ]
    before = plan_repack(loads, batch_limit_b=8, keep_groups=False)
    assert before.released == (0,) and {m.destination for m in before.moves} == {2}
    assert split_groups(loads, before) == 1
    plan = plan_repack(loads, batch_limit_b=8)
    _check_valid(loads, plan, 8)
    assert plan.released == (0,) and {m.destination for m in plan.moves} == {1}
    assert split_groups(loads, plan) == 0


def test_a_group_stays_whole_where_best_fit_would_split_it() -> None:
    """Replica 1 has room for one of group 5's requests, replica 2 for both: best fit puts the first on 1."""
    loads = [
        _replica(0, {"5:0": 10, "5:1": 10}),
        _replica(1, {"6:0": 75}),
        _replica(2, {"8:0": 40}),
    ]
    before = plan_repack(loads, batch_limit_b=8, keep_groups=False)
    assert {m.request_id: m.destination for m in before.moves} == {"5:0": 1, "5:1": 2}
    plan = plan_repack(loads, batch_limit_b=8)
    _check_valid(loads, plan, 8)
    assert {m.request_id: m.destination for m in plan.moves} == {"5:0": 2, "5:1": 2}
    assert split_groups(loads, before) == 1 and split_groups(loads, plan) == 0


def test_a_plan_that_leaves_as_many_groups_split_is_not_changed() -> None:
    """Replica 1 holds group 3's sibling but has one free slot (B = 3) for its two requests. Whole on replica 2,
    group 3 would still be split (its sibling stays on 1), so best fit's plan stands."""
    loads = [
        _replica(0, {"3:0": 5, "3:1": 5}),
        _replica(1, {"3:2": 20, "4:0": 20}),
        _replica(2, {"9:0": 30}),
    ]
    plan = plan_repack(loads, batch_limit_b=3)
    _check_valid(loads, plan, 3)
    assert plan == plan_repack(loads, batch_limit_b=3, keep_groups=False)
    assert {m.request_id: m.destination for m in plan.moves} == {"3:0": 1, "3:1": 2}
    assert split_groups(loads, plan) == 1


def test_a_group_too_large_for_any_one_destination_is_split_as_before() -> None:
    loads = [
        _replica(0, {"4:0": 30, "4:1": 30, "4:2": 30}, total=200),
        _replica(1, {"5:0": 120}, total=200),
        _replica(2, {"6:0": 110}, total=200),
    ]
    plan = plan_repack(loads, batch_limit_b=8)
    _check_valid(loads, plan, 8)
    assert plan == plan_repack(loads, batch_limit_b=8, keep_groups=False)
    assert plan.released == (0,) and {m.destination for m in plan.moves} == {1, 2}
    assert split_groups(loads, plan) == 1


def _grouped_loads(rng: random.Random) -> tuple[list[ReplicaLoad], int]:
    """Replicas whose requests come from a few groups each, some groups spread over several replicas."""
    batch_limit_b = rng.randint(2, 16)
    loads = []
    samples: dict[int, int] = {}
    for replica in range(rng.randint(2, 10)):
        total = rng.choice([64, 128, 256])
        requests: dict[str, int] = {}
        groups = [rng.randint(0, 12) for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(1, batch_limit_b)):
            b = rng.randint(1, max(1, total // 6))
            if sum(requests.values()) + b > total:
                break
            g = rng.choice(groups)
            samples[g] = samples.get(g, 0) + 1
            requests[f"{g}:{samples[g]}"] = b
        used = sum(requests.values())
        loads.append(
            ReplicaLoad(
                replica, rng.randint(0, 1), 0, len(requests), used, total, used + 5, tuple(requests.items())
            )
        )
    return loads, batch_limit_b


def test_random_cases_never_worse_than_without_groups_and_often_less_split() -> None:
    """Limits hold, the plan releases as many replicas with no more moves or blocks moved, never splits more
    groups, and splits fewer in a good share of the cases."""
    rng = random.Random(32)
    fewer = same = 0
    for _ in range(1500):
        loads, b = _grouped_loads(rng)
        plan = plan_repack(loads, batch_limit_b=b)
        before = plan_repack(loads, batch_limit_b=b, keep_groups=False)
        _check_valid(loads, plan, b)
        assert plan == plan_repack(list(reversed(loads)), batch_limit_b=b), "depends on input order"
        assert len(plan.released) >= len(before.released)
        assert len(plan.moves) <= len(before.moves)
        assert _blocks(loads, plan) <= _blocks(loads, before)
        split, split_before = split_groups(loads, plan), split_groups(loads, before)
        assert split <= split_before
        fewer += split < split_before
        same += plan == before
    assert fewer > 100, f"only {fewer} of 1500 plans left fewer groups split"
    assert same > 100, "every plan changed: the cases never leave best fit's plan alone"


def test_the_manager_counts_split_groups_after_a_round() -> None:
    """Two replicas each running a sample of group 0 and one of its own group; the round packs one onto the
    other and records that no group is left split."""

    async def go() -> dict:
        groups = [PromptGroup(g, [1, 2], n=2) for g in (0, 1, 2)]
        pool = PartialPool()
        for g in groups:
            pool.start(g, replica=0, version=3)
        replicas = [
            Replica(0, 3, [item(groups[0], 0, 3), item(groups[1], 0, 3)], blocks=2),
            Replica(1, 3, [item(groups[0], 1, 3), item(groups[2], 0, 3)], blocks=3),
        ]
        manager = manager_over(replicas, pool, ExperienceBuffer(group_size=2))
        await manager.repack.once()
        return manager.repack.stats.summary()

    summary = asyncio.run(go())
    assert summary["count"] == 1 and summary["moved"] == 2
    assert summary["split_groups"] == {"mean": 0.0, "max": 0, "last": 0}
