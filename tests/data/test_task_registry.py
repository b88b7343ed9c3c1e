"""The built-in tasks come from one registry: every entry makes its rows and held-out rows from the default config,
names a reward that loads, and has a warm start that draws demonstrations; any other name is refused with the
valid ones."""

import math
import random
import subprocess
import sys

import pytest

from laminar.config import Config, ConfigError, TaskConfig
from laminar.configure import load_config
from laminar.data.dataset import validate_rows
from laminar.rewards.loader import check_reward, load_reward
from laminar.tasks import DEMO, TASKS, task_named
from laminar.tasks.rows import held_out_rows, train_rows


def default_config(name: str) -> Config:
    cfg = Config()
    cfg.task.name = name
    return cfg


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_makes_its_rows_and_held_out_rows_from_the_default_config(name):
    task = TASKS[name]
    assert task.name == name and task.about
    cfg = default_config(name)
    rows = train_rows(cfg)
    assert len(rows) == cfg.task.num_prompts and validate_rows(rows, f"task {name}") is rows
    held_out = held_out_rows(cfg)
    if task.held_out_rows is None:
        assert held_out == []
    else:
        assert len(held_out) == cfg.eval.num_prompts and validate_rows(held_out, f"task {name} (held out)")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_names_a_default_reward_that_loads_and_scores(name):
    reward = load_reward(TASKS[name].reward)
    row = train_rows(default_config(name))[0]
    value, error, message = check_reward(reward(str(row.get("ground_truth") or ""), row))
    assert error is None and math.isfinite(value), message


@pytest.mark.parametrize("name", sorted(n for n, t in TASKS.items() if t.warm_start is not None))
def test_every_warm_start_draws_demonstrations_with_a_trained_response(name):
    from laminar.data.codec import TaskCodec
    from laminar.tasks.warmup import WarmupConfig, examples_of, task_codec
    from tests.realmodel import build_bpe_tokenizer

    # a task warm-started only from a Hugging Face model: a tokenizer with a chat template stands for one
    codec = task_codec(name) if TASKS[name].warm_start.codec else TaskCodec(build_bpe_tokenizer("chatml"))
    ids, mask = examples_of(name, codec, WarmupConfig())(random.Random(0))
    assert len(ids) == len(mask) and mask[0] == 0 and mask[-1] == 1


def test_an_unknown_task_is_refused_with_the_valid_names():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["task.name=nope"])
    message = str(err.value)
    assert "task.name='nope'" in message and ".jsonl" in message
    assert all(name in message for name in TASKS)
    with pytest.raises(ValueError, match="task.name='nope' is invalid: reverse"):
        task_named("nope")
    with pytest.raises(ValueError, match="task.name='nope' is invalid"):
        train_rows(default_config("nope"))


def test_a_task_checks_its_own_config_fields():
    with pytest.raises(ConfigError, match="task.arith_levels='9'"):
        load_config(None, ["task.name=arith", "task.arith_levels=9"])
    with pytest.raises(ConfigError, match=r"task.tools=\[\] is invalid: .*calculator"):
        load_config(None, ["task.name=tool_arith"])


def test_the_demo_is_the_default_task_and_the_registry_keeps_the_config_light():
    assert TaskConfig().name == DEMO
    code = "import sys, laminar.config; print(sorted({'torch', 'transformers', 'tokenizers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
