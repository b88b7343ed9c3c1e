"""The configuration's schema: one dataclass a section, whose defaults are the embedded CPU demo, each with the
checks of its own fields beside them (`check`, naming the field at fault). Imports nothing else of Laminar: the
names that registries own (tasks, schedules, samplers, tools) are checked when a config loads (`load.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what would be valid."""


@dataclass
class ModelConfig:
    path: str = ""  # local Hugging Face directory; empty = the demo's warm-start checkpoint (built on demand)
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.dtype in ("float32", "bfloat16"), "model.dtype", self.dtype, "float32 or bfloat16")
        _check(self.device in ("auto", "cpu", "cuda"), "model.device", self.device, "auto, cpu or cuda")
        if self.path:
            _check(
                Path(self.path).is_dir(),
                "model.path",
                self.path,
                "a local Hugging Face model directory (config.json + *.safetensors)",
            )


@dataclass
class TaskConfig:
    name: str = "reverse"  # a built-in task (`laminar.tasks.TASKS`; reverse is the demo) or a JSONL path
    # dotted path module:function, (response, row) or verl's compute_score; empty = the math reward for rows from
    # files, else the built-in task's own (laminar.rewards.stop.choose_reward)
    reward: str = ""
    reward_timeout_s: float = 30.0  # a reward call that runs longer scores 0 and is counted as a reward error
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

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        d = cfg.data
        _check(
            not (d.train_files and self.name.endswith(".jsonl")),
            "task.name",
            self.name,
            "not a .jsonl file when data.train_files is set (give the rows in one place)",
        )
        if self.reward:
            _check(":" in self.reward, "task.reward", self.reward, "a dotted path module:function")
        _check(self.num_prompts >= 1, "task.num_prompts", self.num_prompts, "at least 1")
        _check(
            self.reward_timeout_s > 0,
            "task.reward_timeout_s",
            self.reward_timeout_s,
            "a positive number of seconds",
        )
        _check(
            self.reward_fail_groups >= 0,
            "task.reward_fail_groups",
            self.reward_fail_groups,
            "0 (never stop) or a number of groups whose every reward failed, in a row, that stops the run",
        )
        _check(self.length_median >= 1, "task.length_median", self.length_median, "at least 1 token")
        _check(
            not self.lengths_file or Path(self.lengths_file).is_file(),
            "task.lengths_file",
            self.lengths_file,
            "an existing file of response lengths, one integer per line (or empty: lognormal lengths)",
        )
        _check(self.length_p99_ratio >= 1, "task.length_p99_ratio", self.length_p99_ratio, "at least 1")
        _check(
            self.length_prompt_words >= 1,
            "task.length_prompt_words",
            self.length_prompt_words,
            "at least 1 (digits in a lengths prompt)",
        )
        _check(
            self.max_turns >= 1,
            "task.max_turns",
            self.max_turns,
            "at least 1 (tool calls a trajectory may make)",
        )
        _check(
            self.max_tool_output_tokens >= 1,
            "task.max_tool_output_tokens",
            self.max_tool_output_tokens,
            "at least 1",
        )
        _check(
            self.tool_timeout_s > 0,
            "task.tool_timeout_s",
            self.tool_timeout_s,
            "a positive number of seconds",
        )
        _check(self.tool_workers >= 1, "task.tool_workers", self.tool_workers, "at least 1")
        _check(
            self.tool_calls_mean >= 0,
            "task.tool_calls_mean",
            self.tool_calls_mean,
            "0 (no calls) or a positive mean",
        )
        _check(
            self.tool_calls_min >= 0 and (self.tool_calls_min == 0 or self.tool_calls_mean > 0),
            "task.tool_calls_min",
            self.tool_calls_min,
            "0, or at least 1 with task.tool_calls_mean > 0 (the tool workload)",
        )
        _check(
            self.tool_calls_mean == 0 or self.name == "lengths",
            "task.tool_calls_mean",
            self.tool_calls_mean,
            "0 unless task.name=lengths (scripted calls are the benchmark workload's; real tasks use task.tools)",
        )
        _check(
            self.tool_latency_median_s >= 0,
            "task.tool_latency_median_s",
            self.tool_latency_median_s,
            ">= 0 seconds",
        )
        _check(
            self.tool_latency_p99_ratio >= 1,
            "task.tool_latency_p99_ratio",
            self.tool_latency_p99_ratio,
            "at least 1",
        )
        _check(self.tool_output_tokens >= 1, "task.tool_output_tokens", self.tool_output_tokens, "at least 1")


