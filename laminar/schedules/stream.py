"""Stream generation (StreamRL-style): generation never stops, bounded by staleness k, and each new version is
pushed to all rollouts, which adopt it when their current trajectories end; nobody generates with an older
version once a newer one exists."""

from __future__ import annotations

from laminar.config import Config
from laminar.manager.dispatch import BoundedDispatch, Dispatch
from laminar.runtime.launch import Runtime


def dispatch(cfg: Config) -> Dispatch:
    return BoundedDispatch(
        cfg.rollout.groups_per_batch,
        cfg.buffer.capacity_groups,
        groups_per_step=cfg.trainer.groups_per_step,
        staleness=cfg.schedule.staleness,
    )


def run(rt: Runtime, steps: int, on_step) -> None:
    g = rt.cfg.trainer.groups_per_step
    for _ in range(steps):
        v = rt.version  # in dispatch order: what the staleness bound was computed for (waits for stragglers)
        groups = rt.take(g, group_ids=range(v * g, (v + 1) * g))
        on_step(rt.train(groups, push=True))
