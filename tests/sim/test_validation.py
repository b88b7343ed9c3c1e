"""The small GPU schedule benchmark's configuration runs to completion with the schedules' ordering
invariants (timings are checked by `laminar simulate --validate`, not here)."""

from __future__ import annotations

import pytest

from laminar.sim.run import simulate
from laminar.sim.validation import small_gpu_config

MAX_STALENESS = {"sync": 0, "one_step": 1, "stream": 2, "partial": 2, "laminar": 4, "laminar_no_repack": 4}


@pytest.mark.parametrize("schedule", list(MAX_STALENESS))
def test_small_gpu_setup_completes_with_invariants(schedule: str) -> None:
    cfg = small_gpu_config(schedule=schedule)
    assert (cfg.trainer_gpus, cfg.rollout_replicas) == (1, 3)
    summary, cluster = simulate(cfg, audit=True)
    assert cluster.versions_seen == list(range(1, cfg.steps + 1))
    assert all(n == 1 for n in cluster.finish_count.values())
    assert all(n == 1 for n in cluster.consume_count.values())
    assert set(cluster.consume_count) <= set(cluster.finish_count)
    assert len(cluster.consume_count) == cfg.steps * cfg.groups_per_step * cfg.group_size
    assert summary["staleness"]["max"] <= MAX_STALENESS[schedule]
    assert summary["dropped_over_stale"] == 0
    step_end = cluster.record.step_end
    assert step_end == sorted(step_end)
    if schedule in ("sync", "one_step"):  # they train the pool's groups in order: the measured run's tokens
        assert sum(cluster.record.step_tokens) == 164_624