@dataclass
class DataConfig:
    # .jsonl files, .parquet files (verl's format) or datasets directories; empty = the rows of task.name
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)  # held-out rows for evaluation; empty = none
    chat_template: str = "auto"  # auto: template string prompts if the model has one | always | never
    system_prompt: str = ""  # prepended as a system message when a prompt is templated
    prompt_key: str = "prompt"  # the field that holds the prompt in the files

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        for name in ("train_files", "val_files"):
            for i, f in enumerate(getattr(self, name)):
                _check(
                    Path(f).exists(),
                    f"data.{name}[{i}]",
                    f,
                    "an existing .jsonl file, .parquet file or directory written by datasets' save_to_disk",
                )
        _check(
            self.chat_template in ("auto", "always", "never"),
            "data.chat_template",
            self.chat_template,
            "auto, always or never",
        )
        _check(
            bool(self.prompt_key),
            "data.prompt_key",
            self.prompt_key,
            "the name of the field that holds the prompt",
        )


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
    num_gpus: float = 0.0
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
    # speculation_max_batch and the group's draft tokens are accepted at least speculation_min_acceptance of the
    # time) | on
    speculation: str = "off"
    speculation_max_draft: int = 8  # most draft tokens a request verifies in one step
    speculation_max_batch: int = 16
    speculation_min_acceptance: float = 0.5

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        t = cfg.trainer
        _check(
            all(t >= 0 for t in self.stop_token_ids),
            "rollout.stop_token_ids",
            self.stop_token_ids,
            "token ids (non-negative integers)",
        )
        _check(self.replicas >= 1, "rollout.replicas", self.replicas, "at least 1")
        _check(self.groups_per_batch >= 1, "rollout.groups_per_batch", self.groups_per_batch, "at least 1")
        _check(
            self.max_num_seqs >= t.group_size,
            "rollout.max_num_seqs",
            self.max_num_seqs,
            f"at least trainer.group_size ({t.group_size}) so a group fits one replica",
        )
        _check(
            self.kv_blocks >= 4 and self.block_size >= 1,
            "rollout.kv_blocks",
            self.kv_blocks,
            "at least 4 blocks",
        )
        _check(
            self.temperature >= 0, "rollout.temperature", self.temperature, "0 (greedy) or a positive number"
        )
        _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", self.top_k, "0 (off) or a positive number of tokens")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "at least 1")
        _check(self.num_cpus > 0, "rollout.num_cpus", self.num_cpus, "a positive number of CPUs")
        _check(self.placement in ("pack", "spread"), "rollout.placement", self.placement, "pack or spread")
        _check(self.pipeline in ("auto", "on", "off"), "rollout.pipeline", self.pipeline, "auto, on or off")
        _check(
            self.speculation in ("off", "auto", "on"),
            "rollout.speculation",
            self.speculation,
            "off, auto or on",
        )
        _check(
            self.speculation_max_draft >= 1,
            "rollout.speculation_max_draft",
            self.speculation_max_draft,
            "at least 1 token",
        )
        _check(
            self.speculation_max_batch >= 1,
            "rollout.speculation_max_batch",
            self.speculation_max_batch,
            "at least 1",
        )
        _check(
            0 <= self.speculation_min_acceptance <= 1,
            "rollout.speculation_min_acceptance",
            self.speculation_min_acceptance,
            "in [0, 1]",
        )
        _check(
            self.max_failures_in_a_row >= 1,
            "rollout.max_failures_in_a_row",
            self.max_failures_in_a_row,
            "at least 1",
        )
        _check(
            self.start_timeout_s > 0,
            "rollout.start_timeout_s",
            self.start_timeout_s,
            "a positive number of seconds",
        )


