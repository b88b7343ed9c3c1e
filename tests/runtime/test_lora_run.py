"""A short run with LoRA on the three-node test cluster, publishing the merged model or the adapters alone
(`trainer.lora_publish`): the replicas serve the trainer's weights (their log-probs agree with the trainer's at
the same version), the reward path scores, the loss moves, the checkpoint passes the resume's checks and exports
as a plain model, and a resumed run's replicas serve the checkpoint's weights and pass the audit."""

from __future__ import annotations

import json

import pytest
import torch

from tests.runs import QUICK
from tests.runtime.test_end_to_end import tiny_run_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["merged", "adapters"])
def lora_run(request, ray_cluster, tiny_model_dir, tmp_path_factory):
    from laminar.train import train

    out = tmp_path_factory.mktemp(f"lora-run-{request.param}")
    cfg = tiny_run_config(
        tiny_model_dir,
        out,
        *QUICK,
        "trainer.lora_rank=4",
        "trainer.lr=0.01",  # adapters that move the log-probs well past the numerical mismatch
        "schedule=sync",  # batch v on version v: every step's samples come from the trainer's own weights
        "trainer.checkpoint_every=2",
        "run.export=float32",
        f"trainer.lora_publish={request.param}",
        "rollout.replicas=2",  # what is checked is the weights the replicas serve, not how many serve
    )
    summary = train(cfg, out, quiet=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, summary, records


def test_the_replicas_serve_the_trainers_weights(lora_run):
    _, summary, records = lora_run
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and summary["pulls"] >= 1
    # from step 2 on, sampled by the replicas from the version the trainer holds (merged, or their base plus the
    # published adapters): the trainer's log-probs (adapters unmerged) agree to float precision; the base weights
    # would be ~0.04 away
    assert all(r["staleness"] == [0] * 8 for r in steps)
    assert all(r["logprob_mismatch_same_weights"] < 1e-5 for r in steps)
    assert len({round(r["loss"], 9) for r in steps}) > 1
    assert all("reward_mean" in r and r["reward_errors_in_batch"] == 0 for r in steps)
    t = summary["trajectories"]
    assert t["duplicated"] == 0 and t["lost"] == 0 and t["trained"] == 4 * 2 * 4, t  # the audit's counts
    # the reward in use and why (the demo task's own: task.reward is empty)
    assert summary["reward"]["path"] == "laminar.rewards.reverse:reverse_reward", summary["reward"]
    assert "task.reward is empty" in summary["reward"]["why"]


def test_the_checkpoint_resumes_and_exports_as_a_plain_model(lora_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from laminar.runtime.checkpoint import check_checkpoint

    out, _, _ = lora_run
    check_checkpoint(out / "checkpoint")  # what `laminar train --resume` checks first
    assert (out / "checkpoint" / "adapter" / "adapter_model.safetensors").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert sorted(exported) == sorted(base)
    assert torch.equal(exported["model.norm.weight"], base["model.norm.weight"])  # frozen, not adapted
    assert not torch.equal(
        exported["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )


# The adapters' own resume path. A merged checkpoint's model files are a whole model, which a resumed run's
# replicas load as after full fine-tuning (tests/runtime/test_interrupt.py); the trainer's side of a LoRA resume
# is tests/trainer/test_lora.py.
@pytest.mark.parametrize("lora_run", ["adapters"], indirect=True)
def test_a_resumed_run_serves_the_checkpoints_weights_and_passes_the_audit(lora_run):
    """With adapters, the resumed run's replicas load the base and add the checkpoint's adapters to it."""
    from laminar.configure import load_config
    from laminar.telemetry.audit import audit_run
    from laminar.train import train

    out, _, _ = lora_run
    cfg = load_config(out / "config.yaml", ["trainer.steps=6", "run.ray_address="])
    summary = train(cfg, out, quiet=True, resume=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps][-2:] == [5, 6]
    # step 5's samples come from the checkpoint's version, as the resumed replicas load it
    assert steps[-2]["logprob_mismatch_same_weights"] < 1e-5
    # sync after a resume as before it: each batch from the version before it (the groups the buffer held at
    # the checkpoint count toward the first batch instead of a second batch being generated beside them)
    assert all(r["staleness"] == [0] * 8 for r in steps[-2:]), [r["staleness"] for r in steps[-2:]]
    t = summary["trajectories"]
    assert t["duplicated"] == 0 and t["lost"] == 0, t
    audit = audit_run(out)
    assert audit.ok and audit.segments == 2, audit
