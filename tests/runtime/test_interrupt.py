"""Ctrl-C, then `--resume`: the interrupted run writes a consistent checkpoint and exits 130; the resumed run
trains every prompt once, with the logs rewound to the checkpoint (`laminar audit` clean over both segments)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import ray

from laminar.config import load_config
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import RESUMABLE, records_of, start_until_checkpoint

pytestmark = pytest.mark.slow


def test_ctrl_c_then_resume_trains_every_prompt_once(ray_cluster, tiny_model_dir, tmp_path):
    log = open(tmp_path.parent / f"{tmp_path.name}.stderr", "w+")  # noqa: SIM115 - read at the end
    proc = start_until_checkpoint(tiny_model_dir, ray_cluster, tmp_path, stderr=log)
    try:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    log.seek(0)
    assert rc == 130, log.read()[-3000:]
    state = json.loads((tmp_path / "checkpoint" / "runtime_state.json").read_text())
    saved = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
    assert saved["version"] == state["version"], "trainer and run state of one checkpoint disagree"
    at = state["version"]
    cfg = load_config(tmp_path / "config.yaml", [f"trainer.steps={at + 4}", "run.ray_address="])
    summary = train(cfg, tmp_path, quiet=True, resume=True)
    steps = [r["version"] for r in records_of(tmp_path) if r["kind"] == "step"]
    assert steps == list(range(1, at + 5)), steps  # the logs were rewound: no step twice, none missing
    audit = audit_run(tmp_path)
    assert audit.ok and audit.segments == 2 and not audit.duplicated and not audit.lost, audit
    t = summary["trajectories"]
    assert t["trained"] == (at + 4) * 2 * 4 and t["lost"] == 0 and t["duplicated"] == 0, t


def _pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)


VICTIMS = ("buffer", "manager", "prompt_pool", "partial_pool")


def test_killed_control_actors_stop_the_run_and_resume_finishes_it(ray_cluster, tiny_model_dir, tmp_path):
    """The control plane lives on the driver's machine; if its processes are killed anyway (all four control
    actors at once here: one run covers them, the suite's time is bounded), the run stops with an error, keeps
    its last consistent checkpoint, and `--resume` trains every prompt once."""
    cfg = load_config(None, [f"model.path={tiny_model_dir}", *RESUMABLE, "trainer.steps=40"])

    def kill(rt, m) -> None:
        if m["version"] == 5:
            for name in VICTIMS:
                os.kill(_pid(getattr(rt, name)), signal.SIGKILL)

    with pytest.raises(Exception):  # noqa: B017 - whichever call meets the dead actor first
        train(cfg, tmp_path, quiet=True, hook=kill)
    at = json.loads((tmp_path / "checkpoint" / "runtime_state.json").read_text())["version"]
    assert at == 4
    again = load_config(tmp_path / "config.yaml", [f"trainer.steps={at + 4}"])
    summary = train(again, tmp_path, quiet=True, resume=True)
    steps = [r["version"] for r in records_of(tmp_path) if r["kind"] == "step"]
    assert steps == list(range(1, at + 5)), steps
    audit = audit_run(tmp_path)
    assert audit.ok and audit.segments == 2 and not audit.duplicated and not audit.lost, audit
    assert summary["trajectories"]["trained"] == (at + 4) * 2 * 4
