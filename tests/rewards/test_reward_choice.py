"""Which reward a run scores with, and why: the user's own rows get the math reward (verl's default by
`data_source`), never the demo's digit reversal; verl's `compute_score` signature and its dict results work,
in the scorer's worker processes too."""

from __future__ import annotations

import json

import pytest

from laminar.configure import load_config
from laminar.data.dataset import normalise_row
from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardScorer, VerlReward, check_reward, load_reward
from laminar.rewards.math import default_score
from laminar.rewards.stop import MATH_REWARD, choose_reward, dry_run, dry_run_rows
from laminar.tasks.reverse import demo_codec

FNS = "tests.rewards.reward_fns"


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2 + 3?", "ground_truth": "5"}) + "\n")
    return path


def test_own_data_without_task_reward_is_scored_by_the_math_reward_and_says_why(rows_file):
    for override in (f"data.train_files={rows_file}", f"task.name={rows_file}"):
        choice = choose_reward(load_config(None, [override]))
        assert choice.path == MATH_REWARD
        assert choice.why.startswith("the rows are your own (") and "data_source" in choice.why


def test_a_named_reward_or_a_built_in_task_keeps_its_own(rows_file):
    assert choose_reward(load_config(None, [])).path == "laminar.rewards.reverse:reverse_reward"
    arith = choose_reward(load_config(None, ["task.name=arith"]))
    assert arith.path == MATH_REWARD and arith.why.startswith("the built-in arith task's own")
    given = choose_reward(load_config(None, [f"data.train_files={rows_file}", f"task.reward={FNS}:one"]))
    assert (given.path, given.why) == (f"{FNS}:one", "task.reward")
    # a built-in task named beside the files (not the demo, which is the default) keeps its reward
    tools = choose_reward(
        load_config(
            None, [f"data.train_files={rows_file}", "task.name=tool_arith", "task.tools=[calculator]"]
        )
    )
    assert tools.path == "laminar.rewards.tool_arith:tool_arith_reward"


def test_verl_rows_pass_the_dry_run_of_the_chosen_reward():
    """The silent failure before: verl parquet rows under the demo's reward raised KeyError 'answer' per row."""
    raw = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May?"}],
        "reward_model": {"style": "rule", "ground_truth": "72"},
    }
    row = normalise_row(raw, 0, "train.parquet")
    assert default_score("so #### 72", row) == 1.0 and default_score("#### 71", row) == 0.0
    assert dry_run(MATH_REWARD, dry_run_rows([row] * 4)) == 4


@pytest.mark.parametrize(
    "value, reward, kind",
    [
        ({"score": 1.0, "acc": True}, 1.0, None),
        ({"score": 0}, 0.0, None),
        ({"score": float("nan")}, 0.0, "not_finite"),
        ({"acc": True}, 0.0, "not_a_number"),
        ({"score": "1"}, 0.0, "not_a_number"),
    ],
)
def test_a_dict_result_counts_by_its_score(value, reward, kind):
    got, got_kind, _ = check_reward(value)
    assert (got, got_kind) == (reward, kind)


def test_verl_compute_score_is_recognised_by_its_parameter_names():
    row = normalise_row(
        {
            "prompt": "q",
            "data_source": "openai/gsm8k",
            "reward_model": {"ground_truth": "72"},
            "extra_info": {"index": 3},
        },
        0,
        "f",
    )
    fn = load_reward(f"{FNS}:verl_compute_score")
    assert isinstance(fn, VerlReward)
    assert fn("#### 72", row) == {"score": 1.0, "acc": True, "index": 3}
    assert fn("#### 7", {**row, "data_source": "other"}) == 0.0
    assert load_reward(f"{FNS}:verl_two_params")("72", row) == 1.0  # only the keywords it names
    assert load_reward(f"{FNS}:verl_kwargs")("72", row) == 1.0  # **kwargs: all of them
    plain = load_reward(f"{FNS}:one")
    assert not isinstance(plain, VerlReward) and plain("x", row) == 1.0  # (response, row) stays as it is


def test_a_verl_reward_scores_in_the_worker_processes_by_path_and_as_a_function():
    from tests.rewards import reward_fns

    codec = demo_codec()
    row = {"data_source": "openai/gsm8k", "ground_truth": "2 1", "extra_info": {}, "row": 0}
    for fn in (f"{FNS}:verl_compute_score", reward_fns.verl_compute_score):
        scorer = RewardScorer(fn, codec.decode, timeout_s=30, processes=1)
        try:
            right = Trajectory("0:0", 0, 0, [1], codec.encode_answer("2 1"), [0.0] * 3, version=0)
            wrong = Trajectory("0:1", 0, 1, [1], codec.encode_answer("1 2"), [0.0] * 3, version=0)
            assert scorer.score(right, row) == 1.0 and scorer.score(wrong, row) == 0.0
            assert scorer.stats() == {"scored": 2, "reward_errors": 0}
        finally:
            scorer.close()


def test_a_row_without_a_ground_truth_says_which_fields_it_has_not_that_ground_truth_is_one():
    from laminar.rewards.math import ground_truths

    row = normalise_row({"prompt": "What is 2 + 3?", "question_id": 7}, 0, "f")
    with pytest.raises(ValueError) as raised:
        ground_truths(row)
    message = str(raised.value)
    assert "expected 'reward_model.ground_truth' (verl), 'ground_truth' or 'answer'" in message
    assert "'question_id'" in message and "'ground_truth'" not in message.split("its fields")[1]
