"""The `task` section: the built-in task or the user's rows, its reward, and the knobs of the built-in tasks, each
checked beside its field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laminar.config.checks import check_field


@dataclass
class TaskConfig:
    name: str = "reverse"  # a built-in task (`laminar.tasks.TASKS`; reverse is the demo) or a JSONL path
    # dotted path module:function, (response, row) or verl's compute_score; empty = the math reward for rows from
    # files, else the built-in task's own (laminar.rewards.stop.choose_reward)
    reward: str = ""
    reward_timeout_s: float = 30.0  # a reward call that runs longer scores 0 and is counted as a reward error
    # worker processes a replica scores in (spawned once, kept): more for slow rewards (a sandboxed test run)
    reward_processes: int = 2
    # every reward of this many groups in a row failed (raised, timed out, not a finite number): the run stops
    # with the error; 0 = never
    reward_fail_groups: int = 8
    num_prompts: int = 4096
    seed: int = 0
    # the `lengths` workload (benchmarks): response lengths fixed per prompt, end-of-sequence ignored
    length_median: int = 64
    length_p99_ratio: float = 10.0
    lengths_file: str = ""
    length_prompt_words: int = 16  # the prompt: this many random digits (about a token each) and " ="
    arith_levels: str = "1,2"  # the `arith` task: comma-separated levels (laminar.tasks.arith.LEVELS)
    # the `chain` task: comma-separated levels (laminar.tasks.chain.LEVELS), and its steps a problem (lognormal)
    chain_levels: str = "1,2"
    chain_steps_median: float = 4.0
    chain_steps_p99: float = 40.0
    # multi-turn tool calls: built-in names (python, calculator) or module:function; empty = single turn
    tools: list[str] = field(default_factory=list)
    max_turns: int = 4  # tool calls a trajectory may make
    max_tool_output_tokens: int = 256  # a tool's output is cut to this many context tokens
    tool_timeout_s: float = (
        10.0  # wall clock of one python call (the sandbox's other limits are its defaults)
    )
    tool_workers: int = 4  # tool calls a replica runs at once, off its decode loop
    # the `lengths` workload with tool turns (benchmarks): calls per response (geometric mean; 0 = none),
    # each call's latency (lognormal), and the context tokens it returns
    tool_calls_mean: float = 0.0
    tool_calls_min: int = 0  # every response makes at least this many (the draw is raised to it)
    tool_latency_median_s: float = 0.5
    tool_latency_p99_ratio: float = 10.0
    tool_output_tokens: int = 32

    def check(self, cfg: Any) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong (`cfg`: the whole `Config`, for
        the fields of other sections this one depends on)."""
        d = cfg.data
        check_field(
            not (d.train_files and self.name.endswith(".jsonl")),
            "task.name",
            self.name,
            "not a .jsonl file when data.train_files is set (give the rows in one place)",
        )
        if self.reward:
            check_field(":" in self.reward, "task.reward", self.reward, "a dotted path module:function")
        check_field(self.num_prompts >= 1, "task.num_prompts", self.num_prompts, "at least 1")
        check_field(
            self.reward_timeout_s > 0,
            "task.reward_timeout_s",
            self.reward_timeout_s,
            "a positive number of seconds",
        )
        check_field(
            self.reward_processes >= 1,
            "task.reward_processes",
            self.reward_processes,
            "at least 1 worker process a replica",
        )
        check_field(
            self.reward_fail_groups >= 0,
            "task.reward_fail_groups",
            self.reward_fail_groups,
            "0 (never stop) or a number of groups whose every reward failed, in a row, that stops the run",
        )
        check_field(self.length_median >= 1, "task.length_median", self.length_median, "at least 1 token")
        check_field(
            not self.lengths_file or Path(self.lengths_file).is_file(),
            "task.lengths_file",
            self.lengths_file,
            "an existing file of response lengths, one integer per line (or empty: lognormal lengths)",
        )
        check_field(self.length_p99_ratio >= 1, "task.length_p99_ratio", self.length_p99_ratio, "at least 1")
        check_field(
            self.length_prompt_words >= 1,
            "task.length_prompt_words",
            self.length_prompt_words,
            "at least 1 (digits in a lengths prompt)",
        )
        check_field(
            self.max_turns >= 1,
            "task.max_turns",
            self.max_turns,
            "at least 1 (tool calls a trajectory may make)",
        )
        check_field(
            self.max_tool_output_tokens >= 1,
            "task.max_tool_output_tokens",
            self.max_tool_output_tokens,
            "at least 1",
        )
        check_field(
            self.tool_timeout_s > 0,
            "task.tool_timeout_s",
            self.tool_timeout_s,
            "a positive number of seconds",
        )
        check_field(self.tool_workers >= 1, "task.tool_workers", self.tool_workers, "at least 1")
        check_field(
            self.tool_calls_mean >= 0,
            "task.tool_calls_mean",
            self.tool_calls_mean,
            "0 (no calls) or a positive mean",
        )
        check_field(
            self.tool_calls_min >= 0 and (self.tool_calls_min == 0 or self.tool_calls_mean > 0),
            "task.tool_calls_min",
            self.tool_calls_min,
            "0, or at least 1 with task.tool_calls_mean > 0 (the tool workload)",
        )
        check_field(
            self.tool_calls_mean == 0 or self.name == "lengths",
            "task.tool_calls_mean",
            self.tool_calls_mean,
            "0 unless task.name=lengths (scripted calls are the benchmark workload's; real tasks use task.tools)",
        )
        check_field(
            self.tool_latency_median_s >= 0,
            "task.tool_latency_median_s",
            self.tool_latency_median_s,
            ">= 0 seconds",
        )
        check_field(
            self.tool_latency_p99_ratio >= 1,
            "task.tool_latency_p99_ratio",
            self.tool_latency_p99_ratio,
            "at least 1",
        )
        check_field(
            self.tool_output_tokens >= 1, "task.tool_output_tokens", self.tool_output_tokens, "at least 1"
        )
