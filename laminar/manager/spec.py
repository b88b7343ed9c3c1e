"""What the manager needs of the run's config, made once on the driver (`ManagerSpec.of`) and handed to the
manager actor, which never sees the whole `Config`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from laminar.config import RepackConfig
from laminar.manager.supervisor import Watch

if TYPE_CHECKING:
    from laminar.config import Config


def sampling_of(cfg: Config) -> dict[str, Any]:
    """How every rollout samples (`SamplingParams` fields): a replica's requests and recovery's restarts alike;
    a group's own `meta["sampling"]` overrides it."""
    r = cfg.rollout
    return {
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "max_new_tokens": r.max_new_tokens,
    }


@dataclass(frozen=True)
class ManagerSpec:
    watch: Watch  # heartbeats, deadlines and how often one error may repeat
    sampling: dict[str, Any]  # `sampling_of`
    run_seed: int  # with a trajectory's id, its sampling seed (recovery restarts it with the same one)
    repack: RepackConfig = field(default_factory=RepackConfig)

    @classmethod
    def of(cls, cfg: Config) -> ManagerSpec:
        r = cfg.rollout
        watch = Watch(
            r.heartbeat_s, r.dead_after_s, cfg.run.timeout_s, r.max_failures_in_a_row, r.start_timeout_s
        )
        return cls(watch, sampling_of(cfg), cfg.run.seed, cfg.repack)
