"""A whole run on the three-node test cluster: the invariants of trajectory-level asynchrony; and, on the same
run, the trainer options (KL reference, two mini-batches, dynamic sampling): what each reports, the audit still
accounts for every trajectory, TensorBoard's event files hold the step records' numbers, and the samples of each
step are kept as text. One run for both: a run's start-up (a dozen processes) is most of its cost."""

from __future__ import annotations

import json
import shutil
import sys
from collections import defaultdict

import pytest
import ray

from laminar.configure import load_config
from laminar.runtime.lifetime import CONTROL
from laminar.telemetry.audit import audit_run
from laminar.telemetry.provenance import code_digest
from laminar.train import train
from tests.telemetry.test_samples import SAMPLE_FIELDS, read_texts
from tests.telemetry.test_tracking import read_scalars

pytestmark = pytest.mark.slow


def tiny_run_config(model_dir, out, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"run.out={out}",
            "trainer.steps=4",
            "trainer.groups_per_step=2",
            "trainer.group_size=4",
            "rollout.replicas=3",
            "rollout.groups_per_batch=1",
            "rollout.max_new_tokens=12",
            "rollout.kv_blocks=64",
            "rollout.max_num_seqs=16",
            "rollout.num_cpus=1",
            "trainer.num_cpus=1",
            "buffer.capacity_groups=6",
            "run.timeout_s=90",
            "trainer.warmup_steps=0",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def laminar_run(ray_cluster, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = tiny_run_config(
        tiny_model_dir,
        out,
        # held-out evaluation on: at the start and every 2 steps, by the same replicas, while training goes on
        "eval.every=2",
        "eval.num_prompts=6",
        "eval.targets=[0.0, 1.1]",
        # the trainer options, and a reward that gives half of the prompts no signal (dynamic sampling's case)
        "trainer.kl_coef=0.05",
        "trainer.mini_batches=2",
        "trainer.filter_groups=true",
        # a step filled with groups that carry a signal however many it takes (a third of the groups of this
        # run do; a step short of them would train fewer than the 8 trajectories the invariants above count)
        "trainer.filter_take_limit=25",
        "task.reward=tests.runtime.uneven_rewards:odd_first_digit_scores_zero",
        "run.samples_every=1",
        "run.samples_per_step=3",
        "task.reward_processes=1",  # the plots stay on: this run checks them
    )
    torch_in: dict[str, bool] = {}
    transformers_in: dict[str, bool] = {}

    def look(
        rt, m
    ) -> None:  # which processes hold torch (and replicas, transformers), midway through the run
        if m["version"] == 2:
            actors = {name: getattr(rt, name) for name in CONTROL} | {
                f"relay {i}": r for i, r in enumerate(rt.relays)
            }
            # a lambda travels by value: a function of this module would import the module, and torch with it
            probe = [a.__ray_call__.remote(lambda _: "torch" in sys.modules) for a in actors.values()]
            torch_in.update(zip(actors, ray.get(probe, timeout=30)))
            without = {name: getattr(rt, name) for name in CONTROL} | dict(rt.replicas)
            probe = [a.__ray_call__.remote(lambda _: "transformers" in sys.modules) for a in without.values()]
            transformers_in.update(zip(without, ray.get(probe, timeout=30)))

    summary = train(cfg, out, hook=look)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, summary, records, torch_in, transformers_in


@pytest.fixture(scope="module")
def trajectories(laminar_run):
    return [json.loads(line) for line in (laminar_run[0] / "trajectories.jsonl").read_text().splitlines()]


def test_the_control_actors_and_relays_never_load_torch(laminar_run):
    """They move records and bytes: torch (a second of CPU and 300 MB each) is for the trainer and replicas."""
    torch_in = laminar_run[3]
    assert len(torch_in) >= len(CONTROL) + 2, (
        torch_in
    )  # the master relay and one on each machine with replicas
    assert not any(torch_in.values()), torch_in


def test_the_replicas_and_control_actors_run_without_transformers(laminar_run):
    """A replica reads its responses through the tokenizer's own decoding state (`TaskCodec.plain_decoder`), the
    prompt pool encodes prompts through its encoding state (`TaskCodec.plain_prompt_encoder`): transformers (a
    CPU-second or more of imports a process) is for the driver and the trainer. (A run with tool turns: the
    schedules' `sync` test.)"""
    transformers_in = laminar_run[4]
    assert set(CONTROL) < set(transformers_in) and not any(transformers_in.values()), transformers_in


def test_run_folder_has_everything(laminar_run):
    out, summary, _ = laminar_run[:3]
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "reward.png",
        "throughput.png",
        "staleness.png",
        "replicas.png",
        "eval.png",
        "checkpoint/config.json",
        "checkpoint/trainer_state.safetensors",
        "checkpoint/trainer_state.json",
        "checkpoint/runtime_state.json",
    ):
        assert (out / name).exists(), name
    assert summary["code"] == code_digest()  # which source ran
    for key in (
        "schedule",
        "wall_s",
        "trainer_steps",
        "trained_tokens",
        "train_tokens_per_s",
        "gen_tokens_per_s",
        "reward_start",
        "reward_end",
        "staleness",
        "publishes",
        "actor_stall_s",
        "relay_propagation_s",
        "pulls",
        "trajectories",
    ):
        assert key in summary, key
    assert summary["trainer_steps"] == 4 and summary["publishes"] == 4
    # the reward in use and why (task.reward's; a built-in task's own is tests/runtime/test_lora_run.py's)
    assert summary["reward"]["path"] == "tests.runtime.uneven_rewards:odd_first_digit_scores_zero"
    assert summary["reward"]["why"] == "task.reward", summary["reward"]


def test_every_trajectory_has_one_version_and_nothing_is_lost_or_trained_twice(laminar_run):
    _, summary, records = laminar_run[:3]
    steps = [r for r in records if r["kind"] == "step"]
    trained = [tid for r in steps for tid in r["traj_versions"]]
    # 2 groups of 4 a step; with dynamic sampling a step short of groups with a signal trains fewer
    # (`filter_short`), never more
    short = {r["step"] for r in records if r["kind"] == "filter_short"}
    assert len(trained) == len(set(trained)) == sum(r["trajectories"] for r in steps)
    assert all(r["trajectories"] == 8 or r["step"] in short for r in steps)
    for r in steps:
        for tid, versions in r["traj_versions"].items():
            assert len(versions) == 1, (tid, versions)
    t = summary["trajectories"]
    assert t["lost"] == 0 and t["duplicated"] == 0 and t["trained"] == len(trained)


def test_versions_on_each_replica_never_go_back_and_staleness_is_recorded(laminar_run):
    _, summary, records = laminar_run[:3]
    seen = defaultdict(list)
    for r in records:
        if r["kind"] == "replica":
            seen[r["replica"]].append(r["version"])
    assert len(seen) == 3
    for versions in seen.values():
        assert versions == sorted(versions)
    steps = [r for r in records if r["kind"] == "step"]
    assert all(len(r["staleness"]) == r["trajectories"] and min(r["staleness"]) >= 0 for r in steps)
    assert summary["staleness"]["max"] >= 0 and "p99" in summary["staleness"]
    # weights did travel: replicas pulled newer versions from their relays
    assert summary["pulls"] >= 1


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.fault
@pytest.mark.parametrize("victim", ["runtime_state.json", "trainer_state.safetensors"])
def test_resume_from_a_checkpoint_file_replaced_by_a_pickle_runs_nothing(
    laminar_run, tmp_path, victim, capsys
):
    import pickle
    import shutil

    from laminar.train import main

    out, _, _ = laminar_run[:3]
    run = tmp_path / "run"
    shutil.copytree(out, run)
    config_before = (run / "config.yaml").read_text()
    marker = tmp_path / "pwned"
    (run / "checkpoint" / victim).write_bytes(pickle.dumps(_RunsCode(marker)))
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and victim in err[0], err
    assert not marker.exists()
    assert (run / "config.yaml").read_text() == config_before


def _edit_state(edit):
    def tamper(ckpt):
        state = json.loads((ckpt / "runtime_state.json").read_text())
        edit(state)
        (ckpt / "runtime_state.json").write_text(json.dumps(state))

    return tamper


def _narrow(ckpt):
    from safetensors.torch import load_file, save_file

    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][
        :, :16
    ].clone()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


