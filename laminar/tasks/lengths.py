"""`lengths`, the benchmark workload: each prompt carries the response length it must produce, so a schedule's
speed does not depend on what the model learns. No held-out split and no warm start: any model runs it. Lengths
are lognormal with p99 = `p99_ratio` x the median by default (the long tail of reasoning), or read from a file
(one integer per line).

With `tool_calls_mean > 0` it is the tool workload: each response is cut into turns by tool calls whose number
is geometric (mean `tool_calls_mean`, capped at `max_calls`) and whose latencies are lognormal (median
`tool_latency_median_s`, p99 `tool_latency_p99_ratio` x it). A call appends `tool_output_tokens` tokens of
context. The row's `tool_script` says where each call falls (after how many sampled tokens), how long it takes
and how much it returns; the replica plays it (`laminar.tools.turns`), so random-weight models exercise the
schedules on multi-turn trajectories."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laminar.tasks.task import Row, Task

Z99 = 2.3263  # the standard normal's 99th percentile


@dataclass
class LengthWorkload:
    median: int = 64
    p99_ratio: float = 10.0
    max_len: int = 1024
    prompt_len: int = 16
    lengths_file: str = ""
    seed: int = 0
    tool_calls_mean: float = 0.0  # 0: single-turn responses
    tool_calls_min: int = 0  # every response (of 2 tokens or more) makes at least this many calls
    tool_latency_median_s: float = 0.5
    tool_latency_p99_ratio: float = 10.0
    tool_output_tokens: int = 32
    max_calls: int = 8

    @classmethod
    def from_task(cls, cfg: Any) -> LengthWorkload:
        """The workload a run's config names (`task.name=lengths`): its `task` fields, responses capped at
        `rollout.max_new_tokens`, at most `task.max_turns` calls a response."""
        t = cfg.task
        return cls(
            median=t.length_median,
            p99_ratio=t.length_p99_ratio,
            lengths_file=t.lengths_file,
            prompt_len=t.length_prompt_words,
            max_len=cfg.rollout.max_new_tokens,
            seed=t.seed,
            tool_calls_mean=t.tool_calls_mean,
            tool_calls_min=t.tool_calls_min,
            tool_latency_median_s=t.tool_latency_median_s,
            tool_latency_p99_ratio=t.tool_latency_p99_ratio,
            tool_output_tokens=t.tool_output_tokens,
            max_calls=t.max_turns,
        )

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
        """Rows whose `sampling` field fixes the response length and ignores end-of-sequence (and, for the tool
        workload, whose `tool_script` places the calls)."""
        rng = random.Random(self.seed + 1)
        tools = random.Random(self.seed + 2)
        rows = []
        for n in self.lengths(count):
            row: dict[str, Any] = {
                "prompt": " ".join(rng.choices("0123456789", k=self.prompt_len)) + " =",
                "answer": "",
                "sampling": {"max_new_tokens": n, "ignore_eos": True},
            }
            if self.tool_calls_mean > 0 and n > 1:
                script = self.tool_script(n, tools)
                row["tool_script"] = script
                row["sampling"]["max_new_tokens"] = n + len(script["calls_at"]) * self.tool_output_tokens
            rows.append(row)
        return rows

    def tool_script(self, n: int, rng: random.Random) -> dict[str, Any]:
        """Calls after distinct counts of sampled tokens in [1, n), their latencies and their output size."""
        p = 1.0 / (1.0 + self.tool_calls_mean)  # geometric on {0, 1, ...} with this mean
        calls = 0
        while calls < min(self.max_calls, n - 1) and rng.random() > p:
            calls += 1
        calls = max(calls, min(self.tool_calls_min, self.max_calls, n - 1))
        sigma = math.log(self.tool_latency_p99_ratio) / Z99
        return {
            "calls_at": sorted(rng.sample(range(1, n), calls)),
            "latency_s": [
                round(self.tool_latency_median_s * math.exp(rng.gauss(0.0, sigma)), 4) for _ in range(calls)
            ],
            "output_tokens": self.tool_output_tokens,
        }


def length_reward(response: str, row: dict[str, Any]) -> float:
    """Trivial but not constant, so GRPO's advantages are non-zero and the trainer does its full work."""
    return (sum(map(ord, response)) % 11) / 10.0


def rows(cfg: Any) -> list[Row]:
    return LengthWorkload.from_task(cfg).rows(cfg.task.num_prompts)


TASK = Task(
    name="lengths",
    about="the benchmark workload",
    rows=rows,
    reward="laminar.tasks.lengths:length_reward",
)
