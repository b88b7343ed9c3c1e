"""Partial rollout (AReaL / Kimi-style): like stream, but every update interrupts in-flight trajectories, which
resume on the new weights after re-prefilling their KV cache; one trajectory then mixes versions, and the
re-prefilled tokens are the price (counted per trajectory)."""

from __future__ import annotations

from laminar.config import Config
from laminar.manager.manager import Dispatch
from laminar.runtime.launch import Runtime
from laminar.schedules.stream import BoundedDispatch

INTERRUPTS = True  # replicas check their relay between engine steps and resume on a newer version


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
