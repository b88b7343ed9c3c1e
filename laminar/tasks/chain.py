"""`chain`: a running number carried through a numbered list of small operations ("Start with 7. 1. add 5
2. multiply by 3 3. subtract 4 ..."), answered with the final number in `\\boxed{}`. A reasoning task whose
answers need their length, for small real models: each step is easy, but the final number depends on every step
in order, so a model gets it right only by writing each intermediate result (one line a step, about 13 tokens).

The number of steps is long-tailed (lognormal, `task.chain_steps_median` and `task.chain_steps_p99`, at most
`MAX_STEPS`): most problems take a few lines, some take dozens, and so do the right answers. Levels grade how
hard each step is (`LEVELS`, `task.chain_levels`); rows are drawn level by level in turn. Seeded; the held-out
split never shares a problem with training (one problem in `HELD_OUT_BUCKETS` is held out by a hash of its
text), and the warm start's demonstrations are training problems.

Scored by `laminar.rewards.chain`, the math reward on the last `\\boxed{}` only: the last number of a response
cut off mid-chain is an intermediate result, not an answer. No format term: the reward is one number a sample."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laminar.tasks.task import Example, Row, Task, WarmStart
from laminar.tasks.task import parse_levels as levels_setting

DATA_SOURCE = "chain"
INSTRUCTION = "Write one line per step with its result, then put the final number in \\boxed{}."
HELD_OUT_BUCKETS = 8  # one problem in 8 is held out
MAX_STEPS = 64  # longer draws are drawn again: about 850 response tokens, within a 1024-token cap
# the warm start: 300 steps of 32 demonstrations at the pretrained lr (3e-5), about 3 minutes on one H100
WARM_START_STEPS = 300


@dataclass(frozen=True)
class Level:
    about: str
    start: tuple[int, int]  # the starting number's range
    add: int  # add or subtract 1..add
    times: tuple[int, ...]  # multiply by one of these
    top: int  # the running number stays within 0..top


LEVELS = {
    1: Level("add or subtract a one-digit number, the number staying within 0-30", (1, 20), 9, (), 30),
    2: Level("add or subtract a one-digit number, the number staying within 0-99", (10, 99), 9, (), 99),
    3: Level(
        "add or subtract up to 20, or multiply by 2 or 3, the number staying within 0-99",
        (2, 50),
        20,
        (2, 3),
        99,
    ),
    4: Level(
        "add or subtract up to 99, or multiply by 2 to 9, the number staying within 0-999",
        (10, 200),
        99,
        tuple(range(2, 10)),
        999,
    ),
}
SYMBOL = {"add": "+", "subtract": "-", "multiply by": "*"}


def apply(v: int, op: str, n: int) -> int:
    return v + n if op == "add" else v - n if op == "subtract" else v * n


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[str, int], ...]  # ("add" | "subtract" | "multiply by", number), in order
    level: int

    @property
    def values(self) -> list[int]:
        """The running number after each step; the last is the answer."""
        out, v = [], self.start
        for op, n in self.ops:
            v = apply(v, op, n)
            out.append(v)
        return out

    @property
    def answer(self) -> int:
        return self.values[-1]

    @property
    def text(self) -> str:
        lines = [f"Start with {self.start}, then:"]
        lines += [f"{i}. {op} {n}" for i, (op, n) in enumerate(self.ops, 1)]
        return "\n".join([*lines, INSTRUCTION])

    def solution(self) -> str:
        """What the warm start teaches: each step with its result, then the boxed answer."""
        before = [self.start, *self.values]
        lines = [
            f"{i}. {before[i - 1]} {SYMBOL[op]} {n} = {before[i]}" for i, (op, n) in enumerate(self.ops, 1)
        ]
        return "\n".join([*lines, f"\\boxed{{{self.answer}}}"])


def held_out(p: Problem) -> bool:
    digest = hashlib.blake2b(p.text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % HELD_OUT_BUCKETS == 0


def step_count(rng: random.Random, median: float, p99: float) -> int:
    """Lognormal with this median and 99th percentile, rounded, at least 1 and at most `MAX_STEPS`."""
    sigma = math.log(p99 / median) / 2.3263  # z of the 99th percentile
    while True:
        k = max(1, round(rng.lognormvariate(math.log(median), sigma)))
        if k <= MAX_STEPS:
            return k


def next_op(rng: random.Random, v: int, lv: Level) -> tuple[str, int]:
    """An operation that keeps the number within 0..top: its kind first, then its number."""
    kinds = {
        "add": range(1, min(lv.add, lv.top - v) + 1),
        "subtract": range(1, min(lv.add, v) + 1),
        "multiply by": [m for m in lv.times if v >= 2 and v * m <= lv.top],
    }
    op = rng.choice([k for k, ns in kinds.items() if ns])
    return op, rng.choice(kinds[op])


def draw(rng: random.Random, level: int, steps: int) -> Problem:
    lv = LEVELS[level]
    start = v = rng.randint(*lv.start)
    ops = []
    for _ in range(steps):
        op, n = next_op(rng, v, lv)
        ops.append((op, n))
        v = apply(v, op, n)
    return Problem(start, tuple(ops), level)


def parse_levels(text: str | int) -> tuple[int, ...]:
    """`task.chain_levels`: comma-separated level numbers, e.g. "1,2" or "2" (`laminar.tasks.task.parse_levels`)."""
    return levels_setting(text, "task.chain_levels", {k: v.about for k, v in LEVELS.items()})


def problems(
    levels: tuple[int, ...], median: float, p99: float, seed: int, count: int, split: str = "train"
) -> list[Problem]:
    """`count` problems of one split ("train" or "held_out"), level by level in turn; held-out problems are
    also unique."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split={split!r}: expected 'train' or 'held_out'")
    want_held_out = split == "held_out"
    rng = random.Random(f"chain/{seed}/{split}")
    out: list[Problem] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < count:
        p = draw(rng, levels[len(out) % len(levels)], step_count(rng, median, p99))
        tries += 1
        if tries > 1000 * (count + 10):
            raise ValueError(
                f"chain: found only {len(out)} distinct held-out problems of levels {levels}, asked for {count}"
            )
        if held_out(p) != want_held_out or (want_held_out and p.text in seen):
            continue
        seen.add(p.text)
        out.append(p)
    return out


