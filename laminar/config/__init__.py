"""Typed configuration: the schema (`schema.py`, with the task, rollout and trainer sections in modules of their
own: one dataclass a section, its checks beside its fields; a leaf of the package graph) and its loading from YAML with dotted overrides (`laminar.config.load.load_config`), validated when loaded, naming the
field at fault. This package re-exports the schema alone, so importing it never imports the registries that
`load` checks names against."""

from laminar.config.checks import ConfigError
from laminar.config.rollout import RolloutConfig
from laminar.config.schema import (
    HIGH_LORA_LR,
    HIGH_LR,
    BufferConfig,
    Config,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RelayConfig,
    RepackConfig,
    RunConfig,
    ScheduleConfig,
    lr_warning,
)
from laminar.config.task import TaskConfig
from laminar.config.trainer import ADVANTAGES, LORA_TARGETS, LOSS_AGGS, RATIOS, TrainerConfig

__all__ = [
    "ADVANTAGES",
    "HIGH_LORA_LR",
    "HIGH_LR",
    "LORA_TARGETS",
    "LOSS_AGGS",
    "RATIOS",
    "BufferConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "RelayConfig",
    "RepackConfig",
    "RolloutConfig",
    "RunConfig",
    "ScheduleConfig",
    "TaskConfig",
    "TrainerConfig",
    "lr_warning",
]
