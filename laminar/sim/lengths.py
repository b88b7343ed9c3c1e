"""Prompt and response lengths of the simulated workload.

Every schedule must see the same workload, so a group's lengths depend only on (seed, group index): the
samples are drawn in fixed blocks of groups from a generator seeded by the block number. Samples of one group
share a per-prompt difficulty factor (long problems have long answers for every sample), which is what makes a
group's slowest sample, not the average one, set its completion time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("dapo", "lognormal", "pareto", "empirical", "constant", "bench")
_BLOCK = 256  # groups per generator block


@dataclass(frozen=True)
class LengthConfig:
    """`kind` picks the response-length law; `median`, `p99_over_median`, `pareto_alpha` shape it."""

    kind: str = "dapo"
    prompt_median: int = 400
    prompt_max: int = 2048
    median: float = 1600.0  # response tokens at the start of training
    p99_over_median: float = 10.0
    max_response: int = 16384
    pareto_alpha: float = 1.5
    group_corr: float = 0.3  # share of log-length variance common to a group's samples
    drift_per_step: float = 0.005  # relative growth of the median per trainer step (responses lengthen)
    drift_cap: float = 1.5
    empirical_path: str = ""
    num_prompts: int = 4096  # bench: rows of the length-controlled dataset (`task.num_prompts`)
    workload_seed: int = 0  # bench: the dataset's seed (`task.seed`); the pool's order follows the run's seed
    lengths_file: str = ""  # bench: the run's `task.lengths_file` (response lengths drawn from it), if any
    # the tool workload (`task.tool_calls_mean` and its siblings): each response cut into turns by tool calls,
    # placed as the runtime's `LengthWorkload.tool_script` places them; 0 = single-turn responses
    tool_calls_mean: float = 0.0
    tool_calls_min: int = 0
    tool_latency_median_s: float = 0.5
    tool_latency_p99_ratio: float = 10.0
    tool_output_tokens: int = 32
    tool_max_calls: int = 4  # `task.max_turns`, which caps the calls a response makes

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"lengths.kind={self.kind!r}; valid: {', '.join(KINDS)}")
        if self.kind == "empirical" and not self.empirical_path:
            raise ValueError("lengths.empirical_path is required when lengths.kind='empirical'")
        if not 0.0 <= self.group_corr <= 1.0:
            raise ValueError(f"lengths.group_corr={self.group_corr} must be in [0, 1]")
        if self.tool_calls_mean < 0 or self.tool_latency_median_s < 0 or self.tool_output_tokens < 0:
            raise ValueError(
                "lengths.tool_calls_mean, tool_latency_median_s and tool_output_tokens must be >= 0, got "
                f"{self.tool_calls_mean}, {self.tool_latency_median_s}, {self.tool_output_tokens}"
            )

    @classmethod
    def from_task(cls, cfg: Any) -> LengthConfig:
        """`kind: bench` for the length-controlled workload a run's config names (`task.name=lengths`): the
        simulator then replays that run's own rows (`workload`)."""
        from laminar.tasks.lengths import LengthWorkload

        return cls.of_workload(LengthWorkload.from_task(cfg), cfg.task.num_prompts)

    @classmethod
    def of_workload(cls, w: Any, num_prompts: int) -> LengthConfig:
        """`kind: bench` replaying the runtime's workload `w` (a `LengthWorkload`) over its first `num_prompts`
        rows; `workload` gives `w` back but for its prompt words, which no length depends on."""
        return cls(
            kind="bench",
            median=w.median,
            p99_over_median=w.p99_ratio,
            max_response=w.max_len,
            num_prompts=num_prompts,
            workload_seed=w.seed,
            lengths_file=w.lengths_file,
            tool_calls_mean=w.tool_calls_mean,
            tool_calls_min=w.tool_calls_min,
            tool_latency_median_s=w.tool_latency_median_s,
            tool_latency_p99_ratio=w.tool_latency_p99_ratio,
            tool_output_tokens=w.tool_output_tokens,
            tool_max_calls=w.max_calls,
        )

    def workload(self) -> Any:
        """The runtime's length-controlled workload with these lengths and tool calls."""
        from laminar.tasks.lengths import LengthWorkload

        return LengthWorkload(
            median=int(self.median),
            p99_ratio=self.p99_over_median,
            max_len=self.max_response,
            seed=self.workload_seed,
            lengths_file=self.lengths_file,
            tool_calls_mean=self.tool_calls_mean,
            tool_calls_min=self.tool_calls_min,
            tool_latency_median_s=self.tool_latency_median_s,
            tool_latency_p99_ratio=self.tool_latency_p99_ratio,
            tool_output_tokens=self.tool_output_tokens,
            max_calls=self.tool_max_calls,
        )


