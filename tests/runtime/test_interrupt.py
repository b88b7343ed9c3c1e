"""Ctrl-C, then `--resume`, then kill -9, then `--resume` again: the interrupted run writes a consistent checkpoint
and exits 130; the run resumed from it and stopped hard leaves its last checkpoint; the run resumed from that
trains every prompt once, with the logs rewound to the checkpoint (`laminar audit` clean over the three
segments). One chain of runs for both stops: a run's start-up is most of its cost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from laminar.configure import load_config
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import BASE, records_of

pytestmark = [pytest.mark.slow, pytest.mark.fault]

# A run that checkpoints every second step: what the test starts, stops and resumes.
RESUMABLE = [
    "rollout.max_new_tokens=16",
    "trainer.groups_per_step=2",
    "rollout.groups_per_batch=1",
    "buffer.capacity_groups=6",
    "trainer.checkpoint_every=2",
    *BASE,
    "rollout.replicas=2",
]


def checkpointed_version(out) -> int:
    """The version of the run folder's checkpoint; -1 while there is none (or it is being written)."""
    try:
        return json.loads((out / "checkpoint" / "runtime_state.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return -1


def start_until_checkpoint(model_dir, cluster, out, stderr, past: int = 0) -> subprocess.Popen:
    """`laminar train` (40 steps) in a child process, or with `past` `laminar train --resume` of the run in `out`,
    returned once it has trained 3 steps past `past` and checkpointed past it. A shell's background job ignores
    SIGINT and a child inherits that: the child gets Ctrl-C's meaning back."""
    cmd = [sys.executable, "-m", "laminar.cli", "train"]
    if past:
        cmd += ["--resume", str(out)]  # its config.yaml names the steps and the cluster
    else:
        cmd += [
            f"model.path={model_dir}",
            *RESUMABLE,
            "trainer.steps=40",
            f"run.ray_address={cluster.address}",
        ]
        cmd += ["--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        steps = (
            [r for r in records_of(out) if r["kind"] == "step"] if (out / "metrics.jsonl").exists() else []
        )
        if len(steps) >= past + 3 and checkpointed_version(out) > past:
            return proc
        if proc.poll() is not None:
            pytest.fail(f"the run ended early (exit {proc.returncode})")
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the run made no checkpoint in time")


def stop(proc: subprocess.Popen, sig: int) -> int:
    try:
        proc.send_signal(sig)
        return proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_ctrl_c_and_kill_9_then_resume_train_every_prompt_once(ray_cluster, tiny_model_dir, tmp_path):
    log = open(tmp_path.parent / f"{tmp_path.name}.stderr", "w+")  # noqa: SIM115 - read at the end
    proc = start_until_checkpoint(tiny_model_dir, ray_cluster, tmp_path, log)
    rc = stop(proc, signal.SIGINT)  # what Ctrl-C sends
    log.seek(0)
    assert rc == 130, log.read()[-3000:]
    state = json.loads((tmp_path / "checkpoint" / "runtime_state.json").read_text())
    saved = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
    assert saved["version"] == state["version"], "trainer and run state of one checkpoint disagree"

    # resumed from Ctrl-C's checkpoint, then stopped hard past its own next checkpoint
    proc = start_until_checkpoint(tiny_model_dir, ray_cluster, tmp_path, log, past=state["version"])
    stop(proc, signal.SIGKILL)
    state = json.loads((tmp_path / "checkpoint" / "runtime_state.json").read_text())
    before = set(state["trained_ids"])
    at = state["version"]

    cfg = load_config(tmp_path / "config.yaml", [f"trainer.steps={at + 4}", "run.ray_address="])
    summary = train(cfg, tmp_path, quiet=True, resume=True)
    steps = [r for r in records_of(tmp_path) if r["kind"] == "step"]
    assert [r["version"] for r in steps] == list(range(1, at + 5))  # the logs were rewound: no step twice
    after = [tid for r in steps[at:] for tid in r["traj_versions"]]
    assert len(after) == len(set(after)) == 4 * 2 * 4
    assert not before & set(after), "a trajectory trained before the stop was trained again"
    groups = [tid.split(":")[0] for tid in [*before, *after]]
    assert len(set(groups)) == (at + 4) * 2, "every step trains groups no other step trained"
    audit = audit_run(tmp_path)
    assert audit.ok and audit.segments == 3 and not audit.duplicated and not audit.lost, audit
    t = summary["trajectories"]
    assert t["duplicated"] == 0 and t["lost"] == 0, t
    assert t["trained"] == len(before) + len(after) == (at + 4) * 2 * 4, "the count covers every segment"
