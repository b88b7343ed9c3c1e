"""One-step off-policy: batch v+1 is generated with weights v while the trainer trains on batch v; the new
weights are pushed to every rollout at each step, so every trajectory trained at step v comes from v-1."""

from __future__ import annotations

import math

from laminar.config import Config
from laminar.manager.dispatch import Dispatch, SyncDispatch
from laminar.runtime.launch import Runtime


def dispatch(cfg: Config) -> Dispatch:
    per_replica = math.ceil(cfg.trainer.groups_per_step / cfg.rollout.replicas)
    return SyncDispatch(
        per_replica, cfg.buffer.capacity_groups, groups_per_step=cfg.trainer.groups_per_step, ahead=1
    )


def run(rt: Runtime, steps: int, on_step) -> None:
    g = rt.cfg.trainer.groups_per_step
    for _ in range(steps):
        v = rt.version
        groups = rt.take(g, group_ids=range(v * g, (v + 1) * g))
        on_step(rt.train(groups, push=True))
