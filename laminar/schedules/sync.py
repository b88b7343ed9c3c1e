"""Synchronous (verl-style): every replica generates batch v with weights v; the trainer waits for the last
trajectory of the batch, trains, and pushes v+1 to every rollout before the next batch starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from laminar.config import Config
from laminar.manager.manager import Dispatch
from laminar.runtime.launch import Runtime


@dataclass
class SyncDispatch(Dispatch):
    groups_per_step: int = 1
    ahead: int = 0  # batches generated ahead of training: 0 here, 1 for one_step

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        if replica_version != trainer_version:  # the new version must be loaded first
            return 0
        batch_end = (trainer_version + 1 + self.ahead) * self.groups_per_step
        return max(0, min(self.groups_per_batch, batch_end - dispatched))


def dispatch(cfg: Config) -> Dispatch:
    per_replica = math.ceil(cfg.trainer.groups_per_step / cfg.rollout.replicas)  # spread each batch over all
    return SyncDispatch(per_replica, cfg.buffer.capacity_groups, groups_per_step=cfg.trainer.groups_per_step)


def run(rt: Runtime, steps: int, on_step) -> None:
    g = rt.cfg.trainer.groups_per_step
    for _ in range(steps):
        v = rt.version
        groups = rt.take(g, group_ids=range(v * g, (v + 1) * g))  # batch v, whole
        on_step(rt.train(groups, push=True))
