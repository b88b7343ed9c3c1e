"""A short run with the trainer options on (KL reference, two mini-batches, dynamic sampling) on the three-node
test cluster: what each reports, the audit still accounts for every trajectory, and TensorBoard's event files
hold the step records' numbers; the samples of each step as text."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from laminar.telemetry.audit import audit_run
from tests.runs import QUICK
from tests.runtime.test_end_to_end import tiny_run_config
from tests.telemetry.test_samples import SAMPLE_FIELDS, read_texts
from tests.telemetry.test_tracking import read_scalars

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def options_run(ray_cluster, tiny_model_dir, tmp_path_factory):
    from laminar.train import train

    out = tmp_path_factory.mktemp("options-run")
    cfg = tiny_run_config(
        tiny_model_dir,
        out,
        *QUICK,
        "trainer.kl_coef=0.05",
        "trainer.mini_batches=2",
        "trainer.filter_groups=true",
        "task.reward=tests.runtime.uneven_rewards:odd_first_digit_scores_zero",
        "run.samples_every=1",
        "run.samples_per_step=3",
    )
    summary = train(cfg, out, quiet=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return out, summary, records, trajectories


def test_two_updates_a_step_one_publish_and_the_kl_is_reported(options_run):
    _, summary, records, _ = options_run
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["updates"] == 2 and r["kl"] >= 0 for r in steps)
    assert summary["publishes"] == summary["trainer_steps"] == 4  # versions advance once a step


def test_groups_without_a_signal_are_set_aside_counted_and_audited(options_run):
    out, summary, records, trajectories = options_run
    rewards = defaultdict(list)  # (step, group, set aside) -> rewards
    for row in trajectories:
        rewards[(row["trained_at"], row["traj_id"].split(":")[0], bool(row.get("filtered")))].append(
            row["reward"]
        )
    short = {r["step"] for r in records if r["kind"] == "filter_short"}
    for (step, group, aside), values in rewards.items():
        if aside:
            assert len(set(values)) == 1, (step, group, values)
        elif step not in short:  # a step filled with groups that carry a signal
            assert len(set(values)) > 1, (step, group, values)
    steps = [r for r in records if r["kind"] == "step"]
    dropped = sum(r["filtered_groups"] for r in steps)
    assert dropped >= 1  # the seeded prompt order has odd first digits among the first groups
    assert dropped == sum(len(r["filtered_ids"]) for r in steps) // 4
    audit = audit_run(out)
    assert audit.ok, audit.problems
    assert summary["filtered_groups"] == audit.filtered_groups == dropped
    assert summary["trajectories"]["filtered"] == 4 * dropped and summary["trajectories"]["lost"] == 0


def test_tensorboard_holds_the_step_records_numbers_and_the_start_up_is_logged(options_run):
    out, _, records, _ = options_run
    got = read_scalars(out / "tensorboard")
    steps = [r for r in records if r["kind"] == "step"]
    for key in ("reward_mean", "loss", "kl", "updates", "filtered_groups", "grad_norm", "tokens"):
        want = [(r["step"], pytest.approx(float(r[key]), rel=1e-6, abs=1e-7)) for r in steps]
        assert got[f"step/{key}"] == want, key
    numeric = {k for r in steps for k, v in r.items() if isinstance(v, int | float) and k != "t"}
    assert {f"step/{k}" for k in numeric} <= set(got)
    phases = [r for r in records if r["kind"] == "phase"]
    assert [r["t"] for r in phases] == sorted(r["t"] for r in phases)
    text = " | ".join(r["what"] for r in phases)
    for what in ("starting Ray", "starting the trainer", "KL reference", "3 rollout replicas", "first step"):
        assert what in text, text


def test_each_step_writes_its_samples_as_text_to_the_run_folder_and_tensorboard(options_run):
    out, _, _, trajectories = options_run
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [s for s in (1, 2, 3, 4) for _ in range(3)]  # every step, 3 each
    trained = {(r["trained_at"], r["traj_id"]): r for r in trajectories if not r.get("filtered")}
    for row in samples:
        assert set(row) == SAMPLE_FIELDS and row["prompt_text"]
        saved = trained[(row["step"], row["traj_id"])]  # a trajectory the step trained on
        for key in ("version", "replica", "reward", "finish_reason", "response_text"):
            assert row[key] == saved[key], key
    shown = [step for tag, texts in read_texts(out / "tensorboard").items() for step, _ in texts]
    assert shown == [1, 2, 3, 4]
