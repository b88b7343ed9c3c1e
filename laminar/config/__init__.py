"""Typed configuration: the schema (`schema.py`, with the task, rollout and trainer sections in modules of their
own: one dataclass a section, its checks beside its fields). The package imports nothing else of Laminar, so every
package may import it; loading from YAML with dotted overrides, which also checks the names the registries own,
sits above the registries in `laminar.configure`."""

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
    correction_warning,
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
    "correction_warning",
    "lr_warning",
]
