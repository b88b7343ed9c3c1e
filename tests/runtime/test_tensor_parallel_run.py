"""On the three-node test cluster: a run whose replicas are two gloo ranks each
(`rollout.tensor_parallel=2`). One run checks what a tensor-parallel replica owes the rest of the runtime: its
samples are token for token what one process samples (log-probs to 1e-5 in fp32), requests repacked between two
such replicas move with their keys and values and continue exactly, and a rank killed mid-run is the loss of its
replica: the group is replaced and its work recovered, with nothing lost. A copy of the run resumes from its
checkpoint with tensor-parallel replicas."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
import ray

from laminar.config import ConfigError
from laminar.configure import load_config
from laminar.engine import Engine, SamplingParams
from laminar.rollout.inflight import sample_seed
from laminar.runtime.factory import run_namespace
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runs import QUICK

KILL_AT = 4  # the version after which rank 1 of a replica is killed


def records_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tp_run(ray_cluster, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp-run")
    killed: dict = {}
    trained: dict = {}  # traj_id -> (prompt, response, log-probs, tokens prefilled again), as trained

    def hook(rt, m) -> None:
        for group in rt.since_checkpoint[-1]:
            for t in group:
                trained[t.traj_id] = (t.prompt_ids, t.response_ids, t.logprobs, t.reprefill_tokens)
        if m["version"] >= KILL_AT and "pid" not in killed:
            deadline = time.monotonic() + 10
            while "pid" not in killed and time.monotonic() < deadline:  # a replica with work in flight
                for rid, handle in sorted(rt.replicas.items()):
                    snap = ray.get(handle.snapshot.remote(), timeout=30)
                    if snap.inflight:
                        pids = ray.get(handle.rank_pids.remote(), timeout=30)
                        os.kill(pids[1], signal.SIGKILL)  # rank 1, not the actor the manager talks to
                        killed.update(pid=pids[1], replica=rid, inflight=set(snap.inflight), ranks=len(pids))
                        break
                time.sleep(0.005)
            deadline = time.monotonic() + 60
            while ray.get(rt.manager.report.remote())["failures"]["rollouts"] < 1:
                assert time.monotonic() < deadline, "the manager did not notice the lost rank in 60 s"
                time.sleep(0.1)

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "rollout.tensor_parallel=2",
            "rollout.replicas=2",
            "rollout.num_cpus=0.5",
            "trainer.num_cpus=1",
            "trainer.group_size=4",
            "trainer.steps=10",
            "trainer.groups_per_step=2",
            "trainer.warmup_steps=0",
            "trainer.lr=1e-12",  # every version's weights equal: any trajectory replays on one fresh engine
            "task.name=lengths",  # a group's samples share a length, groups of a batch do not: tails to repack
            "task.length_median=16",
            "task.length_p99_ratio=4",
            "rollout.max_new_tokens=60",
            "rollout.groups_per_batch=4",
            "rollout.kv_blocks=128",
            "rollout.max_num_seqs=16",
            "schedule.max_staleness=null",
            "buffer.capacity_groups=12",
            "repack.interval_s=0.02",
            "repack.batch_limit_b=64",
            "repack.kv_capacity=1.0",
            "repack.only_with_work=false",
            "repack.move_kv=true",  # moved requests take their keys and values: gathered, then split again
            "rollout.pipeline=on",  # queued decode steps on every rank, as on GPU
            "rollout.heartbeat_s=0.5",
            "rollout.dead_after_s=10",
            "run.timeout_s=120",
            *QUICK,
        ],
    )
    t0 = time.monotonic()
    summary = train(cfg, out, quiet=True, hook=hook)
    print(f"the tensor-parallel run took {time.monotonic() - t0:.1f} s")
    return {"out": out, "summary": summary, "killed": killed, "trained": trained, "cfg": cfg}


@pytest.fixture(scope="module")
def tp_resumed(tp_run, tmp_path_factory):
    """A copy of the run folder resumed from its end-of-run checkpoint (version 10) for two more steps, told not to
    checkpoint at its end: the tensor-parallel replicas start from the checkpoint's weights."""
    out = tmp_path_factory.mktemp("tp-resumed") / "run"
    shutil.copytree(tp_run["out"], out)
    overrides = ["trainer.steps=12", "trainer.checkpoint_at_end=false", "run.ray_address="]
    summary = train(load_config(out / "config.yaml", overrides), out, quiet=True, resume=True)
    return {"out": out, "summary": summary}


