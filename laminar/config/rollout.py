"""The `rollout` section: the replicas, their engines and how they sample, each checked beside its field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laminar.config.checks import check_field


@dataclass
class RolloutConfig:
    replicas: int = 3
    groups_per_batch: int = 4  # prompt groups a replica takes at once
    max_num_seqs: int = 64
    kv_blocks: int = 256
    block_size: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 48  # the reverse task needs at most 41
    stop_token_ids: list[int] = field(default_factory=list)  # ends beside the model's own (config files, EOS)
    num_cpus: float = 0.5
    num_gpus: float = 0.0  # a replica's share of a GPU; with tensor_parallel > 1, each rank's (1 on CUDA)
    # ranks a replica spans (laminar/engine/tensor_parallel.py): N Ray actors, one GPU each on CUDA, packed on one
    # machine in one placement group, the network's heads and MLP columns split between them
    tensor_parallel: int = 1
    progress_every: int = 8  # engine steps between progress reports to the partial response pool
    heartbeat_s: float = 1.0
    dead_after_s: float = 15.0  # a replica or relay that does not answer for this long is replaced
    max_failures_in_a_row: int = 3  # replica loops raising the same error this often stop the run with it
    # longest a replica's start may take: the model loaded, the engine warmed up, its CUDA graphs captured (and
    # on a machine's first run its kernels compiled, several replicas at once)
    start_timeout_s: float = 600.0
    placement: str = "pack"  # pack: Ray's default (fill the driver's machine first); spread: across machines
    # each decode step queued before the last one's tokens reach the host: auto (where decode runs as CUDA
    # graphs) | on | off
    pipeline: str = "auto"
    # grouped speculative decoding (laminar/engine/drafter.py): draft tokens from the group's text, verified in
    # the decode step; samples unchanged. off | auto (only while the running batch is at most
    # speculation_max_batch, for groups whose draft tokens are accepted at least speculation_min_acceptance of
    # the time, and in steps where verifying is measured faster a token than plain decoding at that batch size:
    # laminar/engine/gate.py) | on
    speculation: str = "off"
    speculation_max_draft: int = 8  # most draft tokens a request verifies in one step
    speculation_max_batch: int = 16
    speculation_min_acceptance: float = 0.5
    # auto, until both paths are measured: a verify step's time in plain decode steps (speculate where a verify
    # step is expected to emit more tokens a request than this)
    speculation_cost_ratio: float = 2.0

    def check(self, cfg: Any) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong (`cfg`: the whole `Config`, for
        the fields of other sections this one depends on)."""
        t = cfg.trainer
        check_field(
            all(t >= 0 for t in self.stop_token_ids),
            "rollout.stop_token_ids",
            self.stop_token_ids,
            "token ids (non-negative integers)",
        )
        check_field(self.replicas >= 1, "rollout.replicas", self.replicas, "at least 1")
        check_field(
            self.groups_per_batch >= 1, "rollout.groups_per_batch", self.groups_per_batch, "at least 1"
        )
        check_field(
            self.max_num_seqs >= t.group_size,
            "rollout.max_num_seqs",
            self.max_num_seqs,
            f"at least trainer.group_size ({t.group_size}) so a group fits one replica",
        )
        check_field(
            self.kv_blocks >= 4 and self.block_size >= 1,
            "rollout.kv_blocks",
            self.kv_blocks,
            "at least 4 blocks",
        )
        check_field(
            self.temperature >= 0, "rollout.temperature", self.temperature, "0 (greedy) or a positive number"
        )
        check_field(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        check_field(self.top_k >= 0, "rollout.top_k", self.top_k, "0 (off) or a positive number of tokens")
        check_field(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "at least 1")
        check_field(self.num_cpus > 0, "rollout.num_cpus", self.num_cpus, "a positive number of CPUs")
        check_field(
            self.placement in ("pack", "spread"), "rollout.placement", self.placement, "pack or spread"
        )
        self.check_tensor_parallel(cfg)
        check_field(
            self.pipeline in ("auto", "on", "off"), "rollout.pipeline", self.pipeline, "auto, on or off"
        )
        check_field(
            self.speculation in ("off", "auto", "on"),
            "rollout.speculation",
            self.speculation,
            "off, auto or on",
        )
        check_field(
            self.speculation_max_draft >= 1,
            "rollout.speculation_max_draft",
            self.speculation_max_draft,
            "at least 1 token",
        )
        check_field(
            self.speculation_max_batch >= 1,
            "rollout.speculation_max_batch",
            self.speculation_max_batch,
            "at least 1",
        )
        check_field(
            0 <= self.speculation_min_acceptance <= 1,
            "rollout.speculation_min_acceptance",
            self.speculation_min_acceptance,
            "in [0, 1]",
        )
        check_field(
            self.speculation_cost_ratio > 0,
            "rollout.speculation_cost_ratio",
            self.speculation_cost_ratio,
            "greater than 0",
        )
        check_field(
            self.max_failures_in_a_row >= 1,
            "rollout.max_failures_in_a_row",
            self.max_failures_in_a_row,
            "at least 1",
        )
        check_field(
            self.start_timeout_s > 0,
            "rollout.start_timeout_s",
            self.start_timeout_s,
            "a positive number of seconds",
        )

    def check_tensor_parallel(self, cfg: Any) -> None:
        """What a replica of several ranks needs of the rest of the config (the model's heads are checked where
        the model is read: `laminar.preflight`)."""
        n = self.tensor_parallel
        check_field(
            isinstance(n, int) and n >= 1, "rollout.tensor_parallel", n, "a whole number of ranks, at least 1"
        )
        if n == 1:
            return
        check_field(
            self.num_gpus in (0, 1),
            "rollout.num_gpus",
            self.num_gpus,
            f"0 (CPU) or 1 with rollout.tensor_parallel={n}: each rank of a tensor-parallel replica holds one "
            "whole GPU (two ranks on one GPU cannot all-reduce through NCCL)",
        )
        check_field(
            self.placement == "pack",
            "rollout.placement",
            self.placement,
            f"pack with rollout.tensor_parallel={n}: each replica's ranks are one placement group on one "
            "machine, placed where it fits",
        )
        check_field(
            self.speculation == "off",
            "rollout.speculation",
            self.speculation,
            f"off with rollout.tensor_parallel={n}: the ranks must make the same choice every step, and auto's "
            "gate chooses by each rank's own clock",
        )
        check_field(
            not cfg.trainer.publishes_adapters,
            "trainer.lora_publish",
            cfg.trainer.lora_publish,
            f"merged with rollout.tensor_parallel={n}: a tensor-parallel engine takes whole versions only "
            "(each rank its slices)",
        )


# the loss's options (laminar/trainer/grpo.py; README "Algorithms"), named as verl names them