# the loss's options (laminar/trainer/grpo.py; README "Algorithms"), named as verl names them
ADVANTAGES = ("grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
RATIOS = ("token", "sequence")
# LoRA's default targets: the attention and MLP projections of Llama, Qwen and Mistral models
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class TrainerConfig:
    steps: int = 160
    groups_per_step: int = 16
    group_size: int = 8
    lr: float = 6e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    micro_batch: int = 64  # sequences per forward/backward (longest first)
    micro_batch_tokens: int = (
        0  # > 0: micro-batches filled up to this many padded tokens instead of `micro_batch`
    )
    correction: str = "none"  # none | tis | mis (decoupled PPO with truncated / masked importance weights)
    is_cap: float = 2.0
    num_cpus: float = 1.0  # per trainer rank
    num_gpus: float = 0.0  # per trainer rank
    num_workers: int = 1  # trainer ranks: > 1 shards the policy with FSDP2 across them
    # pack: the ranks on one machine (one publish slot); spread: one rank a machine, and the ranks on other
    # machines than rank 0 send their rows to the master relay, which assembles each version
    placement: str = "pack"
    packing: str = "auto"  # on | off | auto (on CUDA): a micro-batch is one row of sequences, no padding
    activation_checkpointing: bool = (
        False  # recompute decoder layers in the backward: less memory, ~1/3 more time
    )
    cpu_offload: bool = False  # num_workers > 1: parameters, gradients and optimizer state in host memory
    compile: bool = False  # CUDA: each decoder layer through torch.compile (elementwise work fused)
    reshard_after_forward: bool = True  # num_workers > 1: false keeps each layer gathered until its backward
    checkpoint_every: int = 20
    warmup_steps: int = 2  # steps excluded from the throughput window
    max_nonfinite_steps: int = 3  # non-finite loss or gradient: steps skipped in a row before the run stops
    kl_coef: float = 0.0  # k3 penalty toward the reference (README: KL penalty); > 0 loads a frozen copy of the starting weights
    mini_batches: int = 1  # optimizer updates per trainer step (PPO-style); weights are published once a step
    filter_groups: bool = (
        False  # DAPO dynamic sampling: drop groups whose rewards are all equal, refill the step
    )
    filter_take_limit: int = 4  # filter_groups: take at most this many times groups_per_step groups a step
    advantage: str = "grpo"  # ADVANTAGES: grpo | drgrpo | rloo | reinforce_pp | reinforce_pp_baseline | gae
    # gae: PPO with a learned critic (a value model beside the policy, its own AdamW and checkpoint folder)
    critic_lr: float = 1e-5
    value_clip: float = 0.5  # the value loss's clip around the values the step started from
    gae_gamma: float = 1.0
    gae_lambda: float = 1.0
    loss_agg: str = "token_mean"  # LOSS_AGGS: token_mean | seq_mean_token_mean | seq_mean_token_sum_norm
    ratio: str = "token"  # RATIOS: token | sequence (GSPO: one length-normalised ratio a sequence)
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank, the base frozen; 0 = full fine-tuning
    lora_alpha: float = 16.0  # the adapters' scale is lora_alpha / lora_rank
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # or [all-linear]

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.steps >= 1, "trainer.steps", self.steps, "at least 1")
        _check(self.groups_per_step >= 1, "trainer.groups_per_step", self.groups_per_step, "at least 1")
        _check(
            self.group_size >= 2,
            "trainer.group_size",
            self.group_size,
            "at least 2 (GRPO compares samples of a group)",
        )
        _check(self.lr > 0, "trainer.lr", self.lr, "a positive learning rate")
        _check(
            0 < self.clip_low < 1,
            "trainer.clip_low",
            self.clip_low,
            "in (0, 1): the ratio's lower clip is 1 - clip_low",
        )
        _check(
            self.clip_high > 0,
            "trainer.clip_high",
            self.clip_high,
            "positive: the ratio's upper clip is 1 + clip_high",
        )
        _check(self.is_cap > 0, "trainer.is_cap", self.is_cap, "positive: the importance weight's cap")
        _check(
            self.correction in ("none", "tis", "mis"),
            "trainer.correction",
            self.correction,
            "none, tis or mis",
        )
        _check(self.micro_batch >= 1, "trainer.micro_batch", self.micro_batch, "at least 1")
        _check(self.packing in ("auto", "on", "off"), "trainer.packing", self.packing, "auto, on or off")
        _check(
            self.num_workers >= 1,
            "trainer.num_workers",
            self.num_workers,
            "at least 1 (ranks of the trainer)",
        )
        _check(
            self.num_workers == 1 or self.num_gpus == 0 or self.num_gpus > 0.5,
            "trainer.num_gpus",
            self.num_gpus,
            "more than 0.5 a rank with trainer.num_workers > 1, so no two ranks share a GPU (NCCL refuses that); "
            "a replica may take the rest of each GPU (rollout.num_gpus 0.4 beside 0.6)",
        )
        _check(self.placement in ("pack", "spread"), "trainer.placement", self.placement, "pack or spread")
        _check(
            self.placement == "pack" or self.num_workers > 1,
            "trainer.placement",
            self.placement,
            "pack with trainer.num_workers=1 (spread places several ranks one a machine)",
        )
        _check(
            not self.cpu_offload or self.num_workers > 1,
            "trainer.cpu_offload",
            self.cpu_offload,
            "false with trainer.num_workers=1 (offload is part of the sharded trainer)",
        )
        _check(
            self.reshard_after_forward or self.num_workers > 1,
            "trainer.reshard_after_forward",
            self.reshard_after_forward,
            "true with trainer.num_workers=1 (resharding is part of the sharded trainer)",
        )
        _check(
            self.micro_batch_tokens >= 0,
            "trainer.micro_batch_tokens",
            self.micro_batch_tokens,
            "0 (micro-batches of trainer.micro_batch sequences) or a number of padded tokens",
        )
        _check(
            self.kl_coef >= 0, "trainer.kl_coef", self.kl_coef, "0 (no reference model) or a positive number"
        )
        _check(
            1 <= self.mini_batches <= self.groups_per_step * self.group_size,
            "trainer.mini_batches",
            self.mini_batches,
            f"between 1 and the step's trajectories (groups_per_step x group_size = {self.groups_per_step * self.group_size})",
        )
        _check(self.filter_take_limit >= 1, "trainer.filter_take_limit", self.filter_take_limit, "at least 1")
        for name, valid in (("advantage", ADVANTAGES), ("loss_agg", LOSS_AGGS), ("ratio", RATIOS)):
            _check(
                getattr(self, name) in valid,
                f"trainer.{name}",
                getattr(self, name),
                f"one of {', '.join(valid)}",
            )
        _check(
            self.ratio == "token" or self.loss_agg == "seq_mean_token_mean",
            "trainer.loss_agg",
            self.loss_agg,
            "seq_mean_token_mean with trainer.ratio=sequence (GSPO averages over sequences)",
        )
        _check(
            self.advantage != "gae" or self.num_workers == 1,
            "trainer.advantage",
            self.advantage,
            "not gae with trainer.num_workers > 1 (the learned critic runs on one trainer rank)",
        )
        _check(
            self.critic_lr > 0,
            "trainer.critic_lr",
            self.critic_lr,
            "positive: the critic's AdamW learning rate",
        )
        _check(
            self.value_clip > 0,
            "trainer.value_clip",
            self.value_clip,
            "positive: how far a value may move in a step",
        )
        _check(0 < self.gae_gamma <= 1, "trainer.gae_gamma", self.gae_gamma, "in (0, 1]: GAE's discount")
        _check(0 <= self.gae_lambda <= 1, "trainer.gae_lambda", self.gae_lambda, "in [0, 1]: GAE's lambda")
        _check(
            self.lora_rank >= 0,
            "trainer.lora_rank",
            self.lora_rank,
            "0 (full fine-tuning) or the adapters' rank",
        )
        _check(
            self.lora_rank == 0 or self.num_workers == 1,
            "trainer.lora_rank",
            self.lora_rank,
            "0 with trainer.num_workers > 1 (LoRA runs on one trainer rank; the sharded trainer is full fine-tuning)",
        )
        _check(
            self.lora_alpha > 0,
            "trainer.lora_alpha",
            self.lora_alpha,
            "positive: the adapters' scale is alpha / rank",
        )
        _check(
            bool(self.lora_target_modules) and all(self.lora_target_modules),
            "trainer.lora_target_modules",
            self.lora_target_modules,
            f"module names to adapt, e.g. {list(LORA_TARGETS)} or [all-linear]",
        )
        _check(
            self.max_nonfinite_steps >= 1,
            "trainer.max_nonfinite_steps",
            self.max_nonfinite_steps,
            "at least 1",
        )


