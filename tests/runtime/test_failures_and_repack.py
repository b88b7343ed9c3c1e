"""On tiny models: repack moves trajectories without changing them; a killed replica process, relay or
trainer rank costs nothing. (A run stopped hard and resumed is tests/runtime/test_interrupt.py's.)"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from laminar.configure import load_config
from laminar.engine import Engine, SamplingParams
from laminar.engine.weights import unflatten
from laminar.models.export import main as export_main
from laminar.relay.slots import MappedView
from laminar.rollout.inflight import sample_seed
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.fault]

BASE = [
    "trainer.group_size=4",
    "rollout.replicas=3",
    "rollout.kv_blocks=64",
    "rollout.max_num_seqs=16",
    "rollout.num_cpus=1",
    "trainer.num_cpus=1",
    "run.timeout_s=120",
    "trainer.warmup_steps=0",
    "rollout.heartbeat_s=0.5",
    "rollout.dead_after_s=10",
    *QUICK,
]


def records_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def context_segments(traj: dict) -> list[tuple[int, list[int]]]:
    """(output tokens before it, its tokens) for each run of context (a tool's output) in a trajectory."""
    mask, segments, i = traj.get("loss_mask") or [], [], 0
    while i < len(mask):
        j = i
        while j < len(mask) and mask[j] == 0:
            j += 1
        if j > i:
            segments.append((i, traj["response_ids"][i:j]))
        i = j + 1
    return segments


def _kill_a_replica_waiting_on_a_tool(rt, killed: dict) -> None:
    """Kill the first replica seen with a request parked on a tool call (polling its snapshots for up to 5 s),
    keeping the ids it had in flight, then wait until the manager has recovered its work."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for _, handle in sorted(rt.replicas.items()):
            snap = ray.get(handle.snapshot.remote(), timeout=30)
            if snap.parked:
                killed["inflight"] = set(snap.inflight)
                _kill_process(ray.get(handle.pid.remote(), timeout=30))
                _wait_for_failure(rt, "rollouts", 1)
                return
        time.sleep(0.005)


def test_repacked_and_recovered_trajectories_finish_exactly_as_if_they_had_stayed(
    ray_cluster, slower_model_dir, tmp_path
):
    # lr ~ 0 keeps every version's weights equal, so any trajectory can be replayed on one fresh engine. Tool
    # turns (scripted calls, their outputs appended as context) make some trajectories park mid-response: those
    # move too, with their turns, and replay by parking at the same token and resuming with the same output.
    # Mid-run, a replica is killed while one of its requests waits on a tool: its trajectories are recovered on
    # another replica (after the last turn the partial pool knows, the lost call run again) and replay exactly.
    tiny_model_dir = slower_model_dir
    killed: dict = {}

    def kill(rt, m) -> None:
        if m["version"] >= 8 and "inflight" not in killed:
            _kill_a_replica_waiting_on_a_tool(rt, killed)

    cfg = load_config(
        None,
        [
            *BASE,
            f"model.path={tiny_model_dir}",
            "task.name=lengths",
            "task.length_median=30",  # a group's samples share a length; groups in one batch do not: tails
            "task.length_p99_ratio=4",
            # Moves are between replicas of one version. Every replica starts with 6 groups at version 0 and
            # pulls newer weights only once drained, and any replica's work fits beside another's (64 running,
            # 256 KV blocks): the first rounds already move, every run. (Without the staleness bound, which at
            # 2 groups a step would hold the first dispatch to 10 groups and leave the third replica idle.)
            "rollout.groups_per_batch=6",
            "schedule.max_staleness=null",
            "rollout.kv_blocks=256",
            "rollout.max_new_tokens=100",
            "trainer.steps=24",
            "trainer.groups_per_step=2",
            "buffer.capacity_groups=18",
            "trainer.lr=1e-12",
            "repack.interval_s=0.02",
            "repack.batch_limit_b=64",
            "repack.kv_capacity=1.0",
            "repack.only_with_work=false",  # move whenever possible: this test checks the moves
            "repack.move_kv=true",  # moved requests take their keys and values along (none prefilled again)
            "rollout.progress_every=2",
            "task.tool_calls_mean=2",
            "task.tool_calls_min=1",  # every trajectory has a turn: every moved one carries one
            "task.tool_latency_median_s=0.02",
            "task.tool_output_tokens=4",
            # the replicas' engines pipelined, as on GPU (there by default): every move, park and kill leaves
            # a queued decode step behind; the replay below runs step by step
            "rollout.pipeline=on",
        ],
    )
    out = tmp_path / "run"
    summary = train(cfg, out, quiet=True, hook=kill)
    moves = [tid for r in records_of(out) if r["kind"] == "repack" for tid in r["ids"]]
    assert summary["repacks"]["moved"] == len(moves) > 0, summary["repacks"]  # one may move more than once
    moved = set(moves)
    assert killed.get("inflight"), "no replica was seen waiting on a tool call"
    f = summary["failures"]
    assert f["rollouts"] == 1 and f["recovered_trajectories"] + f["restarted_trajectories"] > 0, f
    t = summary["trajectories"]
    assert audit_run(out).ok and t["lost"] == 0 and t["duplicated"] == 0, t
    assert summary["decode_pipeline"]["queued_ahead_share"] > 0.3, summary["decode_pipeline"]
    trained = {}
    for r in records_of(out):
        if r["kind"] == "step":
            trained.update(r["traj_versions"])
    replayed = [tid for tid in moved | killed["inflight"] if tid in trained]
    assert moved & set(replayed), "no moved trajectory was trained"
    assert killed["inflight"] & set(replayed), "no trajectory of the killed replica was trained"
    trajs = {}
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        trajs[t["traj_id"]] = t
    segments = {tid: context_segments(trajs[tid]) for tid in replayed}
    assert any(segments[tid] for tid in moved if tid in segments), "no moved trajectory had a tool turn"
    # one of the killed replica's requests was parked on a call: it has a tool turn, recovered across the kill
    assert any(segments[tid] for tid in killed["inflight"] if tid in segments)
    engine = Engine.from_pretrained(tiny_model_dir, max_num_seqs=16, num_kv_blocks=128)
    for tid in replayed:
        t = trajs[tid]  # the lengths workload fixes each response's length and ignores end-of-sequence
        params = SamplingParams(
            seed=sample_seed(cfg.run.seed, tid),
            temperature=cfg.rollout.temperature,
            max_new_tokens=len(t["response_ids"]),
            ignore_eos=True,
        )
        engine.add_request(tid, t["prompt_ids"], params)
    out = {}
    while engine.has_unfinished():
        step = engine.step()
        for fin in step.finished:
            out[fin.request_id] = fin.output_token_ids
        for tid in step.new_tokens:  # a turn that ended where the run's did: park, append the same output
            todo = segments[tid]
            if todo and tid not in out and len(engine.progress(tid)[0]) == todo[0][0]:
                engine.park(tid)
                engine.resume(tid, todo.pop(0)[1])
    for tid in replayed:
        assert out[tid] == trajs[tid]["response_ids"], tid
        assert not segments[tid], tid


def _kill_process(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _wait_for_failure(rt, what: str, count: int, timeout_s: float = 60) -> None:
    """The test waits (bounded) until the manager has noticed, so the recovery path really runs mid-run."""
    deadline = time.monotonic() + timeout_s
    while ray.get(rt.manager.report.remote())["failures"][what] < count:
        assert time.monotonic() < deadline, f"the manager did not notice the dead {what} in {timeout_s}s"
        time.sleep(0.1)


def test_a_killed_replica_and_killed_relays_lose_nothing(ray_cluster, tiny_model_dir, tmp_path):
    killed = {}

    def hook(rt, m):
        if m["version"] == 2 and "replica" not in killed:
            victim = sorted(rt.replicas)[0]
            killed["replica"] = ray.get(rt.replicas[victim].pid.remote())
            _kill_process(killed["replica"])
            _wait_for_failure(rt, "rollouts", 1)
        if m["version"] == 4 and "relay" not in killed:
            killed["relay"] = ray.get(rt.relays[-1].ping.remote())["pid"]  # a node relay, not the master
            _kill_process(killed["relay"])
            _wait_for_failure(rt, "relays", 1)
        if m["version"] == 6 and "master" not in killed:
            killed["master"] = ray.get(rt.relays[0].ping.remote())[
                "pid"
            ]  # the master relay, beside the trainer
            _kill_process(killed["master"])
            _wait_for_failure(rt, "relays", 2)

    cfg = load_config(
        None,
        [
            *BASE,
            f"model.path={tiny_model_dir}",
            "rollout.max_new_tokens=24",
            "trainer.steps=10",
            "trainer.groups_per_step=2",
            "rollout.groups_per_batch=1",
            "buffer.capacity_groups=6",
        ],
    )
    summary = train(cfg, tmp_path, quiet=True, hook=hook)
    assert set(killed) == {"replica", "relay", "master"}
    f, t = summary["failures"], summary["trajectories"]
    assert f["rollouts"] >= 1 and f["relays"] >= 2, f
    assert t["lost"] == 0 and t["duplicated"] == 0, t
    assert summary["trainer_steps"] == 10
    assert audit_run(tmp_path).ok
    records = records_of(tmp_path)
    assert [r for r in records if r["kind"] == "step"][-1]["version"] == 10
    # versions kept arriving through the new master and the rebuilt chain
    assert max(r["version"] for r in records if r["kind"] == "pull") > 7
    # the new master was given the trainer's version at once: the dead one may have taken it along, and
    # replicas behind the trainer (`schedule.max_lag` 0) get no new work until it is out
    assert [r["why"] for r in records if r["kind"] == "republish"] == ["a new master relay"]
    # each relay's record says what became of it: both machines were alive, so both were replaced
    relays = [r for r in records if r["kind"] == "failure" and r["what"] == "relay"]
    assert len(relays) == 2 and all(r["replaced"] for r in relays), relays


def test_a_killed_trainer_restarts_from_its_checkpoint_and_catches_up(ray_cluster, tiny_model_dir, tmp_path):
    """The trainer is 2 FSDP2 ranks (gloo) on two machines (`trainer.placement=spread`): rank 1 sends its rows
    of every version to the master relay, which assembles them with rank 0's. Killing a rank takes the group
    down, and the whole group restarts from its checkpoint and replays, while the rollouts go on. (One rank
    restarts the same way; resuming a 2-rank checkpoint on 1 rank is tests/trainer/test_sharded.py's.)"""
    killed, seen = [], {}

    def hook(rt, m):
        assert rt.trainer.world == 2
        nodes = ray.get([r.node_id.remote() for r in rt.trainer.ranks], timeout=30)
        assert nodes[0] != nodes[1], "trainer.placement=spread put both ranks on one machine"
        seen["pieces"] = ray.get(rt.relays[0].stats.remote(), timeout=30)["pieces"]
        if m["version"] == 6:  # the last version as the master relay assembled it (this host's shared memory)
            master = rt.relays[0]
            assert ray.get(master.wait_version.remote(6, 30), timeout=60) == 6
            lease = ray.get(master.acquire.remote(version=6), timeout=30)
            with MappedView(lease.path, lease.nbytes) as view:
                seen["last"] = {k: v.clone() for k, v in unflatten(view.array.copy(), lease.layout).items()}
            ray.get(master.release.remote(lease.lease_id), timeout=30)
        if m["version"] == 3 and not killed:
            killed.append(rt.trainer.pids()[1])
            _kill_process(killed[0])

    cfg = load_config(
        None,
        [
            *BASE,
            f"model.path={tiny_model_dir}",
            "rollout.max_new_tokens=16",
            "trainer.steps=6",
            "trainer.groups_per_step=2",
            "rollout.groups_per_batch=1",
            "buffer.capacity_groups=6",
            "trainer.checkpoint_every=2",
            "trainer.num_workers=2",
            "trainer.placement=spread",
            "run.export=bfloat16",
            "rollout.replicas=2",  # the trainer's loss is what is checked
        ],
    )
    summary = train(cfg, tmp_path, quiet=True, hook=hook)
    assert killed and summary["failures"]["trainer"] == 1
    assert seen["pieces"] >= 1, "no version was assembled from a piece of the other machine's rank"
    # the replicas ran versions assembled from both machines' rows: the newest pulled is the run's last but one
    assert max(r["version"] for r in records_of(tmp_path) if r["kind"] == "pull") >= 5
    ckpt = tmp_path / "checkpoint"  # the ranks' rows joined into a model directory; the final export beside
    assert (ckpt / "model.safetensors.index.json").is_file(), sorted(p.name for p in ckpt.iterdir())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    whole = AutoModelForCausalLM.from_pretrained(ckpt)
    for (name, a), b in zip(hf.state_dict().items(), whole.state_dict().values()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16)), name
    # version 6, assembled from both machines' rows, is exactly the trained weights (the final checkpoint's)
    final = whole.state_dict()
    assert seen["last"].keys() <= final.keys() and len(seen["last"]) > 0
    for name, w in seen["last"].items():
        assert torch.equal(w, final[name]), name
    assert export_main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert summary["trainer_steps"] == 6
    t = summary["trajectories"]
    assert t["lost"] == 0 and t["duplicated"] == 0, t
    versions = [r["version"] for r in records_of(tmp_path) if r["kind"] == "step"]
    assert versions == [1, 2, 3, 4, 5, 6]
