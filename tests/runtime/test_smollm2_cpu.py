"""The imported SmolLM2-135M-Instruct trains a few steps on CPU on `arith` with evaluation on, with the CPU config
(`configs/smollm2-arith-cpu.yaml`): the path a user without a GPU takes; each trained response is kept as text. Needs the imported directory (`laminar model import`), named by LAMINAR_SMOLLM2; skipped
without it (CI has no model)."""

from __future__ import annotations

import json
import os

import pytest

from laminar.configure import load_config
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
        "configs/smollm2-arith-cpu.yaml",  # the README's CPU recipe, shortened
        [f"model.path={MODEL}", "trainer.steps=2", "eval.every=2", "eval.num_prompts=4"],
    )
    summary = train(cfg, tmp_path, quiet=True)
    assert summary["trainer_steps"] == 2 and summary["reward_errors"] == 0
    assert summary["trajectories"]["audit_ok"] and summary["eval"]["evaluations"] == 2
    assert summary["reward"]["path"] == "laminar.rewards.math:default_score"  # the reward in use, kept
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(
        0 <= r["accuracy"] <= 1 and set(r["accuracy_by_level"]) <= {"1", "2"}
        for r in records
        if r["kind"] == "eval"
    )
    trained = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert trained and all(isinstance(t["response_text"], str) for t in trained)
    assert (tmp_path / "checkpoint" / "chat_template.jinja").exists() or (
        "chat_template" in (tmp_path / "checkpoint" / "tokenizer_config.json").read_text()
    )  # the checkpoint is a complete model directory, template included
