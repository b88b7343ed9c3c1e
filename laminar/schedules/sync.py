"""Synchronous (verl-style): every replica generates batch v with weights v; the trainer waits for the last
trajectory of the batch, trains, and pushes v+1 to every rollout before the next batch starts."""

from __future__ import annotations

import math

from laminar.config import Config
from laminar.manager.dispatch import Dispatch, SyncDispatch
from laminar.runtime.launch import Runtime


def dispatch(cfg: Config) -> Dispatch:
    per_replica = math.ceil(cfg.trainer.groups_per_step / cfg.rollout.replicas)  # spread each batch over all
    return SyncDispatch(per_replica, cfg.buffer.capacity_groups, groups_per_step=cfg.trainer.groups_per_step)


def run(rt: Runtime, steps: int, on_step) -> None:
    g = rt.cfg.trainer.groups_per_step
    for _ in range(steps):
        v = rt.version
        groups = rt.take(g, group_ids=range(v * g, (v + 1) * g))  # batch v, whole
        on_step(rt.train(groups, push=True))
