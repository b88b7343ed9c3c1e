"""What a built-in task is: the rows it makes from the run's config, its held-out rows, the reward it is scored
with by default, how `laminar warmup` teaches a model to do it partly, and what it asks of the config and of a
model's tokenizer. One frozen value a task; `laminar.tasks.TASKS` holds them by name.

The config is typed `Any` here: `laminar.config` checks `task.name` against the registry, so the registry never
imports the config back."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Row = dict[
    str, Any
]  # a row as the task makes it; `laminar.data.dataset.normalise_row` gives it the run's schema
Example = tuple[list[int], list[int]]  # a demonstration's token ids and the loss mask over them (1: trained)
# held-out rows drawn the way training's are, from task.seed plus this: never the training draw
HELD_OUT_SEED = 1_000_003


def parse_levels(text: str | int, field: str, levels: dict[int, str]) -> tuple[int, ...]:
    """A task's levels setting (`field`, e.g. task.arith_levels): comma-separated level numbers such as "1,2" or 2,
    each a key of `levels` (level -> what it is, named in the error)."""
    try:
        chosen = tuple(int(p) for p in str(text).split(",") if p.strip())
    except ValueError:
        chosen = ()
    if not chosen or any(lv not in levels for lv in chosen):
        raise ValueError(
            f"{field}={text!r}: expected comma-separated levels from {sorted(levels)} (e.g. '1,2'); levels: "
            + "; ".join(f"{k}: {v}" for k, v in levels.items())
        )
    return chosen


@dataclass(frozen=True)
class WarmStart:
    """How `laminar warmup --task NAME` makes the task's starting model: a short supervised run on
    demonstrations, stopped while the model is still only partly right so that RL has something to improve.

    `examples(codec, cfg)` returns a function that draws one demonstration (the prompt as `codec` encodes it, then
    the response to learn; mask 1 on what the model writes) from a `random.Random`; `cfg` is the run's
    `laminar.tasks.warmup.WarmupConfig`. With `--model DIR` the codec is that model's tokenizer and chat template
    (`codec.encode_prompt` applies the template); otherwise it is `codec()`, the tiny Llama's tokenizer: a task
    without one (None) is warm-started only from a Hugging Face model."""

    examples: Callable[[Any, Any], Callable[[random.Random], Example]]
    codec: Callable[[], Any] | None = None  # the tiny Llama's `TaskCodec`; None: `--model` only
    steps: int | None = None  # supervised steps; None: `WarmupConfig.steps`
    batch_size: int | None = None  # demonstrations a step; None: `WarmupConfig.batch_size`
    reads: tuple[
        str, ...
    ] = ()  # `WarmupConfig` fields `examples` reads besides the shared ones (to warmup.json)


@dataclass(frozen=True)
class Task:
    """A built-in task (`task.name`). Functions take the run's `Config`.

    - `rows(cfg)`: `task.num_prompts` training rows.
    - `held_out_rows(cfg)`: `eval.num_prompts` rows training never draws (the evaluation set when
      `data.val_files` is empty); None: the task has no held-out split.
    - `reward`: the dotted path `module:function` the rows are scored with when `task.reward` is empty.
    - `check(cfg)`: the task's own config checks; raises ValueError naming the field, the value and what would
      be valid (raised as a `ConfigError` when the config loads).
    - `check_codec(codec)`: what the task needs of a configured model's tokenizer (`model.path`), asked on the
      driver before any actor starts; raises ValueError saying what it lacks."""

    name: str
    about: str  # a few words for the list of valid names ("the demo")
    rows: Callable[[Any], list[Row]]
    reward: str
    held_out_rows: Callable[[Any], list[Row]] | None = None
    warm_start: WarmStart | None = None
    check: Callable[[Any], None] | None = None
    check_codec: Callable[[Any], None] | None = None
