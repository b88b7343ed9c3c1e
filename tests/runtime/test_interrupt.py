"""Ctrl-C, then `--resume`: the interrupted run writes a consistent checkpoint and exits 130; the resumed run
trains every prompt once, with the logs rewound to the checkpoint (`laminar audit` clean over both segments)."""

from __future__ import annotations

import json
import signal

import pytest

from laminar.configure import load_config
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import records_of, start_until_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.fault]


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
