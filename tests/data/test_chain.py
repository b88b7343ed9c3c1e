"""The `chain` task: seeded rows, a held-out split that shares no problem with training, long-tailed step counts,
demonstrations that are right step by step (and scored 1 by the task's reward, a wrong answer 0), through a chat
template."""

import random
import re

import pytest

from laminar.config import Config, ConfigError
from laminar.configure import load_config
from laminar.data.codec import TaskCodec
from laminar.rewards.chain import chain_reward
from laminar.tasks import chain
from laminar.tasks.rows import held_out_rows, train_rows
from tests.realmodel import build_bpe_tokenizer
from tests.runs import QUICK

STEP = re.compile(r"(\d+)\. (\d+) ([-+*]) (\d+) = (\d+)")


def config(*overrides: str) -> Config:
    return load_config(None, ["task.name=chain", *overrides])


def test_rows_are_seeded_and_reproducible():
    a, b = train_rows(config("task.num_prompts=500")), train_rows(config("task.num_prompts=500"))
    assert a == b and len(a) == 500
    other = train_rows(config("task.num_prompts=500", "task.seed=1"))
    assert [r["prompt"] for r in other] != [r["prompt"] for r in a]
    row = a[0]
    assert row["data_source"] == "chain" and row["prompt"][0]["role"] == "user"
    assert "Start with" in row["prompt"][0]["content"] and "\\boxed{}" in row["prompt"][0]["content"]


def test_the_held_out_split_shares_no_problem_with_training_and_is_drawn_level_by_level():
    cfg = config("task.num_prompts=8000", "eval.num_prompts=500", "task.chain_levels=1,2,3")
    train = {r["prompt"][0]["content"] for r in train_rows(cfg)}
    held = held_out_rows(cfg)
    texts = [r["prompt"][0]["content"] for r in held]
    assert len(set(texts)) == len(texts) == 500 and not train & set(texts)
    assert [r["extra_info"]["level"] for r in held[:6]] == [1, 2, 3, 1, 2, 3]
    # whatever the seed: the split is a hash of the problem
    assert all(chain.held_out(p) for p in chain.problems((1, 2), 4, 40, seed=7, count=50, split="held_out"))
    assert not any(chain.held_out(p) for p in chain.problems((1, 2), 4, 40, seed=7, count=50))


