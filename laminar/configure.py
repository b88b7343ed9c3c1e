"""A configuration from YAML with dotted overrides (`trainer.lr=1e-5 rollout.replicas=4`), validated when loaded:
each section's own checks (`laminar.config`), then the names the registries own. Outside the `config` package
because it imports those registries (tasks, samplers, schedules, tools), which import the schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from laminar.config.checks import ConfigError, check_field
from laminar.config.schema import Config
from laminar.data.experience_buffer import SAMPLERS
from laminar.schedules.schedule import NAMES as SCHEDULE_NAMES
from laminar.tasks import TASKS
from laminar.tasks import choices as task_choices


def _coerce(path: str, value: Any, kind: type) -> Any:
    inner = _optional(kind)
    if inner is not None:  # `int | None`: null for none; -1, the spelling before null, reads as null
        if value is None or (value == -1 and not isinstance(value, bool)):
            return None
        return _coerce(path, value, inner)
    if get_origin(kind) is list:  # one value stands for a list of one; "" for none
        items = [] if value in ("", None) else value if isinstance(value, list) else [value]
        return [_coerce(f"{path}[{i}]", v, get_args(kind)[0]) for i, v in enumerate(items)]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return int(value)
    if kind is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-5` as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if kind is str:
        if isinstance(value, bool):  # YAML 1.1 reads on/off (yes/no, true/false) as booleans
            return "on" if value else "off"
        if not isinstance(value, str | int | float):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    return value


def _optional(kind: Any) -> type | None:
    """The type `kind` makes optional (`int` of `int | None`), else None."""
    args = get_args(kind)
    if type(None) not in args or get_origin(kind) is list:
        return None
    (inner,) = [a for a in args if a is not type(None)]
    return inner


def set_fields(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
    """Set the fields `data` names on the dataclass `obj` (sections too, recursively), each read as its type
    says; `prefix` names `obj` in errors. The simulator reads the runtime's sections it holds with it."""
    hints = get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown field {path!r}; valid fields here: {', '.join(names)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current) and isinstance(value, str) and hasattr(current, "name"):
            value = {"name": value}  # `schedule: sync` is short for `schedule: {name: sync}`
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a section (mapping), got {value!r}")
            set_fields(current, value, prefix=f"{path}.")
        else:
            setattr(obj, key, _coerce(path, value, hints[key]))


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.field=value (e.g. trainer.lr=1e-5)")
    key, raw = text.split("=", 1)
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def _nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file, then the overrides; validated as a whole at the end."""
    cfg = Config()
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(
                f"config file {str(p)!r} does not exist; pass a YAML file or no file for the demo"
            )
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {str(p)!r} is not YAML: {_yaml_problem(e)}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}"
            )
        set_fields(cfg, data)
    for text in overrides:
        key, value = parse_override(text)
        set_fields(cfg, _nest(key, value))
    if cfg.buffer.capacity_groups == 0:  # three trainer steps ahead (the simulated dispatch policy)
        cfg.buffer.capacity_groups = 3 * cfg.trainer.groups_per_step
    validate(cfg)
    return cfg


def _yaml_problem(e: Exception) -> str:
    """A YAML parser's error as one line: what it found and where (its own message spans several lines)."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte {e.start})"
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return what + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "")


def validate(cfg: Config) -> None:
    """Every section's own checks, then the names the registries own."""
    for f in dataclasses.fields(cfg):
        getattr(cfg, f.name).check(cfg)
    check_names(cfg)


def check_names(cfg: Config) -> None:
    """The names the registries own: a task, a buffer sampler, a schedule, the tools."""
    check_field(
        cfg.task.name in TASKS or cfg.task.name.endswith(".jsonl"), "task.name", cfg.task.name, task_choices()
    )
    task = TASKS.get(cfg.task.name)
    if task is not None and task.check is not None:
        try:
            task.check(cfg)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    check_field(
        cfg.buffer.sampler in SAMPLERS or ":" in cfg.buffer.sampler,
        "buffer.sampler",
        cfg.buffer.sampler,
        f"one of {', '.join(SAMPLERS)} or a dotted path module:function",
    )
    check_field(
        cfg.schedule.name in SCHEDULE_NAMES, "schedule.name", cfg.schedule.name, " | ".join(SCHEDULE_NAMES)
    )
    if cfg.task.tools:
        from laminar.tools.registry import ToolLoadError, load_tools

        try:
            load_tools(cfg.task.tools)
        except ToolLoadError as e:
            raise ConfigError(f"task.tools={cfg.task.tools!r}: {e}") from None
