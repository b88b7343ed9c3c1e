import pytest

from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardLoadError, RewardScorer, load_reward
from laminar.rewards.reverse import reverse_reward
from laminar.tasks.reverse import demo_codec


def test_reverse_reward_exact_and_partial():
    row = {"answer": "3 2 1"}
    assert reverse_reward("3 2 1", row) == 1.0
    assert reverse_reward("3 2 0", row) == pytest.approx(0.5 * 2 / 3)
    assert reverse_reward("3 2 1 1", row) == pytest.approx(0.5 * 3 / 4)  # extra digits cost
    assert reverse_reward("", row) == 0.0


def test_load_by_dotted_path_with_clear_errors():
    assert load_reward("laminar.rewards.reverse:reverse_reward") is reverse_reward
    with pytest.raises(RewardLoadError, match="expected 'module:function'"):
        load_reward("laminar.rewards.reverse.reverse_reward")
    with pytest.raises(RewardLoadError, match="cannot import module 'no_such_mod'"):
        load_reward("no_such_mod:f")
    with pytest.raises(RewardLoadError, match="has no function 'nope'.*reverse_reward"):
        load_reward("laminar.rewards.reverse:nope")


def test_a_failing_reward_scores_zero_keeps_the_trajectory_and_says_where(tmp_path, monkeypatch):
    (tmp_path / "flaky_reward.py").write_text(
        "def boom(response, row):\n    raise RuntimeError('judge unavailable')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    codec = demo_codec()
    scorer = RewardScorer("flaky_reward:boom", codec.decode)
    t = Trajectory("4:1", 4, 1, [1], codec.encode_answer("1 2"), [0.0, 0.0, 0.0], version=0, reward=0.7)
    assert scorer.score(t, {"answer": "2 1", "row": 17}) == 0.0
    assert t.reward == 0.0 and t.response_ids  # trajectory intact
    err = t.meta["reward_error"]
    assert "flaky_reward:boom" in err and "row 17" in err and "4:1" in err and "judge unavailable" in err
    assert scorer.stats() == {"scored": 1, "reward_errors": 1}
    good = RewardScorer(reverse_reward, codec.decode)
    t2 = Trajectory("5:0", 5, 0, [1], codec.encode_answer("1 2"), [0.0] * 3, version=0)
    assert good.score(t2, {"answer": "1 2"}) == 1.0 and "reward_error" not in t2.meta