def test_step_counts_are_long_tailed():
    steps = sorted(len(p.ops) for p in chain.problems((1, 2), 4, 40, seed=0, count=4000))
    median, p99 = steps[len(steps) // 2], steps[int(0.99 * len(steps))]
    assert 3 <= median <= 5 and p99 >= 6 * median and steps[0] == 1 and steps[-1] <= chain.MAX_STEPS


@pytest.mark.parametrize("level", sorted(chain.LEVELS))
def test_every_step_keeps_the_number_within_its_level(level):
    lv = chain.LEVELS[level]
    for p in chain.problems((level,), 6, 40, seed=3, count=300):
        assert p.level == level and len(p.values) == len(p.ops)
        assert all(0 <= v <= lv.top for v in [p.start, *p.values])
        assert all(n <= lv.add if op != "multiply by" else n in lv.times for op, n in p.ops)


def test_a_demonstration_is_right_step_by_step_and_scores_1_while_a_wrong_answer_scores_0():
    levels = (1, 2, 3, 4)
    rows = train_rows(config("task.num_prompts=200", "task.chain_levels=1,2,3,4"))
    problems = chain.problems(levels, 4.0, 40.0, seed=0, count=200)
    for p, row in zip(problems, rows, strict=True):
        text = p.solution()
        lines = text.splitlines()
        value = p.start
        for i, (line, (op, n)) in enumerate(zip(lines[:-1], p.ops, strict=True), 1):
            index, a, symbol, b, result = STEP.fullmatch(line).groups()
            assert (int(index), int(a), symbol, int(b)) == (i, value, chain.SYMBOL[op], n)
            value = chain.apply(value, op, n)
            assert int(result) == value
        assert lines[-1] == f"\\boxed{{{value}}}" and str(value) == row["ground_truth"]
        assert chain_reward(text, row) == 1.0
        assert chain_reward(text.replace(f"\\boxed{{{value}}}", f"\\boxed{{{value + 1}}}"), row) == 0.0


def test_the_reward_reads_the_box_only():
    row = {"ground_truth": "14", "data_source": "chain"}
    assert chain_reward("1. 11 - 1 = 10\n2. 10 + 4 = 14\n\\boxed{14}", row) == 1.0
    assert chain_reward("1. 11 - 1 = 10\n2. 10 + 4 = 14", row) == 0.0  # no box: cut off, or never answered
    assert chain_reward("\\boxed{10 + 4}", row) == 0.0  # an expression is not the number


def test_the_warm_start_demonstrates_training_problems_through_the_chat_template():
    codec = TaskCodec(build_bpe_tokenizer("chatml"))
    example = chain.TASK.warm_start.examples(codec, None)  # it reads nothing of the warm-up run's config
    rng = random.Random(0)
    for _ in range(20):
        ids, mask = example(rng)
        cut = mask.index(1)
        assert len(ids) == len(mask) and set(mask[cut:]) == {1} and ids[-1] == codec.eos_id
        prompt = codec.tokenizer.decode(ids[:cut])
        assert prompt.startswith("<|im_start|>user\nStart with") and prompt.endswith(
            "<|im_start|>assistant\n"
        )
        content = prompt.split("user\n", 1)[1].split("<|im_end|>")[0]
        answer = codec.tokenizer.decode(ids[cut:-1])
        start = int(re.match(r"Start with (\d+)", content)[1])
        ops = tuple((op, int(n)) for op, n in re.findall(r"\d+\. (add|subtract|multiply by) (\d+)", content))
        p = chain.Problem(start, ops, level=1)  # the level does not change the text
        assert answer == p.solution() and not chain.held_out(p)


def test_its_config_fields_are_checked_by_name():
    with pytest.raises(ConfigError, match="task.chain_levels='5'"):
        config("task.chain_levels=5")
    with pytest.raises(ConfigError, match="task.chain_steps_p99=3"):
        config("task.chain_steps_p99=3")
    with pytest.raises(ConfigError, match="task.chain_steps_median=0"):
        config("task.chain_steps_median=0")


@pytest.mark.slow
def test_a_chat_model_trains_a_few_steps_on_chain_with_evaluation(ray_cluster, tmp_path):
    import json

    from laminar.train import train
    from tests.realmodel import write_real_model_dir

    model_dir = write_real_model_dir(tmp_path / "model", "chatml", max_positions=4096)
    cfg = load_config(
        None,
        [
            "task.name=chain",
            "task.chain_steps_median=2",
            "task.chain_steps_p99=6",
            *QUICK,
            f"model.path={model_dir}",
            f"run.out={tmp_path / 'run'}",
            "trainer.steps=2",
            "trainer.groups_per_step=2",
            "trainer.group_size=2",
            "trainer.lr=1e-5",
            "trainer.warmup_steps=0",
            "rollout.replicas=1",
            "rollout.max_new_tokens=16",
            "rollout.kv_blocks=512",
            "rollout.max_num_seqs=8",
            "rollout.num_cpus=1",
            "trainer.num_cpus=1",
            "buffer.capacity_groups=4",
            "eval.every=2",
            "eval.num_prompts=4",
            "run.timeout_s=120",
        ],
    )
    summary = train(cfg, tmp_path / "run", quiet=True)
    assert summary["trainer_steps"] == 2 and summary["reward_errors"] == 0 and summary["replica_errors"] == 0
    assert summary["eval"]["evaluations"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["prompts"] for r in records if r["kind"] == "eval"] == [4, 4]
