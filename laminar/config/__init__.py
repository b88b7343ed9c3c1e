"""Typed configuration: the schema (`schema.py`: one dataclass a section, its checks beside its fields; a leaf of
the package graph) and its loading from YAML with dotted overrides (`load.py`), validated when loaded, naming the
field at fault."""

from laminar.config.load import check_names, load_config, parse_override, validate
from laminar.config.schema import (
    ADVANTAGES,
    HIGH_LORA_LR,
    HIGH_LR,
    LORA_TARGETS,
    LOSS_AGGS,
    RATIOS,
    BufferConfig,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RelayConfig,
    RepackConfig,
    RolloutConfig,
    RunConfig,
    ScheduleConfig,
    TaskConfig,
    TrainerConfig,
    lr_warning,
)

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
    "check_names",
    "load_config",
    "lr_warning",
    "parse_override",
    "validate",
]
