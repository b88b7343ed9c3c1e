"""The run a new user tries first: a chat model with a BPE tokenizer and a verl-format parquet of chat prompts.
It trains, its prompts are the chat template's, and its checkpoint is a whole Hugging Face model directory."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from laminar.configure import load_config
from laminar.data.codec import TaskCodec
from laminar.train import train
from tests.realmodel import write_real_model_dir
from tests.runs import QUICK

pytestmark = pytest.mark.slow


def test_a_chat_model_trains_on_a_verl_parquet(ray_cluster, tmp_path):
    model_dir = write_real_model_dir(tmp_path / "model", "chatml")
    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate([(12, 30), (4, 5), (48, 24), (7, 7)])
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.train_files={tmp_path / 'train.parquet'}",
            "data.system_prompt=Answer with a number.",
            "task.reward=tests.realmodel:ground_truth_reward",
            "task.tools=[calculator]",
            *QUICK,  # each replica builds its tool driver (no call is made in 8 tokens)
            f"run.out={out}",
            "trainer.steps=2",
            "trainer.groups_per_step=2",
            "trainer.group_size=2",
            "trainer.lr=1e-5",
            "rollout.replicas=1",
            "rollout.max_new_tokens=8",
            "rollout.kv_blocks=64",
            "rollout.max_num_seqs=8",
            "rollout.num_cpus=1",
            "trainer.num_cpus=1",
            "buffer.capacity_groups=4",
            "run.timeout_s=90",
            "trainer.warmup_steps=0",
        ],
    )
    summary = train(cfg, out, quiet=True)
    assert summary["trainer_steps"] == 2 and summary["reward_errors"] == 0 and summary["replica_errors"] == 0
    codec = TaskCodec.from_dir(model_dir, system_prompt="Answer with a number.")
    prompts = {tuple(codec.encode_prompt(r["prompt"])) for r in rows}
    trained = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trained and all(tuple(t["prompt_ids"]) in prompts for t in trained)
    for t in trained:  # a response ends at its first end token or at the length limit
        ends = [i for i, tok in enumerate(t["response_ids"]) if tok in codec.end_ids]
        assert (t["finish_reason"] == "stop") == bool(ends) and (
            not ends or ends[0] == len(t["response_ids"]) - 1
        )
    tokenizer = AutoTokenizer.from_pretrained(str(out / "checkpoint"), local_files_only=True)
    assert tokenizer.chat_template and (out / "checkpoint" / "chat_template.jinja").is_file()
