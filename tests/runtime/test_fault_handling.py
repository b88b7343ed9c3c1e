"""Faults absorbed or reported on the three-node test cluster: rewards that fail are scored 0 and counted, a
replica whose loop raised is replaced, replicas lost in the last step are found and their work accounted for,
replicas failing the same way or a reward failing on every answer stop the run with one line, and a run leaves no
shared memory behind."""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import subprocess
import time

import pytest
import ray
import torch
from safetensors.torch import load_file

from laminar.cli import main
from laminar.configure import load_config
from laminar.relay.slots import SHM_DIR
from laminar.train import train

pytestmark = [pytest.mark.slow, pytest.mark.fault]

MODES = ("nan", "string", "raise", "ok")
KIND_OF_MODE = {"nan": "not_finite", "string": "not_a_number", "raise": "raised"}
TINY = [
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
    "trainer.warmup_steps=0",
    "rollout.heartbeat_s=0.5",
    "run.plots=false",  # the reward-fault tests keep two reward processes: a hung call must not stall the rest
]


def strict(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def strict_lines(path):
    return [strict(line) for line in path.read_text().splitlines()]


def exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _inject_unknown_request(actor) -> None:
    """The fault: a request the replica never dispatched appears in its engine; when it finishes, the replica
    cannot place it and its loop raises (KeyError). The replacement starts clean."""
    from laminar.engine import SamplingParams

    replica = actor.replica
    params = SamplingParams(seed=0, max_new_tokens=1)
    replica.run_in_loop(lambda: replica.engine.add_request("fault:0", [1, 4, 5], params))


def wait_for_replacement(rt, timeout_s: float = 60) -> None:
    """Bounded wait until the manager has replaced the dead replica, so the run goes on past the failure."""
    deadline = time.monotonic() + timeout_s
    while ray.get(rt.manager.report.remote())["failures"]["rollouts"] < 1:
        assert time.monotonic() < deadline, f"the dead replica was not replaced within {timeout_s}s"
        time.sleep(0.1)


def test_failing_rewards_and_replicas_lost_mid_run_or_at_the_end_cost_nothing_and_leave_no_shared_memory(
    ray_cluster, tiny_model_dir, tmp_path, capsys
):
    """Replicas lost in the last step: two stop answering (SIGSTOP, as a machine that went away) right after it,
    so only the run's last look finds them; their work is recovered onto the live replica before the end."""
    digits = [
        "1 2 3",
        "4 5",
        "6 7 8 9",
        "0 1",
        "2 3 4",
        "5 6 7",
        "8 9",
        "1 1 2",
        "3 5",
        "8 1 3",
        "2 1",
        "3 4 5",
    ]
    rows = [
        {"prompt": f"{d} =", "answer": " ".join(reversed(d.split())), "mode": MODES[i % 4]}
        for i, d in enumerate(digits)
    ]
    data = write_rows(tmp_path / "modes.jsonl", rows)
    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            *TINY,
            f"model.path={tiny_model_dir}",
            f"run.out={out}",
            f"task.name={data}",
            "task.reward=tests.runtime.faulty_rewards:by_mode",
            "task.reward_fail_groups=0",  # three rows in four fail on purpose: absorbed, never a stop
            "run.timeout_s=90",
            "rollout.dead_after_s=4",  # the run's last look waits this long for the stopped replicas
            "repack.enabled=false",  # a repack move to or from a stopped replica would wait on it
        ],
    )
    stale = os.path.join(SHM_DIR, f"laminar-{exited_pid()}-0badc0de-publish-0")
    open(stale, "wb").close()  # what a killed trainer leaves behind
    seen = {}

    def hook(rt, m):
        if m["version"] == 1:
            seen["pids"] = [rt.trainer.pids()[0]] + [ray.get(r.ping.remote())["pid"] for r in rt.relays]
            seen["victim"] = victim = sorted(rt.replicas)[0]
            ray.get(rt.replicas[victim].__ray_call__.remote(_inject_unknown_request))
            wait_for_replacement(rt)
        if m["version"] == 4:  # the last step: nothing has noticed when the run ends
            live = ray.get(rt.manager.live_replicas.remote(), timeout=30)
            seen["stopped"] = sorted(live)[:2]
            seen["stopped_pids"] = [ray.get(live[r].pid.remote(), timeout=30) for r in seen["stopped"]]
            for pid in seen["stopped_pids"]:
                os.kill(pid, signal.SIGSTOP)

    try:
        summary = train(cfg, out, quiet=True, hook=hook)
    finally:
        for pid in seen.get("stopped_pids", []):
            os.kill(pid, signal.SIGKILL)
    records = strict_lines(out / "metrics.jsonl")
    assert strict((out / "summary.json").read_text()) == json.loads((out / "summary.json").read_text())

    # every reward error is logged with its row and trajectory, and is the row's kind of failure
    errors = [r for r in records if r["kind"] == "reward_error"]
    assert errors and summary["reward_errors"] == len(errors)
    for e in errors:
        assert e["error_kind"] == KIND_OF_MODE[rows[e["row"]]["mode"]], e
        assert e["traj_id"].split(":")[0].isdigit() and e["error"]
    assert sum(summary["reward_errors_by_kind"].values()) == len(errors)
    trained = strict_lines(out / "trajectories.jsonl")
    assert len(trained) == 4 * 2 * 4 and all(math.isfinite(t["reward"]) for t in trained)
    erred = {e["traj_id"] for e in errors}
    assert sum(t["traj_id"] in erred for t in trained) >= 5 * 4  # at most 3 of 8 distinct rows are "ok"
    assert all(t["reward"] == 0.0 for t in trained if t["traj_id"] in erred)
    assert summary["nonfinite_steps"] == 0

    # the broken replica was declared dead with its traceback, and replaced; the run finished
    [failure] = [r for r in records if r["kind"] == "replica_error"]
    assert failure["replica"] == seen["victim"] and failure["error"] == "KeyError: 'fault:0'"
    assert "Traceback" in failure["traceback"] and summary["replica_errors"] == 1
    assert any(r["kind"] == "replacement" and r["for"] == seen["victim"] for r in records)
    assert summary["trainer_steps"] == 4

    # the replicas stopped in the last step were found by the run's last look, counted, their work recovered
    last_step = max(r["t"] for r in records if r["kind"] == "step")
    found = [r for r in records if r["kind"] == "failure" and r["t"] > last_step]
    assert sorted(r["replica"] for r in found) == seen["stopped"] and all(
        r["what"] == "rollout" for r in found
    )
    assert {r["replica"] for r in records if r["kind"] == "recovery"} >= set(seen["stopped"])
    assert not any(r["kind"] == "replacement" and r["for"] in seen["stopped"] for r in records)
    # summary.json counts every failure record
    lost = [r.get("what") for r in records if r["kind"] == "failure"]
    f = summary["failures"]
    assert (f["rollouts"], f["relays"], f["trainer"]) == tuple(
        lost.count(w) for w in ("rollout", "relay", "trainer")
    )
    assert f["rollouts"] >= 3

    # nothing was lost or trained twice for it (the run's own audit), and the saved weights are finite
    from laminar.telemetry.audit import audit_run

    audit = audit_run(out)
    assert audit.ok and summary["trajectories"]["audit_ok"], audit
    assert summary["trajectories"]["lost"] == 0 and summary["trajectories"]["duplicated"] == 0
    weights = load_file(out / "checkpoint" / "model.safetensors")
    assert weights and all(torch.isfinite(w).all() for w in weights.values())

    # the trainer's publish slots and the relays' slots are gone with their processes' run
    for pid in seen["pids"]:
        assert glob.glob(os.path.join(SHM_DIR, f"laminar-{pid}-*")) == [], pid
    assert not os.path.exists(stale), "a dead process's slot was not swept when the run started"

    # a resume that fails after its checks (here: another dataset) is one line and leaves config.yaml alone
    config_before = (out / "config.yaml").read_bytes()
    other = write_rows(tmp_path / "other.jsonl", rows[:5])
    capsys.readouterr()
    code = main(["train", "--resume", str(out), f"task.name={other}"])
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("laminar train: ")]
    assert code == 1 and len(ours) == 1, ours
    assert "checkpoint was taken over 12 rows, this dataset has 5" in ours[0]
    assert (out / "config.yaml").read_bytes() == config_before


