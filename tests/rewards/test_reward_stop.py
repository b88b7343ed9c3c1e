"""A reward that fails everywhere stops the run: the dry run before the start, the stop rule during it."""

from __future__ import annotations

import time

import pytest

from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardLoadError
from laminar.rewards.stop import FailingRewards, RewardFailure, dry_run, dry_run_rows

pytestmark = pytest.mark.fault  # `make faults`


ROWS = dry_run_rows(
    [{"prompt": f"{d} =", "ground_truth": d, "mode": m} for d, m in zip("1234", ["raise", "nan"] * 2)]
)
FAULTY = "tests.runtime.faulty_rewards"


@pytest.mark.parametrize(
    "reward, says",
    [
        ("needs_a_missing_module", "ModuleNotFoundError: No module named 'laminar_no_such_module'"),
        ("nan_always", "not_finite: returned nan"),
    ],
)
def test_a_reward_that_fails_on_every_row_tried_stops_the_dry_run_in_one_line(reward, says):
    with pytest.raises(RewardLoadError) as raised:
        dry_run(f"{FAULTY}:{reward}", ROWS)
    message = str(raised.value)
    assert f"reward function {FAULTY}:{reward} failed on all 4 dataset rows" in message and says in message
    assert "\n" not in message


@pytest.mark.parametrize("reward", ["zero_always", "right_or_fails", "by_mode"])
def test_a_zero_score_or_failures_on_some_rows_pass_the_dry_run(reward):
    rows = [
        {**r, "answer": r["ground_truth"], "mode": m} for r, m in zip(ROWS, ["nan", "string", "raise", "ok"])
    ]
    assert dry_run(f"{FAULTY}:{reward}", rows) == 4


def test_a_call_that_does_not_return_in_time_is_not_judged():
    t0 = time.monotonic()
    assert dry_run(f"{FAULTY}:never_returns", ROWS, timeout_s=0.2) == 0
    assert time.monotonic() - t0 < 5


def group(gid: int, errors: list[bool]) -> list[Trajectory]:
    return [
        Trajectory(
            f"{gid}:{i}",
            gid,
            i,
            [1],
            [2],
            [-0.1],
            0,
            meta={
                "reward_error": f"reward function f on row {gid}: "
                "NameError: name 'x' is not defined\n  File ..."
            }
            if failed
            else {},
        )
        for i, failed in enumerate(errors)
    ]


def test_the_stop_rule_counts_groups_whose_every_reward_failed_in_a_row():
    rule = FailingRewards(limit=3)
    rule.see([group(0, [True, True]), group(1, [True, True])])
    rule.see([group(2, [True, False])])  # one reward that worked: the count starts again
    rule.see([group(3, [True, True]), group(4, [True, True])])
    with pytest.raises(RewardFailure) as raised:
        rule.see([group(5, [True, True])])
    assert str(raised.value) == (
        "every reward of the last 3 groups failed (task.reward_fail_groups=3); the last: reward function f on "
        "row 5: NameError: name 'x' is not defined"
    )
    never = FailingRewards(limit=0)
    never.see([group(g, [True, True]) for g in range(50)])
