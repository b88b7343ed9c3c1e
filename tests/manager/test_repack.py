"""The repack planner: limits, versions, release count against first fit, determinism, edge cases."""

from __future__ import annotations

import dataclasses
import random

import pytest

from laminar.data.records import ReplicaSnapshot
from laminar.manager.repack import (
    RepackPlan,
    ReplicaLoad,
    idle_replicas,
    plan_first_fit,
    plan_repack,
)
from laminar.manager.repacker import load_of


def _replica(
    replica: int, blocks: list[int], *, version: int = 0, total: int = 100, waiting: int = 0, peak=None
):
    used = sum(blocks)
    return ReplicaLoad(
        replica=replica,
        version=version,
        waiting=waiting,
        running=len(blocks),
        kv_blocks_used=used,
        kv_blocks_total=total,
        peak_kv_blocks=used + 10 if peak is None else peak,
        requests=tuple((f"{replica}-{i}", b) for i, b in enumerate(blocks)),
    )


def _random_loads(rng: random.Random) -> tuple[list[ReplicaLoad], int]:
    batch_limit_b = rng.randint(1, 16)
    loads = []
    for replica in range(rng.randint(0, 14)):
        total = rng.choice([64, 128, 256])
        blocks: list[int] = []
        for _ in range(rng.randint(0, batch_limit_b)):
            b = rng.randint(1, max(1, total // 4))
            if sum(blocks) + b <= total:
                blocks.append(b)
        load = _replica(
            replica,
            blocks,
            version=rng.randint(0, 2),
            total=total,
            waiting=rng.choice([0, 0, 0, 1]),
            peak=sum(blocks) + rng.randint(0, 20),
        )
        loads.append(load)
    return loads, batch_limit_b


def _apply(loads: list[ReplicaLoad], plan: RepackPlan) -> dict[int, tuple[int, int]]:
    """(kv blocks, running) of each replica after the plan's moves."""
    state = {r.replica: [r.kv_blocks_used, r.running] for r in loads}
    blocks = {rid: b for r in loads for rid, b in r.requests}
    for m in plan.moves:
        state[m.source][0] -= blocks[m.request_id]
        state[m.source][1] -= 1
        state[m.destination][0] += blocks[m.request_id]
        state[m.destination][1] += 1
    return {k: (v[0], v[1]) for k, v in state.items()}


def _check_valid(loads: list[ReplicaLoad], plan: RepackPlan, batch_limit_b: int, frac: float = 0.9) -> None:
    by_id = {r.replica: r for r in loads}
    idle = {r.replica for r in idle_replicas(loads, batch_limit_b)}
    owner = {rid: r.replica for r in loads for rid, _ in r.requests}
    moved = [m.request_id for m in plan.moves]
    assert len(moved) == len(set(moved)), "a request moved twice"
    destinations = {m.destination for m in plan.moves}
    for m in plan.moves:
        assert owner[m.request_id] == m.source
        assert m.source in idle and m.destination in idle
        assert by_id[m.source].version == by_id[m.destination].version, "mixed versions"
        assert m.source in plan.released, "moves kept for a source that was not released"
    assert not destinations & set(plan.released), "a replica both received and was released"
    for replica in plan.released:
        assert {rid for rid, _ in by_id[replica].requests} <= set(moved), "released with requests left"
    after = _apply(loads, plan)
    for replica in destinations:
        kv, running = after[replica]
        assert kv <= frac * by_id[replica].kv_blocks_total
        assert running <= batch_limit_b


def test_packs_two_small_tails_onto_one_replica() -> None:
    loads = [_replica(0, [10, 5], total=200), _replica(1, [20], total=200), _replica(2, [40, 30], total=200)]
    plan = plan_repack(loads, batch_limit_b=5)
    _check_valid(loads, plan, 5)
    assert plan.released == (0, 1)
    assert {m.destination for m in plan.moves} == {2}


def test_a_source_must_have_drained_below_ramp_down_frac_of_its_peak() -> None:
    # replica 0 has freed 10% of its batch's peak KV, replicas 1 and 2 60%: at 1.0 all three take part (two
    # are released), at 0.5 replica 0 is neither source nor destination
    loads = [
        _replica(0, [45, 45], total=400, peak=100),
        _replica(1, [20, 20], total=400, peak=100),
        _replica(2, [40, 40], total=400, peak=200),
    ]
    assert len(plan_repack(loads, batch_limit_b=8).released) == 2
    plan = plan_repack(loads, batch_limit_b=8, ramp_down_frac=0.5)
    assert plan.released == (1,) and {m.destination for m in plan.moves} == {2}
    with pytest.raises(ValueError, match="ramp_down_frac=0.0 must be in"):
        plan_repack(loads, batch_limit_b=8, ramp_down_frac=0.0)


def test_best_fit_prefers_the_fullest_destination() -> None:
    loads = [_replica(0, [5]), _replica(1, [20]), _replica(2, [60])]
    plan = plan_repack(loads, batch_limit_b=8)
    assert plan.moves[0].destination == 2


def test_respects_batch_limit_and_kv_capacity() -> None:
    loads = [_replica(0, [10, 10]), _replica(1, [10, 10])]
    assert plan_repack(loads, batch_limit_b=3).released == ()
    loads = [_replica(0, [50]), _replica(1, [45])]
    assert plan_repack(loads, batch_limit_b=8, kv_capacity_frac=0.9).released == ()
    assert plan_repack(loads, batch_limit_b=8, kv_capacity_frac=1.0).released == (1,)


def test_partially_placed_source_keeps_everything() -> None:
    # Each source could place one request on the other, never both: nothing moves.
    loads = [_replica(0, [5, 5]), _replica(1, [20, 20])]
    assert plan_repack(loads, batch_limit_b=3) == RepackPlan()


def test_never_mixes_versions() -> None:
    loads = [_replica(0, [5], version=1), _replica(1, [5], version=2)]
    assert plan_repack(loads, batch_limit_b=8) == RepackPlan()


def test_busy_replicas_are_not_touched() -> None:
    loads = [_replica(0, [5], waiting=3), _replica(1, [5], peak=5), _replica(2, [5]), _replica(3, [5, 5])]
    assert [r.replica for r in idle_replicas(loads, batch_limit_b=2)] == [2]
    assert plan_repack(loads, batch_limit_b=2) == RepackPlan()


def test_one_replica_and_empty_input() -> None:
    assert plan_repack([], batch_limit_b=8) == RepackPlan()
    assert plan_repack([_replica(0, [3, 4])], batch_limit_b=8) == RepackPlan()


def test_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="batch_limit_b"):
        plan_repack([], batch_limit_b=0)
    with pytest.raises(ValueError, match="kv_capacity_frac"):
        plan_repack([], batch_limit_b=4, kv_capacity_frac=1.5)


def test_random_cases_valid_deterministic_and_at_least_first_fit() -> None:
    rng = random.Random(1234)
    gained = 0
    for _ in range(3000):
        loads, b = _random_loads(rng)
        plan = plan_repack(loads, batch_limit_b=b)
        baseline = plan_first_fit(loads, batch_limit_b=b)
        _check_valid(loads, plan, b)
        _check_valid(loads, baseline, b)
        assert plan == plan_repack(list(reversed(loads)), batch_limit_b=b), "depends on input order"
        assert len(plan.released) >= len(baseline.released)
        gained += len(plan.released) > len(baseline.released)
    assert gained > 0, "best fit never beat first fit: the random cases are too easy"


def test_max_released_caps_the_plan() -> None:
    loads = [_replica(i, [5], total=200) for i in range(6)] + [_replica(9, [50], total=200)]
    assert len(plan_repack(loads, batch_limit_b=8).released) == 6
    capped = plan_repack(loads, batch_limit_b=8, max_released=2)
    _check_valid(loads, capped, 8)
    assert len(capped.released) == 2
    assert {m.source for m in capped.moves} == set(capped.released)
    assert plan_repack(loads, batch_limit_b=8, max_released=0) == RepackPlan()


def test_a_replica_whose_tails_wait_for_tools_is_a_repack_source():
    """Requests parked on a tool call are out of the decode batch but still the replica's work: they count as
    running for the planner, so a replica left with only those is packed away like any other tail."""
    snap = ReplicaSnapshot(1, version=2, parked=2, kv_blocks_used=4, kv_blocks_total=64, peak_kv_blocks=10)
    load = load_of(dataclasses.replace(snap, requests=[("7:0", 2), ("7:1", 2)]))
    assert load.running == 2 and load.requests == (("7:0", 2), ("7:1", 2))
    busy = ReplicaLoad(2, 2, 0, 3, 20, 64, 30, (("8:0", 5), ("8:1", 5), ("8:2", 5)))
    plan = plan_repack([load, busy], batch_limit_b=16, kv_capacity_frac=0.9)
    assert plan.released == (1,) and {m.request_id for m in plan.moves} == {"7:0", "7:1"}


def test_newest_first_spends_the_cap_on_the_newest_tails_and_max_age_leaves_the_old_alone() -> None:
    """The staleness tail (old versions' long trajectories) keeps running alone at its fastest: with
    `newest_first` the release cap goes to the newest version first, and `min_version` leaves older
    replicas out of the round entirely."""
    loads = [_replica(i, [5], version=1, total=200) for i in range(2)]
    loads += [_replica(10 + i, [5], version=3, total=200) for i in range(2)]
    oldest = plan_repack(loads, batch_limit_b=8, max_released=1)
    newest = plan_repack(loads, batch_limit_b=8, max_released=1, newest_first=True)
    assert oldest.released == (0,) and newest.released == (10,)
    _check_valid(loads, newest, 8)
    kept = plan_repack(loads, batch_limit_b=8, min_version=2)
    touched = {m.source for m in kept.moves} | {m.destination for m in kept.moves}
    assert kept.released == (10,) and touched == {10, 11}


def test_capped_round_packs_tails_only_to_the_capped_limit() -> None:
    """When the gate caps a round below what it could free, tails are packed only up to
    `capped_batch_limit_b`; an uncapped round still packs to B."""
    loads = [_replica(i, [2, 2], total=200) for i in range(4)]  # 4 candidates of 2 running each
    full = plan_repack(loads, batch_limit_b=8, max_released=4)  # the cap does not bind: pack to 8
    assert len(full.released) == 3
    capped = plan_repack(loads, batch_limit_b=8, max_released=2, capped_batch_limit_b=4)
    _check_valid(loads, capped, 4)
    assert len(capped.released) == 2  # 2 + 2 each on the two kept replicas
    assert plan_repack(loads, batch_limit_b=8, max_released=2, capped_batch_limit_b=2) == RepackPlan()
    uncapped = plan_repack(loads, batch_limit_b=8, max_released=4, capped_batch_limit_b=2)
    assert uncapped == full