@dataclass
class RelayConfig:
    chunk_mb: float = 4.0
    slots: int = 3
    tls: bool = False  # relay links over mutual TLS with a per-run certificate (on top of the HMAC handshake)

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.chunk_mb > 0, "relay.chunk_mb", self.chunk_mb, "a positive size in MB")
        _check(self.slots >= 2, "relay.slots", self.slots, "at least 2 (one complete, one arriving)")


@dataclass
class RepackConfig:
    enabled: bool = True
    interval_s: float = 0.25  # the demo's batches drain in about a second; 5 s suits GPU-sized batches
    batch_limit_b: int = 16  # B: decode batch past which throughput stops growing (laminar bench engine)
    kv_capacity: float = 0.9  # C_max as a fraction of a replica's KV blocks
    # free only as many replicas as the dispatch rule has prompt groups for right now: packing slows the
    # packed tails, which pays only when a freed replica starts new work at once (false: free all it can)
    only_with_work: bool = True
    # which tails the release cap packs first: false = the oldest versions', true = the newest versions' (the
    # oldest, the staleness tail, keep running alone at their fastest)
    newest_first: bool = True
    max_age: int = 3  # leave replicas running work this many versions behind the trainer alone; -1 = none
    # a moved trajectory takes its cached keys and values along (the destination prefills nothing again);
    # false: it re-prefills its context there
    move_kv: bool = False
    # B when the gate caps a round below the replicas it could free (the dispatch bound, not the rollouts,
    # limits the work): packing slows every packed tail and the few freed replicas gain little; 0 = batch_limit_b
    capped_batch_limit_b: int = 0
    # a replica is a source once its KV has fallen below this share of its batch's peak (1.0: as soon as any
    # request finishes; 0.5: once half the batch's KV is freed): a request moved early pays the move longer
    ramp_down_frac: float = 1.0

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.interval_s > 0, "repack.interval_s", self.interval_s, "a positive number of seconds")
        _check(self.batch_limit_b >= 1, "repack.batch_limit_b", self.batch_limit_b, "at least 1")
        _check(0 < self.kv_capacity <= 1, "repack.kv_capacity", self.kv_capacity, "in (0, 1]")
        _check(
            self.capped_batch_limit_b >= 0,
            "repack.capped_batch_limit_b",
            self.capped_batch_limit_b,
            "0 (= batch_limit_b) or a running count",
        )
        _check(self.max_age >= -1, "repack.max_age", self.max_age, "-1 (none) or >= 0")
        _check(
            0.0 < self.ramp_down_frac <= 1.0,
            "repack.ramp_down_frac",
            self.ramp_down_frac,
            "in (0, 1]: 1.0 = a source as soon as its KV falls, 0.5 = once half its batch's KV is freed",
        )


