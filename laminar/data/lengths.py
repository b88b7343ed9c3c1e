"""The length-controlled benchmark workload: each prompt carries the response length it must produce, so a
schedule's speed does not depend on what the model learns. Lengths are lognormal with p99 = `p99_ratio` x the
median by default (the long tail of reasoning), or read from a file (one integer per line)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Z99 = 2.3263  # the standard normal's 99th percentile


@dataclass
class LengthWorkload:
    median: int = 64
    p99_ratio: float = 10.0
    max_len: int = 1024
    prompt_len: int = 16
    lengths_file: str = ""
    seed: int = 0

    def lengths(self, count: int) -> list[int]:
        rng = random.Random(self.seed)
        if self.lengths_file:
            path = Path(self.lengths_file)
            if not path.is_file():
                raise FileNotFoundError(f"lengths file {path} does not exist (expected one integer per line)")
            pool = []
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        pool.append(int(line))
                    except ValueError:
                        raise ValueError(
                            f"lengths file {path}, line {i}: {line!r} is not an integer"
                        ) from None
            if not pool:
                raise ValueError(f"lengths file {path} holds no lengths")
            return [max(1, min(self.max_len, rng.choice(pool))) for _ in range(count)]
        sigma = math.log(self.p99_ratio) / Z99
        return [
            max(1, min(self.max_len, round(self.median * math.exp(rng.gauss(0.0, sigma)))))
            for _ in range(count)
        ]

    def rows(self, count: int) -> list[dict[str, Any]]:
        """Rows whose `sampling` field fixes the response length and ignores end-of-sequence."""
        rng = random.Random(self.seed + 1)
        return [
            {
                "prompt": " ".join(str(rng.randrange(10)) for _ in range(self.prompt_len)) + " =",
                "answer": "",
                "sampling": {"max_new_tokens": n, "ignore_eos": True},
            }
            for n in self.lengths(count)
        ]


def length_reward(response: str, row: dict[str, Any]) -> float:
    """Trivial but not constant, so GRPO's advantages are non-zero and the trainer does its full work."""
    return (sum(map(ord, response)) % 11) / 10.0
