"""What a wrong configuration value raises, and the one check every section makes of its fields."""

from __future__ import annotations

from typing import Any

# what an optional count (`int | None`: a bound, an age) may be: YAML's null for none, else a count
NONE_OR_COUNT = "null (none) or >= 0"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what would be valid."""


def check_field(ok: bool, path: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{path}={value!r} is invalid: {valid}")
