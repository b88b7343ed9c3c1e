"""`arith`: arithmetic word problems with exact integer answers at graded difficulty (`task.arith_levels`), as
chat messages, scored by the math reward on the boxed answer (`laminar.rewards.math`).

A small instruct model (~100M parameters) gets the easy levels right some of the time and the hard ones rarely,
so GRPO has signal from the first step and room to climb. Problems are seeded. The held-out split never shares a
problem with training: every problem's arithmetic (its expression) falls in one split by a hash, so the two are
disjoint whatever the seeds and sizes, and held-out problems are also unique by text.

Rows are chat messages (`prompt`), `ground_truth` (the answer as digits), `data_source: "arith"` and
`extra_info` (`level`, `expression`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laminar.tasks.task import Row, Task
from laminar.tasks.task import parse_levels as levels_setting

DATA_SOURCE = "arith"
INSTRUCTION = "Put the final answer in \\boxed{}."
HELD_OUT_BUCKETS = 8  # one expression in 8 is held out

LEVELS = {
    1: "a bare sum or difference of two numbers up to 30 ('What is 7 + 12?')",
    2: "a bare sum or difference of two two-digit numbers ('What is 47 - 18?')",
    3: "a word problem, one step: a one-digit and a one- or two-digit number, added or subtracted",
    4: "a word problem, one step: two two-digit numbers, added or subtracted",
    5: "a word problem, two steps: three two-digit numbers, added and subtracted",
    6: "a word problem, one step: two three-digit numbers, added or subtracted",
    7: "a word problem, two steps: a one-digit times a two-digit number, then one added or subtracted",
    8: "a word problem, three steps: three-digit numbers, a product, a sum and a difference",
}

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena", "Omar"]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "stamps", "cookies"]
CONTAINERS = ["boxes", "bags", "jars", "packs", "baskets"]


@dataclass(frozen=True)
class Problem:
    text: str
    expression: str  # the arithmetic, e.g. "37 + 48 - 19": the answer is its value
    answer: int
    level: int


def held_out(expression: str) -> bool:
    digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % HELD_OUT_BUCKETS == 0


def _add_or_take(rng: random.Random, a: int, b: int) -> Problem:
    """One step: `a + b`, or `a - b` with `a >= b` (answers are never negative)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        friend = rng.choice([n for n in NAMES if n != name])
        text = f"{name} has {a} {item}. {friend} gives {name} {b} more. How many {item} does {name} have now?"
        return Problem(text, f"{a} + {b}", a + b, 0)
    a, b = max(a, b), min(a, b)
    text = f"{name} has {a} {item} and gives away {b} of them. How many {item} does {name} have left?"
    return Problem(text, f"{a} - {b}", a - b, 0)


def _bare(a: int, b: int, rng: random.Random) -> Problem:
    """`a + b` or `a - b` (a >= b), asked as a bare question."""
    if rng.random() < 0.5:
        return Problem(f"What is {a} + {b}?", f"{a} + {b}", a + b, 0)
    a, b = max(a, b), min(a, b)
    return Problem(f"What is {a} - {b}?", f"{a} - {b}", a - b, 0)


def level_1(rng: random.Random) -> Problem:
    return _bare(rng.randint(1, 30), rng.randint(1, 30), rng)


def level_2(rng: random.Random) -> Problem:
    return _bare(rng.randint(10, 99), rng.randint(10, 99), rng)


def level_3(rng: random.Random) -> Problem:
    return _add_or_take(rng, rng.randint(1, 9), rng.randint(1, 30))


def level_4(rng: random.Random) -> Problem:
    return _add_or_take(rng, rng.randint(10, 99), rng.randint(10, 99))


