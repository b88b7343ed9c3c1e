"""A control actor lost mid-run (kill -9 of its process: the prompt pool, the partial response pool, the
experience buffer or the rollout manager): Ray restarts it, it replays its journal, and the run goes on to its
last step with every trajectory trained once (`laminar audit` clean), without `--resume`. The replicas keep
generating meanwhile; their calls to the lost actor are sent again to its restarted self."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from laminar.configure import load_config
from laminar.data.records import group_of
from laminar.runtime.control import process_id
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import BASE, records_of

pytestmark = [pytest.mark.slow, pytest.mark.fault]

VICTIMS = ("prompt_pool", "partial_pool", "buffer", "manager")
# One run (a run's start-up is most of its cost): each killed in turn, one a step from step 2, then all four at
# once after step 7, restarted actors lost again. By a kill after step v at most 2v + 6 groups
# (buffer.capacity_groups) can have been dispatched, so the last steps train groups handed out after each kill,
# through the restarted actors.
STEPS = 12
KILL_AT = {2 + i: (name,) for i, name in enumerate(VICTIMS)} | {7: VICTIMS}


def _config(model_dir):
    return load_config(
        None,
        [
            *BASE,
            f"model.path={model_dir}",
            f"trainer.steps={STEPS}",
            "trainer.groups_per_step=2",
            "rollout.groups_per_batch=1",
            "rollout.max_new_tokens=16",
            "buffer.capacity_groups=6",
            "rollout.replicas=2",
        ],
    )


def _kill(rt, names) -> float:
    """kill -9 of each named control actor's process; returns when (the run's clock)."""
    pids = [ray.get(getattr(rt, name).__ray_call__.remote(process_id), timeout=30) for name in names]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return time.time() - rt.recorder.t0


def test_control_actors_killed_in_turn_then_all_at_once_are_restarted_and_the_run_loses_nothing(
    ray_cluster, tiny_model_dir, tmp_path
):
    killed: dict[int, float] = {}  # version -> when its kill was done

    def hook(rt, m):
        if m["version"] in KILL_AT and m["version"] not in killed:
            killed[m["version"]] = _kill(rt, KILL_AT[m["version"]])
            # the look the run takes once a second while it waits on a batch, taken now: an actor lost twice
            # between two looks would be one restart seen
            rt.check_control()

    summary = train(_config(tiny_model_dir), tmp_path, quiet=True, hook=hook)
    assert sorted(killed) == sorted(KILL_AT)
    records = records_of(tmp_path)
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["version"] for r in steps] == list(range(1, STEPS + 1))
    trained = {group_of(t) for r in steps for t in r["traj_versions"]}
    for version in (min(KILL_AT), max(KILL_AT)):  # after the first kill, and after all four at once
        after = {
            g for r in records if r["kind"] == "dispatch" and r["t"] > killed[version] for g in r["groups"]
        }
        assert after & trained, f"nothing handed out after the kill at version {version} was trained"
    victims = [name for names in KILL_AT.values() for name in names]
    lost = sorted(r["what"] for r in records if r["kind"] == "failure")
    assert lost == sorted(victims), lost  # each restart seen once, and nothing else failed
    assert summary["failures"]["control"] == len(victims) == 8
    audit = audit_run(tmp_path)
    assert audit.ok and not audit.lost and not audit.duplicated, audit
    t = summary["trajectories"]
    assert t["trained"] == STEPS * 2 * 4 and t["lost"] == 0 and t["duplicated"] == 0, t
    assert not (tmp_path / "journal").exists(), "the journals outlived the run"
