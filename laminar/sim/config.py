"""Typed configuration of one simulated run, loaded from YAML and validated with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from laminar.config import ConfigError, RepackConfig, ScheduleConfig
from laminar.configure import set_fields
from laminar.data.experience_buffer import SAMPLERS
from laminar.schedules.schedule import NAMES
from laminar.sim.cost import MODELS, CostModel
from laminar.sim.lengths import LengthConfig

# Laminar's ablations: `laminar` with these runtime overrides (`laminar bench schedules`' laminar-norepack and
# laminar-globalpush)
ABLATIONS = {
    "laminar_no_repack": ("repack.enabled=false",),
    "laminar_global_push": ("schedule.global_push=true",),
}
# The runtime's schedules, the colocated `verl` (the simulator's own) and Laminar's ablations
SCHEDULES = (*NAMES, "verl", *ABLATIONS)


SIM_REPACK = RepackConfig(interval_s=5.0, batch_limit_b=0, capped_batch_limit_b=32)
# the runtime's `schedule` section with the simulator's k for stream / partial (the paper's 4; the runtime's 2)
SIM_SCHEDULE = ScheduleConfig(staleness=4)
# the runtime's config sections a simulated run holds whole, so each knob keeps the runtime's name
SECTIONS = {"schedule": SIM_SCHEDULE, "repack": SIM_REPACK}


@dataclass(frozen=True)
class Failure:
    """Machine `machine` (0-based among rollout machines) dies at `time_s`."""

    time_s: float
    machine: int


@dataclass(frozen=True)
class SimConfig:
    # the runtime's `schedule` section, whole: its name (one of `SCHEDULES`: the runtime's, `verl` or an
    # ablation; a name alone stands for the section with that name), `staleness` (k of stream / partial),
    # Laminar's `max_lag` and `max_staleness`, as `Schedule.from_config` reads them
    schedule: ScheduleConfig = field(default_factory=lambda: replace(SIM_SCHEDULE))
    gpus: int = 64
    model: str = "7B"
    trainer_frac: float = 0.25  # share of GPUs given to the trainer (ignored by the colocated `verl`)
    groups_per_step: int = 512  # prompts per global batch (the paper: 512)
    group_size: int = 16  # samples per prompt (the paper: 16)
    steps: int = 100  # trainer steps to simulate
    warmup_steps: int = 3  # steps left out of the throughput window
    max_ahead_batches: float = 3.0  # groups dispatched and not yet trained, in global batches (trainer steps)
    replica_fill: float = 1.0  # laminar: a replica's prompt batch fills this share of max_num_seqs
    # the runtime's `repack` section, whole (`laminar.manager.repack.plan_with` reads it for both); here a round
    # every 5 s (GPU-sized batches), B from the cost model (`batch_limit_b: 0`), and B 32 when the gate caps a
    # round (the runtime's default for 7B-sized models, `results/sim/README.md`)
    repack: RepackConfig = field(default_factory=lambda: replace(SIM_REPACK))
    sampler: str = (
        "fifo"  # the experience buffer's sampler, by name (`laminar.data.experience_buffer.SAMPLERS`)
    )
    relay_pinned: bool = True
    tool_workers: int = 4  # `task.tool_workers`: tool calls a replica runs at once (the tool workload)
    seed: int = 0
    failures: tuple[Failure, ...] = ()
    max_sim_time_s: float = 1e7
    lengths: LengthConfig = field(default_factory=LengthConfig)
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        if isinstance(self.schedule, str):
            object.__setattr__(self, "schedule", replace(SIM_SCHEDULE, name=self.schedule))
        if self.schedule.name not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule.name!r}; valid: {', '.join(SCHEDULES)}")
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}; valid: {', '.join(MODELS)}")
        tp = MODELS[self.model].rollout_tp
        if self.gpus < 2 * tp:
            raise ValueError(
                f"gpus={self.gpus} is too few for model {self.model} (rollout TP {tp}): need >= {2 * tp}"
            )
        if not 0.0 < self.trainer_frac < 1.0:
            raise ValueError(f"trainer_frac={self.trainer_frac} must be in (0, 1)")
        for name in ("groups_per_step", "group_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.schedule.staleness < 1:
            raise ValueError(f"schedule.staleness={self.schedule.staleness} must be >= 1")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be < steps={self.steps}")
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"sampler={self.sampler!r}; valid: {', '.join(SAMPLERS)} (the experience buffer's built-in samplers)"
            )
        check_section(self.schedule)
        # B 0 here is the cost model's B
        check_section(replace(self.repack, batch_limit_b=self.repack.batch_limit_b or 1))
        if self.max_ahead_batches < 1.0:
            raise ValueError(f"max_ahead_batches={self.max_ahead_batches} must be >= 1")

    @property
    def spec(self):
        return MODELS[self.model]

    @property
    def trainer_gpus(self) -> int:
        """Whole machines' worth of GPUs when possible, at least one rollout replica left."""
        tp = self.spec.rollout_tp
        t = max(1, round(self.gpus * self.trainer_frac))
        return min(t, self.gpus - tp)

    @property
    def rollout_replicas(self) -> int:
        if self.schedule == "verl":
            return self.gpus // self.spec.rollout_tp
        return (self.gpus - self.trainer_gpus) // self.spec.rollout_tp

    def with_(self, **changes: Any) -> SimConfig:
        """A copy with `changes`; a dict for a section (`schedule`, `repack`, `lengths`, `cost`) changes the
        fields it names, and a name alone the schedule's name."""
        for key, value in changes.items():
            if key == "schedule" and isinstance(value, str):
                value = {"name": value}
            if isinstance(value, dict) and is_dataclass(getattr(self, key)):
                changes[key] = replace(getattr(self, key), **value)
        return replace(self, **changes)


def check_section(section: ScheduleConfig | RepackConfig) -> None:
    """The runtime's own checks of one of its sections, as the simulator's `ValueError`."""
    from laminar.config import Config

    try:
        section.check(Config())
    except ConfigError as e:
        raise ValueError(str(e)) from None


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"{where}{key}: unknown field; valid: {', '.join(known)}")
        default = getattr(cls(), key) if key in ("lengths", "cost") else None
        if cls is SimConfig and key in SECTIONS:  # the runtime's sections, read as `laminar train` reads them
            given = {"name": value} if isinstance(value, str) else value  # `schedule: sync` names it alone
            if not isinstance(given, dict):
                raise ValueError(f"{where}{key}: expected a section (mapping), got {value!r}")
            value = replace(SECTIONS[key])
            set_fields(value, given, f"{where}{key}.")
        elif is_dataclass(default) and isinstance(value, dict):
            value = _build(type(default), value, f"{where}{key}.")
        elif key == "failures":
            value = tuple(Failure(**f) for f in value)
        kwargs[key] = value
    return cls(**kwargs)


def load_config(path: str | Path | None = None, **overrides: Any) -> SimConfig:
    """A `SimConfig` from a YAML file (nested `schedule:`, `repack:`, `lengths:` and `cost:` sections; `schedule`
    and `repack` are the runtime's, spelled and read as `laminar train` reads them), then keyword overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return _build(SimConfig, data, "")