class LengthSampler:
    """Deterministic (prompt_len, response_lens) per group index.

    `kind: bench` replays the runtime's own length-controlled workload (`task.name=lengths`): the rows of
    `laminar.tasks.lengths.LengthWorkload` (median, p99 ratio, cap = `max_response`, seed = `workload_seed`)
    handed out in the order of the real `laminar.data.prompt_pool.PromptPool` (seeded by the run), every sample of a group the
    same length (the row fixes it, end-of-sequence ignored), prompts `prompt_median` tokens, no drift. Group i
    of the simulation is then group i of a measured run.
    """

    def __init__(self, cfg: LengthConfig, group_size: int, groups_per_step: int, seed: int = 0) -> None:
        self.cfg, self.n, self.groups_per_step, self.seed = cfg, group_size, groups_per_step, seed
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._empirical = _load_empirical(cfg.empirical_path) if cfg.kind == "empirical" else None
        self._bench: list[tuple[int, dict[str, Any] | None]] = []
        self._pool = None

    def _bench_group(self, index: int) -> tuple[int, list[int]]:
        self._bench_row(index)
        return int(self.cfg.prompt_median), [self._bench[index][0]] * self.n

    def _bench_row(self, index: int) -> tuple[int, dict[str, Any] | None]:
        if self._pool is None:
            from laminar.data.prompt_pool import PromptPool

            rows = self.cfg.workload().rows(self.cfg.num_prompts)
            self._pool = PromptPool(rows, lambda _: [0], self.n, seed=self.seed)
        while len(self._bench) <= index:
            (group,) = self._pool.next_groups(1)
            self._bench.append((int(group.meta["sampling"]["max_new_tokens"]), group.meta.get("tool_script")))
        return self._bench[index]

    def script(self, index: int, length: int) -> dict[str, Any] | None:
        """Group `index`'s tool calls (`LengthWorkload.tool_script`: after how many sampled tokens each comes,
        its latency, its output size), shared by the group's samples as a row's script is; None: no calls.
        `length` is the group's response length with the calls' outputs (the bench rows count them in)."""
        cfg = self.cfg
        if cfg.tool_calls_mean <= 0 and cfg.tool_calls_min <= 0:
            return None
        if cfg.kind == "bench":
            return self._bench_row(index)[1]
        if length < 2:
            return None
        rng = random.Random(f"{self.seed}/{index}")  # a group's calls depend on (seed, group) only
        return cfg.workload().tool_script(length, rng)

    def group(self, index: int) -> tuple[int, list[int]]:
        if self.cfg.kind == "bench":
            return self._bench_group(index)
        block, row = divmod(index, _BLOCK)
        if block not in self._blocks:
            self._blocks[block] = self._draw(block)
        prompts, responses = self._blocks[block]
        return int(prompts[row]), responses[row].tolist()

    def _draw(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        rng = np.random.default_rng([self.seed, block])
        prompts = np.clip(rng.lognormal(math.log(cfg.prompt_median), 0.5, _BLOCK), 16, cfg.prompt_max)
        steps = (block * _BLOCK + np.arange(_BLOCK)) / self.groups_per_step
        scale = np.minimum(1.0 + cfg.drift_per_step * steps, cfg.drift_cap)[:, None]
        z = math.sqrt(cfg.group_corr) * rng.standard_normal((_BLOCK, 1)) + math.sqrt(
            1 - cfg.group_corr
        ) * rng.standard_normal((_BLOCK, self.n))
        if cfg.kind in ("dapo", "lognormal"):
            sigma = math.log(cfg.p99_over_median) / 2.3263  # z of the 99th percentile
            resp = cfg.median * np.exp(sigma * z)
        elif cfg.kind == "pareto":
            u = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))  # correlated uniforms
            resp = cfg.median / 2 ** (1 / cfg.pareto_alpha) * (1 - u) ** (-1 / cfg.pareto_alpha)
        elif cfg.kind == "constant":
            resp = np.full((_BLOCK, self.n), cfg.median)
        else:
            assert self._empirical is not None
            resp = rng.choice(self._empirical, size=(_BLOCK, self.n))
        responses = np.clip(np.rint(resp * scale), 1, cfg.max_response).astype(np.int64)
        if cfg.kind == "constant":
            prompts = np.full(_BLOCK, cfg.prompt_median)
        return np.rint(prompts).astype(np.int64), responses


def _load_empirical(path: str) -> np.ndarray:
    """Response lengths, one integer per line or a JSON list."""
    text = Path(path).read_text().strip()
    values = np.array(text.strip("[]").replace(",", " ").split(), dtype=float)
    if values.size == 0:
        raise ValueError(f"lengths.empirical_path={path!r} holds no lengths")
    return values