TAMPERED = {  # what was done to the checkpoint, and what the one line says
    "next_group_id": (
        _edit_state(lambda s: s["prompt_pool"].update(next_group_id=10**18)),
        "runtime_state.json: prompt_pool.next_group_id=1000000000000000000 is invalid: epoch x num_rows + "
        "cursor = ",
    ),
    "epoch_and_next_group_id": (  # consistent with each other, past every group the checkpoint names
        _edit_state(
            lambda s: s["prompt_pool"].update(
                epoch=10**15, next_group_id=10**15 * s["prompt_pool"]["num_rows"] + s["prompt_pool"]["cursor"]
            )
        ),
        "is invalid: at most ",
    ),
    "trained_id_never_issued": (
        _edit_state(lambda s: s["trained_ids"].append("99999:0")),
        "runtime_state.json: trained_ids[]='99999:0' is invalid: a group issued: an id below "
        "prompt_pool.next_group_id = ",
    ),
    "negative_version": (
        _edit_state(lambda s: s.update(version=-5)),
        "runtime_state.json: version=-5 is invalid: a non-negative integer, the trainer's version "
        "(trainer_state.json: 4)",
    ),
    "string_version": (
        _edit_state(lambda s: s.update(version="4")),
        "runtime_state.json: version='4' is invalid",
    ),
    "no_weights": (
        lambda ckpt: (ckpt / "model.safetensors").unlink(),
        "model.safetensors: missing; expected the trainer's weights (safetensors) of a Laminar checkpoint",
    ),
    "no_optimizer": (
        lambda ckpt: shutil.rmtree(ckpt / "optimizer"),
        "optimizer: missing; expected the optimizer's moments (safetensors) of a Laminar checkpoint",
    ),
    "wrong_shape": (
        _narrow,
        "model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape [96, 16]; ",
    ),
}


