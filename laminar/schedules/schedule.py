"""A schedule is one value: when a replica may get work, which groups the trainer takes, how a new version
travels, whether it interrupts generation, and whether long tails are repacked. `Schedule.from_config` builds it,
`Schedule.run` is the trainer's loop for all of them; the simulator (`laminar.sim.schedules`) builds and runs the
same value.

sync      (verl-style) batch v is generated with version v, spread over every replica; the trainer waits for
          the whole batch, trains, and pushes v+1 to every rollout before batch v+1 starts
one_step  batch v+1 is generated with version v while batch v trains; every step trained on version v-1
stream    (StreamRL-style) generation never stops, bounded by staleness k; only the newest version gets work,
          and each version is pushed to all rollouts, which adopt it when their current batch ends
partial   (AReaL / Kimi-style) stream, but every new version interrupts in-flight trajectories, which resume on
          it after re-prefilling their KV cache (one trajectory then mixes versions)
laminar   trajectory-level asynchrony: replicas run free, each pulling the newest version from its node's relay
          between batches; the trainer takes the first groups to complete and only publishes (the publish is
          its only stall); the manager repacks long tails (`repack.enabled`); `schedule.global_push` is the
          ablation without relays
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from laminar.schedules.dispatch import Dispatch

if TYPE_CHECKING:
    from collections.abc import Callable

    from laminar.config import Config

NAMES = ("sync", "one_step", "stream", "partial", "laminar")


class Run(Protocol):
    """What a schedule's loop drives: the driver's run (`laminar.runtime.launch.Runtime`)."""

    cfg: Config
    version: int  # the newest version trained

    def take(self, count: int, group_ids: range | None = None) -> Any:
        """A batch of `count` complete groups from the buffer: these ids, in order, or what its sampler picks
        (`laminar.runtime.launch.Batch`: the groups and what the step must know of how they were taken)."""
        ...

    def train(self, batch: Any, push: bool = False) -> dict[str, Any]:
        """One step on `batch`, then the publish (a global push when `push`); the step's metrics."""
        ...


@dataclass(frozen=True)
class Schedule:
    name: str
    dispatch: Dispatch  # when a replica may get work (asked by the manager)
    in_order: (
        bool  # the trainer takes batch v = groups v*g .. (v+1)*g - 1, else what the buffer's sampler picks
    )
    push: bool  # a publish is a global push: the step ends when every relay holds the new version
    interrupt: bool  # a new version interrupts in-flight generation (replicas re-prefill and go on)
    repack: bool  # the manager repacks long tails onto fewer replicas

    @classmethod
    def from_config(cls, cfg: Config) -> Schedule:
        name, g, cap = cfg.schedule.name, cfg.trainer.groups_per_step, cfg.buffer.capacity_groups
        if name in ("sync", "one_step"):
            per_replica = math.ceil(g / cfg.rollout.replicas)  # each batch spread over every replica
            rule = Dispatch(per_replica, cap, g, ahead=int(name == "one_step"))
        elif name in ("stream", "partial"):
            rule = Dispatch(cfg.rollout.groups_per_batch, cap, g, ahead=cfg.schedule.staleness)
        elif name == "laminar":
            rule = Dispatch(
                cfg.rollout.groups_per_batch,
                cap,
                g,
                max_lag=cfg.schedule.max_lag,
                max_staleness=cfg.schedule.max_staleness,
            )
        else:
            raise ValueError(f"schedule.name={name!r}; valid: {' | '.join(NAMES)}")
        laminar = name == "laminar"
        return cls(
            name,
            rule,
            in_order=not laminar,
            push=not laminar or cfg.schedule.global_push,
            interrupt=name == "partial",
            repack=laminar and cfg.repack.enabled,
        )

    def run(self, rt: Run, steps: int, on_step: Callable[[dict[str, Any]], None]) -> None:
        """The trainer's loop: take a batch of complete groups, train on it, publish."""
        g = rt.cfg.trainer.groups_per_step
        for _ in range(steps):
            v = (
                rt.version
            )  # in dispatch order, batch v is what the bound was computed for: wait for stragglers
            batch = range(v * g, (v + 1) * g) if self.in_order else None
            on_step(rt.train(rt.take(g, group_ids=batch), push=self.push))
