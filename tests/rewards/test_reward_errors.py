"""A reward that raises, runs too long or returns a non-number scores 0, and every failure is kept to report."""

import concurrent.futures as cf
import math

import numpy as np
import pytest

from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardScorer, ScoringPool, check_reward
from laminar.tasks.reverse import demo_codec

CODEC = demo_codec()
FNS = "tests.rewards.reward_fns"  # rewards run in worker processes, which import them by dotted path


def traj(tid: str = "3:1") -> Trajectory:
    group, idx = (int(x) for x in tid.split(":"))
    return Trajectory(tid, group, idx, [1], CODEC.encode_answer("1 2"), [0.0] * 3, version=0, reward=0.9)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (float("nan"), "not_finite"),
        (float("inf"), "not_finite"),
        (-math.inf, "not_finite"),
        (np.float32("nan"), "not_finite"),
        ("1.0", "not_a_number"),
        (None, "not_a_number"),
        ([1.0], "not_a_number"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_scores_zero_and_is_counted(value, kind):
    scorer = RewardScorer(f"{FNS}:value_of_row", CODEC.decode)
    t = traj()
    assert scorer.score(t, {"row": 11, "value": value}) == 0.0 and t.reward == 0.0
    scorer.close()
    assert scorer.stats() == {"scored": 1, "reward_errors": 1}
    [error] = scorer.drain_errors()
    assert error["traj_id"] == "3:1" and error["row"] == 11 and error["error_kind"] == kind
    assert "finite number" in error["error"] and "row 11" in t.meta["reward_error"]
    assert scorer.drain_errors() == []  # reported once


@pytest.mark.parametrize("value", [1, 0.25, True, np.float64(0.5), np.int64(2)])
def test_finite_real_numbers_pass_as_floats(value):
    reward, kind, _ = check_reward(value)
    assert kind is None and reward == float(value) and type(reward) is float


def test_a_raising_reward_scores_zero_with_its_message():
    scorer = RewardScorer(f"{FNS}:raises_key_error", CODEC.decode, timeout_s=5.0)
    t = traj("7:0")
    assert scorer.score(t, {"row": 2}) == 0.0
    scorer.close()
    [error] = scorer.drain_errors()
    assert error == {"traj_id": "7:0", "row": 2, "error_kind": "raised", "error": "KeyError: 'answer'"}
    assert "Traceback" in t.meta["reward_error"]


def test_a_reward_past_its_timeout_scores_zero_and_the_next_call_is_not_held_up():
    scorer = RewardScorer(f"{FNS}:sleeps_on_row_zero", CODEC.decode, timeout_s=0.2)
    try:
        assert scorer.score(traj("0:0"), {"row": 0}) == 0.0  # row 0 sleeps for a minute: killed at 0.2 s
        assert scorer.score(traj("1:0"), {"row": 1}) == 1.0  # another process, not queued behind the hung one
    finally:
        scorer.close()
    [error] = scorer.drain_errors()
    assert error["error_kind"] == "timeout" and "0.2s" in error["error"]
    with pytest.raises(ValueError, match="timeout_s=0"):
        RewardScorer(f"{FNS}:one", CODEC.decode, timeout_s=0)


def test_a_reward_slower_than_its_timeout_does_not_hold_up_the_trajectories_finished_after_it():
    """How a replica scores: trajectory 0's reward hangs past its timeout; the three finished after it are
    stored first (with a single worker process they would queue behind it), then 0 with score 0 and its error."""
    stored: list[str] = []
    scoring = ScoringPool(RewardScorer(f"{FNS}:sleeps_on_row_zero", CODEC.decode, timeout_s=2.0), workers=2)
    try:
        trajs = [traj(f"{i}:0") for i in range(4)]
        futures = [
            scoring.submit(t, {"row": i}, lambda t: stored.append(t.traj_id)) for i, t in enumerate(trajs)
        ]
        done, _ = cf.wait(futures, timeout=60)
    finally:
        scoring.shutdown()
    assert len(done) == 4 and all(f.exception() is None for f in futures)
    assert stored == ["1:0", "2:0", "3:0", "0:0"]
    assert [t.reward for t in trajs] == [0.0, 1.0, 1.0, 1.0]
    [error] = scoring.scorer.drain_errors()
    assert error["traj_id"] == "0:0" and error["error_kind"] == "timeout"
    assert scoring.scorer.stats() == {"scored": 4, "reward_errors": 1}


def test_a_failed_store_fails_the_future_so_the_replica_can_declare_itself_dead():
    scoring = ScoringPool(RewardScorer(f"{FNS}:one", CODEC.decode))

    def store(t):
        raise TimeoutError("buffer did not answer")

    future = scoring.submit(traj(), {"row": 1}, store)
    with pytest.raises(TimeoutError, match="buffer did not answer"):
        future.result(timeout=30)
    scoring.shutdown()
