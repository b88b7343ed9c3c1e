"""The `trainer` section: the step, the loss and its options, sharding, LoRA and PPO's critic, each checked beside
its field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laminar.config.checks import check_field

ADVANTAGES = ("grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
RATIOS = ("token", "sequence")
# LoRA's default targets: the attention and MLP projections of Llama, Qwen and Mistral models
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# what a LoRA publish sends the replicas: the merged model in the base layout, or the adapters alone, which each
# replica adds to the base it loaded from model.path
LORA_PUBLISH = ("merged", "adapters")


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
    # false: no checkpoint when the run ends or stops (a throughput run of a large model, whose sharded
    # optimizer state takes minutes to write; such a run cannot be resumed)
    checkpoint_at_end: bool = True
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
    lora_publish: str = "merged"  # LORA_PUBLISH: merged | adapters (the replicas add B A to their base)

    @property
    def publishes_adapters(self) -> bool:
        """LoRA whose publishes are the adapters alone, which the replicas add to the base they loaded."""
        return self.lora_rank > 0 and self.lora_publish == "adapters"

    def check(self, cfg: Any) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong (`cfg`: the whole `Config`, for
        the fields of other sections this one depends on)."""
        check_field(self.steps >= 1, "trainer.steps", self.steps, "at least 1")
        check_field(self.groups_per_step >= 1, "trainer.groups_per_step", self.groups_per_step, "at least 1")
        check_field(
            self.group_size >= 2,
            "trainer.group_size",
            self.group_size,
            "at least 2 (GRPO compares samples of a group)",
        )
        check_field(self.lr > 0, "trainer.lr", self.lr, "a positive learning rate")
        check_field(
            0 < self.clip_low < 1,
            "trainer.clip_low",
            self.clip_low,
            "in (0, 1): the ratio's lower clip is 1 - clip_low",
        )
        check_field(
            self.clip_high > 0,
            "trainer.clip_high",
            self.clip_high,
            "positive: the ratio's upper clip is 1 + clip_high",
        )
        check_field(self.is_cap > 0, "trainer.is_cap", self.is_cap, "positive: the importance weight's cap")
        check_field(
            self.correction in ("none", "tis", "mis"),
            "trainer.correction",
            self.correction,
            "none, tis or mis",
        )
        check_field(self.micro_batch >= 1, "trainer.micro_batch", self.micro_batch, "at least 1")
        check_field(self.packing in ("auto", "on", "off"), "trainer.packing", self.packing, "auto, on or off")
        check_field(
            self.num_workers >= 1,
            "trainer.num_workers",
            self.num_workers,
            "at least 1 (ranks of the trainer)",
        )
        check_field(
            self.num_workers == 1 or self.num_gpus == 0 or self.num_gpus > 0.5,
            "trainer.num_gpus",
            self.num_gpus,
            "more than 0.5 a rank with trainer.num_workers > 1, so no two ranks share a GPU (NCCL refuses that); "
            "a replica may take the rest of each GPU (rollout.num_gpus 0.4 beside 0.6)",
        )
        check_field(
            self.placement in ("pack", "spread"), "trainer.placement", self.placement, "pack or spread"
        )
        check_field(
            self.placement == "pack" or self.num_workers > 1,
            "trainer.placement",
            self.placement,
            "pack with trainer.num_workers=1 (spread places several ranks one a machine)",
        )
        check_field(
            not self.cpu_offload or self.num_workers > 1,
            "trainer.cpu_offload",
            self.cpu_offload,
            "false with trainer.num_workers=1 (offload is part of the sharded trainer)",
        )
        check_field(
            self.reshard_after_forward or self.num_workers > 1,
            "trainer.reshard_after_forward",
            self.reshard_after_forward,
            "true with trainer.num_workers=1 (resharding is part of the sharded trainer)",
        )
        check_field(
            self.micro_batch_tokens >= 0,
            "trainer.micro_batch_tokens",
            self.micro_batch_tokens,
            "0 (micro-batches of trainer.micro_batch sequences) or a number of padded tokens",
        )
        check_field(
            self.kl_coef >= 0, "trainer.kl_coef", self.kl_coef, "0 (no reference model) or a positive number"
        )
        check_field(
            1 <= self.mini_batches <= self.groups_per_step * self.group_size,
            "trainer.mini_batches",
            self.mini_batches,
            f"between 1 and the step's trajectories (groups_per_step x group_size = {self.groups_per_step * self.group_size})",
        )
        check_field(
            self.filter_take_limit >= 1, "trainer.filter_take_limit", self.filter_take_limit, "at least 1"
        )
        for name, valid in (("advantage", ADVANTAGES), ("loss_agg", LOSS_AGGS), ("ratio", RATIOS)):
            check_field(
                getattr(self, name) in valid,
                f"trainer.{name}",
                getattr(self, name),
                f"one of {', '.join(valid)}",
            )
        check_field(
            self.ratio == "token" or self.loss_agg == "seq_mean_token_mean",
            "trainer.loss_agg",
            self.loss_agg,
            "seq_mean_token_mean with trainer.ratio=sequence (GSPO averages over sequences)",
        )
        check_field(
            self.critic_lr > 0,
            "trainer.critic_lr",
            self.critic_lr,
            "positive: the critic's AdamW learning rate",
        )
        check_field(
            self.value_clip > 0,
            "trainer.value_clip",
            self.value_clip,
            "positive: how far a value may move in a step",
        )
        check_field(0 < self.gae_gamma <= 1, "trainer.gae_gamma", self.gae_gamma, "in (0, 1]: GAE's discount")
        check_field(
            0 <= self.gae_lambda <= 1, "trainer.gae_lambda", self.gae_lambda, "in [0, 1]: GAE's lambda"
        )
        check_field(
            self.lora_rank >= 0,
            "trainer.lora_rank",
            self.lora_rank,
            "0 (full fine-tuning) or the adapters' rank",
        )
        check_field(
            self.lora_rank == 0 or self.num_workers == 1,
            "trainer.lora_rank",
            self.lora_rank,
            "0 with trainer.num_workers > 1 (LoRA runs on one trainer rank; the sharded trainer is full fine-tuning)",
        )
        check_field(
            self.lora_alpha > 0,
            "trainer.lora_alpha",
            self.lora_alpha,
            "positive: the adapters' scale is alpha / rank",
        )
        check_field(
            bool(self.lora_target_modules) and all(self.lora_target_modules),
            "trainer.lora_target_modules",
            self.lora_target_modules,
            f"module names to adapt, e.g. {list(LORA_TARGETS)} or [all-linear]",
        )
        check_field(
            self.lora_publish in LORA_PUBLISH,
            "trainer.lora_publish",
            self.lora_publish,
            f"one of {list(LORA_PUBLISH)} (merged: the whole model, adapters: A and B alone, added to the "
            "replicas' base)",
        )
        check_field(
            self.max_nonfinite_steps >= 1,
            "trainer.max_nonfinite_steps",
            self.max_nonfinite_steps,
            "at least 1",
        )