def test_replicas_failing_the_same_way_stop_the_run_in_seconds_with_one_line(
    ray_cluster, tiny_model_dir, tmp_path, capsys
):
    # Rows the driver accepts but every replica fails on: a row's own sampling the engine refuses.
    bad = {"prompt": "1 2 =", "answer": "2 1", "sampling": {"top_p": 5.0}}
    data = write_rows(tmp_path / "bad-sampling.jsonl", [bad] * 4)
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = main(
        [
            "train",
            *TINY,
            f"model.path={tiny_model_dir}",
            f"task.name={data}",
            "run.timeout_s=120",
            f"--out={out}",
        ]
    )
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err.splitlines()
    ours = [line for line in err if line.startswith("laminar train: ")]  # Ray's worker logs interleave
    assert code == 1 and len(ours) == 1, err
    assert ours[0].startswith(
        "laminar train: rollout replicas failed 3 times in a row with the same error"
    ), err
    assert "top_p=5.0" in ours[0] and f"traceback in {out / 'error.log'}" in ours[0]
    # a dead loop nobody noticed would leave the trainer waiting out the buffer's 120 s timeout after the start
    assert elapsed < 120, f"took {elapsed:.0f}s: the run waited out the experience buffer's timeout"
    failures = [r for r in strict_lines(out / "metrics.jsonl") if r["kind"] == "replica_error"]
    assert len(failures) >= 3 and all("Traceback" in r["traceback"] for r in failures)
    assert "RolloutFailure" in (out / "error.log").read_text()


