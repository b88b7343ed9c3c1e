"""Losing a whole machine mid-run (`Cluster.remove_node`): the run goes on and every trajectory is trained once.

The control actors and the trainer live on the driver's machine; replicas are spread one per machine, so each
worker machine holds a replica and its relay. Removing the machine of the middle relay, then that of the tail
relay, kills both each time; the supervisor relinks the chain at once, replaces the replicas elsewhere and the
run finishes with `laminar audit` clean. The session's cluster gets fresh worker nodes back afterwards."""

from __future__ import annotations

import time

import pytest
import ray

from laminar.configure import load_config
from laminar.telemetry.audit import audit_run
from laminar.train import train
from tests.runtime.test_failures_and_repack import BASE, records_of

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _wait_handled(rt, relays: int, rollouts: int, what: str) -> None:
    """Hold training until the supervisor has handled the loss (bounded)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        failures = ray.get(rt.manager.report.remote(), timeout=30)["failures"]
        if failures["relays"] >= relays and failures["rollouts"] >= rollouts:
            return
        time.sleep(0.2)
    pytest.fail(f"the loss of {what} was not handled within 60 s: {failures}")


def test_losing_machines_loses_no_trajectory(ray_cluster, tiny_model_dir, tmp_path):
    """The middle relay's machine goes at version 3; the other worker machine, the chain's tail by then, at
    version 6 (one run covers both cases: the suite's time is bounded)."""
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

    def remove(node_id: str) -> None:
        node = next(w for w in ray_cluster.worker_nodes if w.node_id == node_id)
        ray_cluster.remove_node(node, allow_graceful=False)
        removed.append(node_id)

    def lose_machines(rt, m) -> None:
        # The chain: the master (the driver's machine) first, then one relay per machine with replicas.
        if m["version"] == 3 and not removed:
            chain = ray.get(rt.manager.placement.remote(), timeout=30)["relays"]
            workers = [n for n in chain[1:] if n != head]
            assert len(workers) == 2, f"replicas were not spread over both worker machines: {workers}"
            remove(workers[0])  # the middle of master -> first worker -> second worker
        elif m["version"] == 4 and len(removed) == 1:
            _wait_handled(rt, 1, 1, f"machine {removed[0]}")
        elif m["version"] == 6 and len(removed) == 1:
            chain = ray.get(rt.manager.placement.remote(), timeout=30)["relays"]
            workers = [n for n in chain[1:] if n != head]
            assert workers and workers[-1] not in removed, chain
            remove(workers[-1])  # the tail now
        elif m["version"] == 7 and len(removed) == 2:
            _wait_handled(rt, 2, 2, f"machine {removed[1]}")

    try:
        summary = train(cfg, tmp_path, quiet=True, hook=lose_machines)
    finally:
        for _ in removed:  # the session's other tests expect three machines
            ray_cluster.add_node(num_cpus=4, object_store_memory=96 << 20, node_ip_address="127.0.0.1")
        if removed:
            ray_cluster.wait_for_nodes()
    assert len(removed) == 2, f"machines removed: {removed}"
    records = records_of(tmp_path)
    steps = [r for r in records if r["kind"] == "step"]
    assert steps[-1]["version"] == 12
    failures = summary["failures"]
    assert failures["relays"] >= 2 and failures["rollouts"] >= 2, failures
    relay_failures = [r for r in records if r["kind"] == "failure" and r.get("what") == "relay"]
    for node in removed:
        assert any(r.get("node") == node and r.get("replaced") is False for r in relay_failures), node
    # versions kept reaching the replicas after each loss
    for failure, newer_than in ((relay_failures[0], 3), (relay_failures[-1], 6)):
        after = [r["version"] for r in records if r["kind"] == "pull" and r["t"] > failure["t"]]
        assert after and max(after) > newer_than, (failure, after)
    audit = audit_run(tmp_path)
    assert audit.ok and not audit.duplicated and not audit.lost, audit
    t = summary["trajectories"]
    assert t["trained"] == 12 * 2 * 4 and t["lost"] == 0 and t["duplicated"] == 0, t