@dataclass
class BufferConfig:
    # groups dispatched and not yet trained on, at most (flow control); 0 = three trainer steps' worth
    capacity_groups: int = 0
    # complete groups older than this are dropped when sampled; -1 = keep all (schedule.max_staleness bounds
    # staleness without dropping anything; stream/partial use schedule.staleness)
    max_staleness: int = -1
    # which complete groups the trainer takes: fifo (first completed), oldest (oldest version first: a lower
    # staleness tail), freshest, or module:function (laminar.data.experience_buffer.Sampler)
    sampler: str = "fifo"

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        t = cfg.trainer
        _check(
            self.capacity_groups >= t.groups_per_step,
            "buffer.capacity_groups",
            self.capacity_groups,
            f"0 (three trainer steps) or at least trainer.groups_per_step ({t.groups_per_step})",
        )


@dataclass
class ScheduleConfig:
    name: str = "laminar"
    staleness: int = 2  # k for stream / partial
    global_push: bool = False  # laminar ablation: wait for every relay to hold each version (a global push)
    # laminar: a replica more than this many versions behind the trainer gets no new work until it pulls
    # (0: every group starts on the newest version); -1 = no bound
    max_lag: int = 0
    # laminar: no group is trained more than this many versions after the one that generated it (new work waits
    # while an old group's long tail runs; `Dispatch.max_staleness`); -1 = no bound
    max_staleness: int = 4

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.staleness >= 0, "schedule.staleness", self.staleness, "a non-negative integer")
        _check(self.max_lag >= -1, "schedule.max_lag", self.max_lag, "-1 (no bound) or >= 0")
        _check(
            self.max_staleness >= -1,
            "schedule.max_staleness",
            self.max_staleness,
            "-1 (no bound) or >= 0",
        )


