"""The configuration's schema: one dataclass a section, whose defaults are the embedded CPU demo, each with the
checks of its own fields beside them (`check`, naming the field at fault); the three large sections have a module
each (`task.py`, `rollout.py`, `trainer.py`). Imports nothing else of Laminar: the
names that registries own (tasks, schedules, samplers, tools) are checked when a config loads (`load.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laminar.config.checks import NONE_OR_COUNT, check_field
from laminar.config.rollout import RolloutConfig
from laminar.config.task import TaskConfig
from laminar.config.trainer import TrainerConfig


@dataclass
class ModelConfig:
    path: str = ""  # local Hugging Face directory; empty = the demo's warm-start checkpoint (built on demand)
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        check_field(self.dtype in ("float32", "bfloat16"), "model.dtype", self.dtype, "float32 or bfloat16")
        check_field(self.device in ("auto", "cpu", "cuda"), "model.device", self.device, "auto, cpu or cuda")
        if self.path:
            check_field(
                Path(self.path).is_dir(),
                "model.path",
                self.path,
                "a local Hugging Face model directory (config.json + *.safetensors)",
            )


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
                check_field(
                    Path(f).exists(),
                    f"data.{name}[{i}]",
                    f,
                    "an existing .jsonl file, .parquet file or directory written by datasets' save_to_disk",
                )
        check_field(
            self.chat_template in ("auto", "always", "never"),
            "data.chat_template",
            self.chat_template,
            "auto, always or never",
        )
        check_field(
            bool(self.prompt_key),
            "data.prompt_key",
            self.prompt_key,
            "the name of the field that holds the prompt",
        )


@dataclass
class RelayConfig:
    chunk_mb: float = 4.0
    slots: int = 3
    tls: bool = False  # relay links over mutual TLS with a per-run certificate (on top of the HMAC handshake)

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        check_field(self.chunk_mb > 0, "relay.chunk_mb", self.chunk_mb, "a positive size in MB")
        check_field(self.slots >= 2, "relay.slots", self.slots, "at least 2 (one complete, one arriving)")


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
    # leave replicas running work this many versions behind the trainer alone; null = none (-1 reads as null)
    max_age: int | None = 3
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
        check_field(self.interval_s > 0, "repack.interval_s", self.interval_s, "a positive number of seconds")
        check_field(self.batch_limit_b >= 1, "repack.batch_limit_b", self.batch_limit_b, "at least 1")
        check_field(0 < self.kv_capacity <= 1, "repack.kv_capacity", self.kv_capacity, "in (0, 1]")
        check_field(
            self.capped_batch_limit_b >= 0,
            "repack.capped_batch_limit_b",
            self.capped_batch_limit_b,
            "0 (= batch_limit_b) or a running count",
        )
        check_field(self.max_age is None or self.max_age >= 0, "repack.max_age", self.max_age, NONE_OR_COUNT)
        check_field(
            0.0 < self.ramp_down_frac <= 1.0,
            "repack.ramp_down_frac",
            self.ramp_down_frac,
            "in (0, 1]: 1.0 = a source as soon as its KV falls, 0.5 = once half its batch's KV is freed",
        )


@dataclass
class BufferConfig:
    # groups dispatched and not yet trained on, at most (flow control); 0 = three trainer steps' worth
    capacity_groups: int = 0
    # complete groups older than this are dropped when sampled; null = keep all (schedule.max_staleness bounds
    # staleness without dropping anything; stream/partial use schedule.staleness); -1 reads as null
    max_staleness: int | None = None
    # which complete groups the trainer takes: fifo (first completed), oldest (oldest version first: a lower
    # staleness tail), freshest, or module:function (laminar.data.experience_buffer.Sampler)
    sampler: str = "fifo"

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        t = cfg.trainer
        check_field(
            self.capacity_groups >= t.groups_per_step,
            "buffer.capacity_groups",
            self.capacity_groups,
            f"0 (three trainer steps) or at least trainer.groups_per_step ({t.groups_per_step})",
        )
        check_field(
            self.max_staleness is None or self.max_staleness >= 0,
            "buffer.max_staleness",
            self.max_staleness,
            NONE_OR_COUNT,
        )


@dataclass
class ScheduleConfig:
    name: str = "laminar"
    staleness: int = 2  # k for stream / partial
    global_push: bool = False  # laminar ablation: wait for every relay to hold each version (a global push)
    # laminar: a replica more than this many versions behind the trainer gets no new work until it pulls
    # (0: every group starts on the newest version); null = no bound (-1 reads as null)
    max_lag: int | None = 0
    # laminar: no group is trained more than this many versions after the one that generated it (new work waits
    # while an old group's long tail runs; `Dispatch.max_staleness`); null = no bound (-1 reads as null)
    max_staleness: int | None = 4

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        check_field(self.staleness >= 0, "schedule.staleness", self.staleness, "a non-negative integer")
        check_field(
            self.max_lag is None or self.max_lag >= 0, "schedule.max_lag", self.max_lag, NONE_OR_COUNT
        )
        check_field(
            self.max_staleness is None or self.max_staleness >= 0,
            "schedule.max_staleness",
            self.max_staleness,
            NONE_OR_COUNT,
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
        check_field(
            self.every >= 0, "eval.every", self.every, "0 (no evaluation) or a number of trainer steps"
        )
        check_field(self.num_prompts >= 1, "eval.num_prompts", self.num_prompts, "at least 1")
        check_field(self.n >= 1, "eval.n", self.n, "at least 1 sample per prompt")
        check_field(
            self.temperature >= 0, "eval.temperature", self.temperature, "0 (greedy) or a positive number"
        )
        check_field(
            self.n == 1 or self.temperature > 0,
            "eval.temperature",
            self.temperature,
            f"positive when eval.n={self.n} (greedy samples of one prompt are all the same)",
        )
        check_field(
            self.max_new_tokens >= 0,
            "eval.max_new_tokens",
            self.max_new_tokens,
            "0 (rollout's) or a positive number",
        )
        check_field(
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
    # the PNG plots of the run at the end (reward, throughput, staleness, replicas, eval); false for sweeps that
    # read only summary.json and metrics.jsonl (`laminar plot RUN_DIR` draws them later from metrics.jsonl)
    plots: bool = True
    # refuse, before Ray starts, a run whose memory estimate (weights, KV cache, optimizer, activations, relay
    # slots; printed at the start) is more than this machine has; false: a warning, and the run starts
    check_memory: bool = True

    def check(self, cfg: Config) -> None:
        """Raise `ConfigError` naming the first field of this section that is wrong."""
        check_field(self.timeout_s > 0, "run.timeout_s", self.timeout_s, "a positive number of seconds")
        check_field(
            self.export in ("", "float32", "bfloat16", "float16"),
            "run.export",
            self.export,
            "'' (no export) or the dtype of RUN_DIR/model: float32, bfloat16 or float16",
        )
        check_field(
            self.samples_every >= 0,
            "run.samples_every",
            self.samples_every,
            "0 (no samples) or a number of trainer steps",
        )
        check_field(self.samples_per_step >= 1, "run.samples_per_step", self.samples_per_step, "at least 1")


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


def lr_warning(cfg: Config) -> str | None:
    """The one line a real model's run prints when its learning rate is the demo's kind (the run goes on). A
    random-initialised model (`python -m laminar.bench.random_model`, which leaves `random_model.json`) has
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


def correction_warning(cfg: Config) -> str | None:
    """The one line a run prints when decoupled PPO (`trainer.correction` tis or mis) takes a single update a step:
    its ratio is then against the trainer's own log-probs of that very update, 1 on every token, so the clip never
    binds, and the sampler's drift is weighted (up to `is_cap`) but never clipped as `correction=none` clips it."""
    t = cfg.trainer
    if t.correction == "none" or t.mini_batches > 1:
        return None
    return (
        f"warning: trainer.correction={t.correction} with trainer.mini_batches=1: the ratio is taken against the "
        "trainer's own log-probs of the same update, so the PPO clip never binds (clip_frac 0) and stale tokens "
        "are weighted, not clipped; on the chain task at staleness up to 4 it learned less per step than "
        "trainer.correction=none (README: Decoupled PPO)"
    )
