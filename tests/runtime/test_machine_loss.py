"""Losing a whole machine mid-run (`Cluster.remove_node`): the run goes on and every trajectory is trained once.

The control actors and the trainer live on the driver's machine; replicas are spread one per machine, so each
worker machine holds a replica and its relay. Removing the machine of the middle relay or of the tail relay
kills both; the supervisor relinks the chain at once, replaces the replica elsewhere and the run finishes with
`laminar audit` clean. The session's cluster gets a fresh worker node back afterwards."""

from __future__ import annotations

import time

import pytest
import ray

from laminar.config import load_config
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import BASE, records_of

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("which", ["middle", "tail"])
def test_losing_a_machine_loses_no_trajectory(ray_cluster, tiny_model_dir, tmp_path, which):
    head = ray.get_runtime_context().get_node_id()
    cfg = load_config(
        None,
        [
            *BASE,
            f"model.path={tiny_model_dir}",
            "rollout.placement=spread",
            "rollout.max_new_tokens=12",
            "trainer.steps=12",
            "trainer.groups_per_step=2",
            "rollout.groups_per_batch=1",
            "buffer.capacity_groups=6",
            "rollout.dead_after_s=3",
        ],
    )
    removed: list[str] = []

    def lose_a_machine(rt, m) -> None:
        if m["version"] == 4 and removed:  # hold training until the supervisor has handled the loss
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                failures = ray.get(rt.manager.report.remote(), timeout=30)["failures"]
                if failures["relays"] >= 1 and failures["rollouts"] >= 1:
                    return
                time.sleep(0.2)
            pytest.fail(f"the loss of machine {removed[0]} was not handled within 60 s: {failures}")
        if m["version"] != 3 or removed:
            return
        # The chain: the master (the driver's machine) first, then one relay per machine with replicas.
        chain = ray.get(rt.manager.placement.remote(), timeout=30)["relays"]
        workers = [n for n in chain[1:] if n != head]
        assert len(workers) == 2, f"replicas were not spread over both worker machines: {workers}"
        target = workers[0] if which == "middle" else workers[-1]
        node = next(w for w in ray_cluster.worker_nodes if w.node_id == target)
        ray_cluster.remove_node(node, allow_graceful=False)
        removed.append(target)

    try:
        summary = train(cfg, tmp_path, quiet=True, hook=lose_a_machine)
    finally:
        if removed:  # the session's other tests expect three machines
            ray_cluster.add_node(num_cpus=4, object_store_memory=96 << 20, node_ip_address="127.0.0.1")
            ray_cluster.wait_for_nodes()
    assert removed, "no machine was removed"
    records = records_of(tmp_path)
    steps = [r for r in records if r["kind"] == "step"]
    assert steps[-1]["version"] == 12
    failures = summary["failures"]
    assert failures["relays"] >= 1 and failures["rollouts"] >= 1, failures
    relay_failures = [r for r in records if r["kind"] == "failure" and r.get("what") == "relay"]
    assert any(r.get("node") == removed[0] and r.get("replaced") is False for r in relay_failures)
    # versions kept reaching the replicas after the loss
    after = [r for r in records if r["kind"] == "pull" and r["t"] > relay_failures[0]["t"]]
    assert after and max(r["version"] for r in after) > 3
    audit = audit_run(tmp_path)
    assert audit.ok and not audit.duplicated and not audit.lost, audit
    t = summary["trajectories"]
    assert t["trained"] == 12 * 2 * 4 and t["lost"] == 0 and t["duplicated"] == 0, t