@dataclass
class EvalConfig:
    every: int = 0  # trainer steps between evaluations of the held-out set; 0 = no evaluation
    at_start: bool = True  # also evaluate the starting weights (version 0, or the resumed version)
    num_prompts: int = 128  # held-out prompts per evaluation (the first ones of the held-out set)
    n: int = 1  # samples per prompt (pass@n when > 1)
    temperature: float = 0.0  # 0 = greedy; must be > 0 when n > 1
    max_new_tokens: int = 0  # 0 = rollout.max_new_tokens
    correct_at: float = 1.0  # a sample counts as correct when its reward is at least this
    targets: list[float] = field(
        default_factory=lambda: [0.5]
    )  # accuracies whose first wall time is reported
    final_timeout_s: float = 300.0  # how long the end of the run waits for evaluations still running

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.every >= 0, "eval.every", self.every, "0 (no evaluation) or a number of trainer steps")
        _check(self.num_prompts >= 1, "eval.num_prompts", self.num_prompts, "at least 1")
        _check(self.n >= 1, "eval.n", self.n, "at least 1 sample per prompt")
        _check(self.temperature >= 0, "eval.temperature", self.temperature, "0 (greedy) or a positive number")
        _check(
            self.n == 1 or self.temperature > 0,
            "eval.temperature",
            self.temperature,
            f"positive when eval.n={self.n} (greedy samples of one prompt are all the same)",
        )
        _check(
            self.max_new_tokens >= 0,
            "eval.max_new_tokens",
            self.max_new_tokens,
            "0 (rollout's) or a positive number",
        )
        _check(
            isinstance(self.targets, list) and all(isinstance(x, int | float) for x in self.targets),
            "eval.targets",
            self.targets,
            "a list of accuracies, self.g. [0.3, 0.5]",
        )


@dataclass
class RunConfig:
    out: str = "runs/demo"
    seed: int = 0
    timeout_s: float = 120.0  # longest any single wait may take before the run fails with a message
    ray_address: str = ""  # empty = start a local Ray instance
    num_cpus: int = 0  # logical CPUs for a local Ray instance; 0 = enough for the configured actors
    # trained trajectories (token ids, the response text, versions, rewards) to trajectories.jsonl
    save_trajectories: bool = True
    wandb_project: str = ""  # set: also log to Weights & Biases (offline unless WANDB_MODE=online)
    export: str = ""  # at the end, also the final weights as a Hugging Face dir RUN_DIR/model in this dtype
    # every this many trainer steps, a few of the step's trajectories as text (prompt, response, reward) to
    # samples.jsonl, TensorBoard and W&B; 0 = none
    samples_every: int = 10
    samples_per_step: int = 4
    # true: also Ray's INFO lines and its async-actor warning, and transformers' progress bars and warnings
    verbose: bool = False

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        _check(self.timeout_s > 0, "run.timeout_s", self.timeout_s, "a positive number of seconds")
        _check(
            self.export in ("", "float32", "bfloat16", "float16"),
            "run.export",
            self.export,
            "'' (no export) or the dtype of RUN_DIR/model: float32, bfloat16 or float16",
        )
        _check(
            self.samples_every >= 0,
            "run.samples_every",
            self.samples_every,
            "0 (no samples) or a number of trainer steps",
        )
        _check(self.samples_per_step >= 1, "run.samples_per_step", self.samples_per_step, "at least 1")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    repack: RepackConfig = field(default_factory=RepackConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


HIGH_LR = 1e-4
HIGH_LORA_LR = 1e-3  # LoRA adapters start at zero and take rates 10-100x a full fine-tune's (2e-4 is usual)


def _check(ok: bool, path: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{path}={value!r} is invalid: {valid}")


def lr_warning(cfg: Config) -> str | None:
    """The one line a real model's run prints when its learning rate is the demo's kind (the run goes on). A
    random-initialised model (`python -m laminar.engine.random_model`, which leaves `random_model.json`) has
    nothing pretrained to wreck: the throughput benchmarks run those."""
    lora = cfg.trainer.lora_rank > 0
    limit = HIGH_LORA_LR if lora else HIGH_LR
    if not cfg.model.path or cfg.trainer.lr <= limit:
        return None
    if (Path(cfg.model.path) / "random_model.json").is_file():
        return None
    advice = (
        "use 1e-4 to 5e-4 for LoRA adapters" if lora else "use 1e-6 to 1e-5 (LoRA adapters take 1e-4 to 5e-4)"
    )
    return (
        f"warning: trainer.lr={cfg.trainer.lr:g} with model.path set: learning rates above {limit:g} (the demo's "
        f"is 6e-4) wreck a pretrained model in a few steps; {advice}"
    )
