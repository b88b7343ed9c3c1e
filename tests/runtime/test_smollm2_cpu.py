"""The imported SmolLM2-135M-Instruct trains a few steps on CPU on `arith` with evaluation on: the path a user
without a GPU takes. Needs the imported directory (`laminar model import`), named by LAMINAR_SMOLLM2; skipped
without it (CI has no model)."""

from __future__ import annotations

import json
import os

import pytest

from laminar.config import load_config
from laminar.train import train

MODEL = os.environ.get("LAMINAR_SMOLLM2", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not MODEL, reason="set LAMINAR_SMOLLM2 to an imported SmolLM2-135M-Instruct directory"
    ),
]


def test_smollm2_trains_on_arith_on_cpu_with_evaluation(ray_cluster, tmp_path):
    cfg = load_config(
        "configs/smollm2-arith.yaml",
        [
            f"model.path={MODEL}",
            "model.device=cpu",
            "model.dtype=float32",
            "rollout.num_gpus=0",
            "trainer.num_gpus=0",
            "rollout.replicas=1",
            "rollout.num_cpus=1",
            "trainer.num_cpus=1",
            "trainer.steps=2",
            "trainer.groups_per_step=2",
            "trainer.group_size=4",
            "trainer.micro_batch=4",
            "rollout.groups_per_batch=2",
            "rollout.max_num_seqs=16",
            "rollout.kv_blocks=256",
            "rollout.max_new_tokens=64",
            "buffer.capacity_groups=4",
            "eval.every=2",
            "eval.num_prompts=4",
            "run.timeout_s=600",
        ],
    )
    summary = train(cfg, tmp_path, quiet=True)
    assert summary["trainer_steps"] == 2 and summary["reward_errors"] == 0
    assert summary["trajectories"]["audit_ok"] and summary["eval"]["evaluations"] == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["accuracy"] <= 1 for r in records if r["kind"] == "eval")
    assert (tmp_path / "checkpoint" / "chat_template.jinja").exists() or (
        "chat_template" in (tmp_path / "checkpoint" / "tokenizer_config.json").read_text()
    )  # the checkpoint is a complete model directory, template included
