"""A whole run with a 2-rank (FSDP2, gloo) trainer on the test cluster: nothing lost or trained twice, a killed
rank restarts the whole trainer group from its checkpoint while the rollouts go on, and the 2-rank checkpoint
resumes onto one rank."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from laminar.config import load_config
from laminar.models.export import main
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_end_to_end import tiny_run_config
from tests.runtime.test_failures_and_repack import _kill_process

pytestmark = pytest.mark.slow


def test_two_trainer_ranks_train_survive_a_dead_rank_and_resume_on_one(ray_cluster, tiny_model_dir, tmp_path):
    killed = []

    def hook(rt, m):
        assert rt.trainer.world == 2
        if m["version"] == 3 and not killed:
            killed.append(rt.trainer.pids()[1])
            _kill_process(killed[0])

    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path,
        "trainer.num_workers=2",
        "trainer.checkpoint_every=2",
        "trainer.steps=4",
        "run.export=bfloat16",
    )
    summary = train(cfg, tmp_path, quiet=True, hook=hook)
    assert killed
    t = summary["trajectories"]
    assert t["trained"] == 4 * 2 * 4 and t["lost"] == 0 and t["duplicated"] == 0, t
    assert summary["failures"]["trainer"] == 1, summary["failures"]
    ckpt = tmp_path / "checkpoint"
    assert (ckpt / "model.safetensors.index.json").is_file(), sorted(p.name for p in ckpt.iterdir())
    assert (tmp_path / "model" / "model.safetensors").is_file()  # run.export=bfloat16: the final weights
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    whole = AutoModelForCausalLM.from_pretrained(ckpt)
    for (name, a), b in zip(hf.state_dict().items(), whole.state_dict().values()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16)), name
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2

    again = load_config(tmp_path / "config.yaml", ["trainer.steps=6", "trainer.num_workers=1"])
    summary = train(again, tmp_path, quiet=True, resume=True)
    audit = audit_run(tmp_path)
    assert audit.ok and audit.segments == 2 and not audit.duplicated and not audit.lost, audit
    assert summary["trajectories"]["lost"] == 0 and summary["trajectories"]["duplicated"] == 0