@pytest.mark.slow
def test_a_resumed_run_with_tensor_parallel_replicas_trains_on_and_loses_nothing(tp_resumed):
    out, summary = tp_resumed["out"], tp_resumed["summary"]
    steps = [r for r in records_of(out) if r["kind"] == "step"]
    assert [r["version"] for r in steps] == list(range(1, 13))  # 10 before the stop, 11 and 12 after
    audit = audit_run(out)
    assert audit.ok and audit.segments == 2 and not audit.lost and not audit.duplicated, audit
    assert summary["resumed_at"] == 10 and summary["trajectories"]["lost"] == 0
    # trainer.checkpoint_at_end=false: the checkpoint is still the one the run resumed from
    state = json.loads((out / "checkpoint" / "runtime_state.json").read_text())
    assert state["version"] == 10 and summary["checkpoint"] == str(out / "checkpoint")


@pytest.mark.slow
@pytest.mark.fault
def test_a_killed_rank_loses_its_replica_and_nothing_else(tp_run):
    killed, summary = tp_run["killed"], tp_run["summary"]
    assert killed.get("ranks") == 2 and killed["inflight"], killed
    f, t = summary["failures"], summary["trajectories"]
    assert f["rollouts"] == 1 and f["recovered_trajectories"] + f["restarted_trajectories"] > 0, f
    assert audit_run(tp_run["out"]).ok and t["lost"] == 0 and t["duplicated"] == 0, t
    assert summary["trainer_steps"] == 10
    records = records_of(tp_run["out"])
    replaced = [r for r in records if r["kind"] == "replacement"]
    assert [r["for"] for r in replaced] == [killed["replica"]], replaced
    # every replica's placement group went with it: the lost one's when it was replaced, the rest at the end
    namespace = run_namespace(tp_run["out"])
    groups = [g for g in ray.util.placement_group_table().values() if g["name"].startswith(namespace + "/")]
    assert len(groups) == 3 and all(g["state"] == "REMOVED" for g in groups), groups


@pytest.mark.slow
@pytest.mark.fault
def test_samples_moved_or_recovered_are_what_one_process_samples(tp_run, tiny_model_dir):
    """Every trained trajectory replayed on one fresh single-process engine: the same tokens, log-probs to 1e-5.
    Among them, trajectories repacked between the two-rank replicas with their keys and values, and trajectories
    of the replica whose rank was killed, recovered elsewhere."""
    out, cfg, trained = tp_run["out"], tp_run["cfg"], tp_run["trained"]
    moved = {tid for r in records_of(out) if r["kind"] == "repack" for tid in r["ids"]}
    assert moved & set(trained), "no repacked trajectory was trained"
    assert tp_run["killed"]["inflight"] & set(trained), "no trajectory of the lost replica was trained"
    # a move took its keys and values along: each rank of the destination got its own KV heads, nothing prefilled
    carried = [tid for tid in moved - tp_run["killed"]["inflight"] if tid in trained]
    assert carried and all(trained[tid][3] == 0 for tid in carried), [trained[tid][3] for tid in carried]
    engine = Engine.from_pretrained(tiny_model_dir, max_num_seqs=16, num_kv_blocks=256)
    for tid, (prompt, response, _, _) in trained.items():
        params = SamplingParams(
            seed=sample_seed(cfg.run.seed, tid),
            temperature=cfg.rollout.temperature,
            max_new_tokens=len(response),
            ignore_eos=True,
        )
        engine.add_request(tid, prompt, params)
    replayed = {}
    while engine.has_unfinished():
        for fin in engine.step().finished:
            replayed[fin.request_id] = (fin.output_token_ids, fin.logprobs)
    for tid, (_, response, logprobs, _) in trained.items():
        assert replayed[tid][0] == response, tid
        assert replayed[tid][1] == pytest.approx(logprobs, abs=1e-5), tid


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["rollout.tensor_parallel=0"], "rollout.tensor_parallel"),
        (["rollout.tensor_parallel=2", "rollout.num_gpus=0.5"], "rollout.num_gpus"),
        (["rollout.tensor_parallel=2", "rollout.placement=spread"], "rollout.placement"),
        (["rollout.tensor_parallel=2", "rollout.speculation=auto"], "rollout.speculation"),
        (
            ["rollout.tensor_parallel=2", "trainer.lora_rank=8", "trainer.lora_publish=adapters"],
            "trainer.lora_publish",
        ),
    ],
)
def test_a_degree_the_config_cannot_run_names_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, overrides)


def test_a_degree_that_does_not_split_the_model_names_the_field(tiny_model_dir):
    from laminar.engine.config import ModelConfig
    from laminar.preflight import check_tensor_parallel

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "rollout.tensor_parallel=3"])
    with pytest.raises(ConfigError, match="rollout.tensor_parallel=3.*num_heads=4"):
        check_tensor_parallel(ModelConfig.from_dir(tiny_model_dir), cfg)