def to_row(p: Problem) -> Row:
    return {
        "prompt": [{"role": "user", "content": p.text}],
        "ground_truth": str(p.answer),
        "data_source": DATA_SOURCE,
        "extra_info": {"level": p.level, "steps": len(p.ops)},
    }


def _problems(cfg: Any, count: int, split: str) -> list[Problem]:
    t = cfg.task
    return problems(
        parse_levels(t.chain_levels), t.chain_steps_median, t.chain_steps_p99, t.seed, count, split
    )


def rows(cfg: Any) -> list[Row]:
    return [to_row(p) for p in _problems(cfg, cfg.task.num_prompts, "train")]


def held_out_rows(cfg: Any) -> list[Row]:
    return [to_row(p) for p in _problems(cfg, cfg.eval.num_prompts, "held_out")]


def check(cfg: Any) -> None:
    t = cfg.task
    parse_levels(t.chain_levels)
    if not 1 <= t.chain_steps_median <= MAX_STEPS:
        raise ValueError(
            f"task.chain_steps_median={t.chain_steps_median!r} is invalid: a number from 1 to {MAX_STEPS}"
        )
    if not t.chain_steps_median < t.chain_steps_p99 <= MAX_STEPS:
        raise ValueError(
            f"task.chain_steps_p99={t.chain_steps_p99!r} is invalid: above task.chain_steps_median "
            f"({t.chain_steps_median}) and at most {MAX_STEPS}"
        )


def examples(codec: Any, cfg: Any) -> Callable[[random.Random], Example]:
    """A training problem of the default levels and step counts through the model's chat template, then its
    solution, one line a step, and the end token."""
    from laminar.config import TaskConfig

    t = TaskConfig()
    levels = parse_levels(t.chain_levels)

    def example(rng: random.Random) -> Example:
        while True:
            p = draw(rng, rng.choice(levels), step_count(rng, t.chain_steps_median, t.chain_steps_p99))
            if not held_out(p):
                break
        prompt = codec.encode_prompt(to_row(p)["prompt"])
        answer = codec.encode_answer(p.solution())
        return prompt + answer, [0] * len(prompt) + [1] * len(answer)

    return example


TASK = Task(
    name="chain",
    about="multi-step arithmetic, long-tailed steps",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.chain:chain_reward",
    warm_start=WarmStart(examples, steps=WARM_START_STEPS),
    check=check,
)