@pytest.mark.fault
@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_checkpoint_is_one_line_before_anything_starts(
    laminar_run, tmp_path, case, capsys, monkeypatch
):
    from laminar.train import main

    def started(*args, **kwargs):
        raise AssertionError("the resumed run started")

    monkeypatch.setattr("laminar.train.train", started)
    out, _, _ = laminar_run[:3]
    run = tmp_path / "run"
    shutil.copytree(out, run)
    metrics = (run / "metrics.jsonl").read_bytes()
    tamper, says = TAMPERED[case]
    tamper(run / "checkpoint")
    capsys.readouterr()
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"laminar train: cannot resume: {run / 'checkpoint'}/"), err
    assert says in err[0], err
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_laminar_audit_passes_on_the_run_and_agrees_with_the_summary(laminar_run, capsys):
    from laminar.cli import main
    from laminar.telemetry.audit import audit_run

    out, summary, records = laminar_run[:3]
    assert [r["kind"] for r in records if r["kind"] in ("segment", "end")] == ["segment", "end"]
    assert main(["audit", str(out)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.strip().endswith("ok")
    audit = audit_run(out)
    t = summary["trajectories"]
    trained = sum(r["trajectories"] for r in records if r["kind"] == "step")
    assert audit.ok and t["audit_ok"] and audit.trained == t["trained"] == trained
    assert (t["lost"], t["duplicated"]) == (audit.counts()["lost"], audit.counts()["duplicated"]) == (0, 0)


def test_held_out_evaluation_runs_beside_training_and_is_never_trained_on(laminar_run):
    out, summary, records = laminar_run[:3]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["version"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert r["prompts"] == 6 and r["samples"] == 6 and 0.0 <= r["accuracy"] <= 1.0
        assert min(r["generated_at"]) >= r["version"]  # by weights at least as new as the evaluated ones
        assert r["truncated_frac"] <= 1.0 and r["response_len_mean"] > 0
    trained = [json.loads(line)["group_id"] for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trained and min(trained) >= 0  # evaluation groups (negative ids) never reach the trainer
    e = summary["eval"]
    assert e["evaluations"] == 3 and e["first"]["version"] == 0 and e["last"]["version"] == 4
    assert e["time_to_target"]["0.0"] == {"version": 0, "wall_s": evals[0]["t_version"]}
    assert e["time_to_target"]["1.1"] is None  # never reached: said so, not invented
    assert summary["trajectories"]["audit_ok"]


def test_two_updates_a_step_one_publish_and_the_kl_is_reported(laminar_run):
    _, summary, records = laminar_run[:3]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["updates"] == 2 and r["kl"] >= 0 for r in steps)
    assert summary["publishes"] == summary["trainer_steps"] == 4  # versions advance once a step


def test_groups_without_a_signal_are_set_aside_counted_and_audited(laminar_run, trajectories):
    out, summary, records = laminar_run[:3]
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


def test_tensorboard_holds_the_step_records_numbers_and_the_start_up_is_logged(laminar_run):
    out, records = laminar_run[0], laminar_run[2]
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


def test_each_step_writes_its_samples_as_text_to_the_run_folder_and_tensorboard(laminar_run, trajectories):
    out = laminar_run[0]
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
