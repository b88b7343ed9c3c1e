"""Stream generation (StreamRL-style): generation never stops, bounded by staleness k, and each new version is
pushed to all rollouts, which adopt it when their current trajectories end; nobody generates with an older
version once a newer one exists."""

from __future__ import annotations

from dataclasses import dataclass

from laminar.config import Config
from laminar.manager.manager import Dispatch
from laminar.runtime.launch import Runtime


@dataclass
class BoundedDispatch(Dispatch):
    """Work only on the newest version, and only as far ahead as staleness k allows: a group dispatched now is
    trained no later than k versions from now."""

    groups_per_step: int = 1
    staleness: int = 1

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        if replica_version != trainer_version:
            return 0
        bound = (trainer_version + self.staleness + 1) * self.groups_per_step
        return max(0, min(self.groups_per_batch, bound - dispatched))


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