def level_5(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    c = rng.randint(10, min(99, a + b))
    text = (
        f"{name} has {a} {item}, buys {b} more and then gives {c} to a friend. "
        f"How many {item} does {name} have now?"
    )
    return Problem(text, f"{a} + {b} - {c}", a + b - c, 0)


def level_6(rng: random.Random) -> Problem:
    return _add_or_take(rng, rng.randint(100, 999), rng.randint(100, 999))


def level_7(rng: random.Random) -> Problem:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    a, b, c = rng.randint(2, 9), rng.randint(10, 99), rng.randint(1, 99)
    if rng.random() < 0.5:
        text = (
            f"{name} buys {a} {box} with {b} {item} in each, and already had {c} {item}. "
            f"How many {item} does {name} have in all?"
        )
        return Problem(text, f"{a} * {b} + {c}", a * b + c, 0)
    c = rng.randint(1, a * b)
    text = (
        f"{name} buys {a} {box} with {b} {item} in each and gives away {c} {item}. "
        f"How many {item} does {name} have left?"
    )
    return Problem(text, f"{a} * {b} - {c}", a * b - c, 0)


def level_8(rng: random.Random) -> Problem:
    item, box = rng.choice(ITEMS), rng.choice(CONTAINERS)
    a, b, c = rng.randint(2, 9), rng.randint(100, 999), rng.randint(100, 999)
    d = rng.randint(100, a * b + c)
    text = (
        f"A shop has {a} {box} of {b} {item} each and {c} loose {item}. It sells {d} {item}. "
        f"How many {item} does the shop have left?"
    )
    return Problem(text, f"{a} * {b} + {c} - {d}", a * b + c - d, 0)


GENERATORS: dict[int, Callable[[random.Random], Problem]] = {
    1: level_1,
    2: level_2,
    3: level_3,
    4: level_4,
    5: level_5,
    6: level_6,
    7: level_7,
    8: level_8,
}


def parse_levels(text: str | int) -> tuple[int, ...]:
    """`task.arith_levels`: comma-separated level numbers, e.g. "1,2" or "2" (`laminar.tasks.task.parse_levels`)."""
    return levels_setting(text, "task.arith_levels", LEVELS)


@dataclass
class ArithTask:
    """Problems drawn level by level in turn from `levels`, seeded; `rows` for training, `held_out_rows` for
    evaluation."""

    levels: tuple[int, ...] = (1, 2)
    seed: int = 0

    def problems(self, count: int, split: str = "train") -> list[Problem]:
        if split not in ("train", "held_out"):
            raise ValueError(f"split={split!r}: expected 'train' or 'held_out'")
        want_held_out = split == "held_out"
        rng = random.Random(f"{self.seed}/{split}")
        out: list[Problem] = []
        seen: set[str] = set()
        tries = 0
        while len(out) < count:
            level = self.levels[len(out) % len(self.levels)]
            p = GENERATORS[level](rng)
            tries += 1
            if tries > 1000 * (count + 10):
                raise ValueError(
                    f"arith: found only {len(out)} distinct held-out problems of levels {self.levels}, "
                    f"asked for {count}; ask for fewer or add harder levels"
                )
            if held_out(p.expression) != want_held_out or (want_held_out and p.text in seen):
                continue
            seen.add(p.text)
            out.append(Problem(p.text, p.expression, p.answer, level))
        return out

    def rows(self, count: int) -> list[dict[str, Any]]:
        return [to_row(p) for p in self.problems(count, "train")]

    def held_out_rows(self, count: int) -> list[dict[str, Any]]:
        return [to_row(p) for p in self.problems(count, "held_out")]


def to_row(p: Problem) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": f"{p.text} {INSTRUCTION}"}],
        "ground_truth": str(p.answer),
        "data_source": DATA_SOURCE,
        "extra_info": {"level": p.level, "expression": p.expression},
    }


def _problems(cfg: Any) -> ArithTask:
    return ArithTask(parse_levels(cfg.task.arith_levels), seed=cfg.task.seed)


def rows(cfg: Any) -> list[Row]:
    return _problems(cfg).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    return _problems(cfg).held_out_rows(cfg.eval.num_prompts)


def check(cfg: Any) -> None:
    parse_levels(cfg.task.arith_levels)  # its error names task.arith_levels and every level


TASK = Task(
    name="arith",
    about="math word problems",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.math:default_score",
    check=check,
)