def test_a_reward_failing_on_every_answer_stops_the_run_in_seconds_with_one_line(
    ray_cluster, tiny_model_dir, tmp_path, capsys
):
    """The reward works on the right answer (so the dry run before the start, which passes the ground truth,
    finds nothing) and fails on every other one: raises on half the rows, NaN on the rest. The tiny model never
    writes the right answer (it is not in its vocabulary)."""
    rows = [
        {"prompt": f"{d} 1 =", "answer": "never \u2713", "mode": ("raise", "nan")[d % 2]} for d in range(8)
    ]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = main(
        [
            "train",
            *TINY,
            "rollout.replicas=1",
            "trainer.steps=40",
            f"model.path={tiny_model_dir}",
            f"task.name={data}",
            "task.reward=tests.runtime.faulty_rewards:right_or_fails",
            "task.reward_fail_groups=4",
            "run.timeout_s=120",
            f"--out={out}",
        ]
    )
    elapsed = time.monotonic() - t0
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("laminar train: ")]
    assert code == 1 and len(ours) == 1, ours
    assert ours[0].startswith(
        "laminar train: every reward of the last 4 groups failed (task.reward_fail_groups=4); the last: reward "
        "function tests.runtime.faulty_rewards:right_or_fails on row "
    ), ours
    assert "RuntimeError: cannot parse the answer" in ours[0] or "returned nan" in ours[0], ours
    steps = [r for r in strict_lines(out / "metrics.jsonl") if r["kind"] == "step"]
    assert len(steps) == 1, "two groups a step: the second batch taken makes four failing groups"
    assert elapsed < 120, f"took {elapsed:.0f}s"
    assert "RewardFailure" in (out / "error.log").read_text()


def test_an_error_raised_in_an_actor_task_is_shown_as_its_own_one_line_message(ray_cluster):
    from laminar.telemetry.console import one_line
    from laminar.trainer.finite import NonFiniteError

    @ray.remote(num_cpus=0)
    def step():
        raise NonFiniteError("3 trainer steps in a row had a non-finite loss\nmore detail")

    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(step.remote(), timeout=60)
    assert "ray::step()" in str(raised.value).splitlines()[0]  # what a person would otherwise read first
    assert one_line(raised.value) == "3 trainer steps in a row had a non-finite loss"


def test_an_actor_that_died_in_its_constructor_is_shown_as_the_error_that_killed_it(ray_cluster):
    from laminar.telemetry.console import one_line

    @ray.remote(num_cpus=0)
    class Broken:
        def __init__(self):
            raise ValueError("/ckpt/model.safetensors: the weights do not load (header too short)")

        def ping(self):
            return 1

    with pytest.raises(ray.exceptions.RayActorError) as raised:
        ray.get(Broken.remote().ping.remote(), timeout=60)
    assert "ValueError" not in str(raised.value).splitlines()[0]  # Ray's own first line says only "died"
    assert (
        one_line(raised.value)
        == "ValueError: /ckpt/model.safetensors: the weights do not load (header too short)"
    )
