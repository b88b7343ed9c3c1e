"""Run one simulated configuration and summarise it: the one call the CLI, the experiments and tests share."""

from __future__ import annotations

import time
from typing import Any

from laminar.sim.cluster import Cluster
from laminar.sim.config import SimConfig
from laminar.sim.metrics import summarise
from laminar.sim.schedules import loop_for


def simulate(cfg: SimConfig, *, audit: bool = False) -> tuple[dict[str, Any], Cluster]:
    started = time.perf_counter()
    cluster = Cluster(cfg, audit=audit)
    cluster.run(loop_for(cluster))
    return summarise(cluster, wall_s=time.perf_counter() - started), cluster
