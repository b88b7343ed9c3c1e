"""The trainer: a Hugging Face policy, AdamW and the GRPO step; plain Python (the runtime wraps it in an actor)."""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from laminar.config import RolloutConfig, TrainerConfig
from laminar.data.codec import copy_tokenizer_files
from laminar.data.records import Trajectory
from laminar.data.staleness import staleness
from laminar.trainer import lora
from laminar.trainer.critic import DIR as CRITIC_DIR
from laminar.trainer.critic import Critic
from laminar.trainer.grpo import (
    LOSS_METRICS,
    GRPOConfig,
    advantages,
    gae,
    grpo_loss,
    value_loss,
    whiten_tokens,
)
from laminar.trainer.logprobs import PolicyLogprobs
from laminar.trainer.packing import supports_packing, use_packed_attention
from laminar.trainer.state_files import (
    MOMENTS,
    OPTIMIZER_DIR,
    CheckpointError,
    load_tensors,
    load_trainer_state,
    save_sharded,
    save_tensors,
    save_trainer_state,
)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class NonFiniteError(RuntimeError):
    """Training met non-finite numbers it cannot skip: too many bad steps in a row, or non-finite weights."""


class ModelPathError(FileNotFoundError):
    """The model path is not a loadable Hugging Face model directory; the message says what is missing."""


def check_model_dir(path: str | Path) -> Path:
    hint = "a Hugging Face model directory with config.json and model.safetensors (make the demo's with `laminar warmup --out DIR`)"
    if not str(path):
        raise ModelPathError(f"no model path given; expected {hint}")
    path = Path(path)
    if not path.exists():
        raise ModelPathError(f"model path {path} does not exist; expected {hint}")
    if not path.is_dir():
        raise ModelPathError(f"model path {path} is a file; pass the directory that holds it, i.e. {hint}")
    have = sorted(p.name for p in path.iterdir())
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model path {path} has no config.json (has {have}); expected {hint}")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelPathError(
            f"model path {path} has config.json but no weights: none of {list(WEIGHT_FILES)} (has {have})"
        )
    return path


def load_policy(path: str | Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(check_model_dir(path), dtype=torch.float32)
    return model.train()


def _ties_embeddings(model: PreTrainedModel) -> bool:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return bool(getattr(cfg, "tie_word_embeddings", False))


class Trainer:
    """Holds the policy and optimizer; `version` is the number of train steps taken, i.e. the weights' version."""

    def __init__(
        self,
        cfg: TrainerConfig,
        model_path: str = "",
        *,
        rollout: RolloutConfig | None = None,
        device: str = "cpu",
        seed: int = 0,
        compute_dtype: str = "",
        publish_dtype: str = "",
        model: PreTrainedModel | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        """`cfg` is the run's `trainer` section, validated when the config loaded; the rest comes from other
        sections. `model_path`: the starting weights (`model` given: those instead; the path still names the
        LoRA base and the tokenizer files a checkpoint copies). `rollout`: the sampling the log-probs are of, and
        its longest response (`GRPOConfig.of`). `device`: cpu | cuda | cuda:N (fp32 master weights, bf16 compute
        on CUDA). `seed`: `run.seed`. `compute_dtype`: the single trainer's compute copy, "" = bfloat16 on CUDA,
        float32 (no copy) on CPU (a sharded trainer computes in bf16 through FSDP's mixed precision on CUDA).
        `publish_dtype`: the published weights', "" = the parameters' (float32).

        `world > 1`: this is rank `rank` of a sharded trainer (FSDP2) in the default process group, which the
        caller has initialised; every rank is given the same batches and trains its own share of them."""
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f"trainer device={device!r}: must be cpu, cuda or cuda:N")
        for name, dtype in (("compute_dtype", compute_dtype), ("publish_dtype", publish_dtype)):
            if dtype not in ("", "float32", "bfloat16"):
                raise ValueError(f"trainer {name}={dtype!r}: must be '', float32 or bfloat16")
        torch.set_num_threads(max(1, int(cfg.num_cpus)))
        torch.manual_seed(seed)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.model_path, self.compute_dtype, self.publish_dtype = model_path, compute_dtype, publish_dtype
        self.loss = GRPOConfig.of(cfg, rollout or RolloutConfig())
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"trainer device={device!r}, but CUDA is not available here")
        if world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        model = model if model is not None else load_policy(model_path)
        # The KL reference is the starting policy, frozen; never saved: a resumed or restarted trainer loads it
        # again from the same starting weights, so a checkpoint holds the policy alone. It runs forward only,
        # in bf16 on CUDA; a sharded trainer shards it as it shards the policy.
        self.ref_model = self._load_reference(model) if cfg.kl_coef > 0 else None
        # PPO's learned critic (trainer.advantage=gae): a copy of the starting decoder with a value head
        if cfg.advantage == "gae" and world > 1:
            raise ValueError("trainer.advantage=gae needs one trainer rank (trainer.num_workers=1)")
        self.critic = (
            Critic(model, cfg.critic_lr, cfg.weight_decay, cfg.max_grad_norm, self.device)
            if cfg.advantage == "gae"
            else None
        )
        self.lora = cfg.lora_rank > 0
        if self.lora:
            if world > 1:
                raise ValueError("trainer.lora_rank > 0 needs one trainer rank (trainer.num_workers=1)")
            lora.add_adapters(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, model_path)
        self.model = model.float().train()
        wanted = cfg.packing == "on" or (cfg.packing == "auto" and self.device.type == "cuda")
        self.packed = wanted and supports_packing(self.model)
        if self.packed:
            for m in (self.model, self.ref_model, self.critic.model.decoder if self.critic else None):
                if m is not None:
                    use_packed_attention(m)
        if cfg.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # A single trainer computing in bf16 runs a bf16 copy of the policy (`compute`): its activations stay
        # bf16 end to end, where fp32 weights under autocast keep the residual stream and every norm in fp32 and
        # cast at every matmul. The fp32 model stays the master the optimizer updates, checkpoints and
        # publishes; each gradient of the copy is added into its master's fp32 gradient as soon as the backward
        # has it (`MasterWeights`).
        compute = self._compute_dtype()
        self.master: MasterWeights | None = None
        if world == 1 and compute != torch.float32:
            self.model.to(self.device)
            self.master = MasterWeights(self.model, compute)
        forward_model = self.master.compute if self.master is not None else self.model
        # log-probs of the distribution the engine draws from: its temperature and truncation
        sampled = (self.loss.temperature, self.loss.top_k, self.loss.top_p)
        self.policy = PolicyLogprobs(forward_model, *sampled)
        self.ref_policy = PolicyLogprobs(self.ref_model, *sampled) if self.ref_model is not None else None
        if cfg.compile and self.device.type == "cuda":
            compile_layers(forward_model)
        if world > 1:
            shard_policy(self.policy, self.device, cfg.cpu_offload, cfg.reshard_after_forward)
            if self.ref_policy is not None:  # forward only: each rank keeps its rows, gathered layer by layer
                shard_policy(self.ref_policy, self.device, cpu_offload=False)
        else:
            self.model.to(self.device)
            self.policy.to(self.device)
        # one fused kernel for the whole update on CUDA, sharded (DTensor) parameters included
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self._trained()],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            fused=self.device.type == "cuda",
        )
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self.version = 0
        self._locals: list[tuple[str, torch.Tensor]] | None = None  # see _parameters
        self._shard_views: list[WeightShard] | None = None  # see _shards
        self._names: list[str] | None = None  # see publish_names
        self._compute_views: dict[str, torch.Tensor] | None = None  # see named_weights
        self._cast: torch.Tensor | None = None  # the last weight_shards' cast rows, one buffer
        self._cast_rows: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # that buffer and its views
        self._merged: dict[str, torch.Tensor] = {}  # LoRA: the merged weights' buffers (see named_weights)
        self.nonfinite_steps = 0  # skipped steps, all told
        self.nonfinite_in_a_row = 0
        if self.device.type == "cuda":
            self.warm_up()

    def _compute_dtype(self) -> torch.dtype:
        if self.compute_dtype:
            return getattr(torch, self.compute_dtype)
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32

    def _load_reference(self, model: PreTrainedModel) -> PreTrainedModel:
        """A frozen copy of the starting weights, in eval mode; bf16 on CUDA (it only ever runs under bf16
        autocast there, and it halves its memory), float32 on CPU."""
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        ref = copy.deepcopy(model).to(dtype).to(self.device)
        ref.requires_grad_(False)
        return ref.eval()

    # ---- the step -------------------------------------------------------------------------------------------

    def train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        """One GRPO step on complete groups; returns metrics. Staleness is measured against the version the
        trainer holds when it consumes the data (before this step's update). A sharded trainer's ranks are all
        given the same groups: each trains its own share (`plan`) and the sums are reduced across ranks.

        A step whose loss or gradient norm is not finite is skipped: no optimizer update (with several
        mini-batches, from the first non-finite one on), the version still advances (the batch is consumed) and
        `nonfinite` is set in the metrics.
        `max_nonfinite_steps` such steps in a row raise `NonFiniteError`."""
        t0 = time.perf_counter()
        if self.device.type == "cuda":  # `peak_memory_gb`: this step's, not the run's
            torch.cuda.reset_peak_memory_stats(self.device)
        for g in groups:
            for t in g:
                if len(t.logprobs) != len(t.response_ids):
                    raise ValueError(
                        f"trajectory {t.traj_id}: {len(t.logprobs)} log-probs for {len(t.response_ids)} response tokens"
                    )
                if t.loss_mask and len(t.loss_mask) != len(t.response_ids):
                    raise ValueError(
                        f"trajectory {t.traj_id}: loss mask of {len(t.loss_mask)} for {len(t.response_ids)} tokens"
                    )
        trajs = [t for g in groups for t in g]
        plan = self.plan([t.num_tokens for t in trajs])
        old_values: dict[int, torch.Tensor] = {}
        returns: dict[int, torch.Tensor] = {}
        if self.critic is not None:  # PPO: per-token advantages from the critic's values before this step
            adv_of, old_values, returns = self._gae(trajs, [mb for _, mbs in plan for mb in mbs])
        else:
            advs = advantages(
                [[t.reward for t in g] for g in groups],
                [[t.num_trained_tokens for t in g] for g in groups],
                self.loss.advantage,
                self.loss.adv_eps,
            )
            adv_of = [a for ga in advs for a in ga]
        proximal: dict[int, torch.Tensor] | None = None
        if self.loss.proximal == "trainer":
            proximal = self._logprobs_no_grad(trajs, [mb for _, mbs in plan for mb in mbs])

        sums: dict[str, float] = {}
        losses, grad_norms = [], []
        nonfinite = False
        updates = 0
        for mb_index, micro in plan:
            num_tokens = sum(trajs[i].num_trained_tokens for i in mb_index)  # a tool's output is not trained
            # the sequence-mean losses' divisor: the whole mini-batch's, as num_tokens (never a rank's share)
            num_seqs = sum(trajs[i].num_trained_tokens > 0 for i in mb_index)
            self.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.zero_grad()
            mb_loss = torch.zeros((), dtype=torch.float64, device=self.device)
            for idx in micro:
                if (
                    idx is None
                ):  # this rank has no more work: a zero-loss pass keeps the ranks' collectives in step
                    self._idle_pass(trajs)
                    sums["idle_passes"] = sums.get("idle_passes", 0.0) + 1
                    continue
                batch = self._collate([trajs[i] for i in idx], [adv_of[i] for i in idx])
                logp = self._forward_logprobs(self.policy, batch)
                ref = None
                if self.ref_policy is not None:
                    with torch.no_grad():
                        ref = self._forward_logprobs(self.ref_policy, batch)
                loss, m = grpo_loss(
                    logp,
                    batch["behaviour"],
                    batch["advantages"],
                    batch["mask"],
                    self.loss,
                    num_tokens,
                    proximal=torch.cat([proximal[i] for i in idx]) if proximal else None,
                    ref_logp=ref,
                    same_weights=self._same_weights(
                        [trajs[i] for i in idx], proximal is not None or updates == 0
                    ),
                    seq_lengths=[len(trajs[i].response_ids) for i in idx],
                    num_seqs=num_seqs,
                )
                # FSDP averages gradients over ranks; each rank's loss is its share of the mini-batch's sum
                (loss * self.world).backward()
                mb_loss += loss.detach()
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                if self.critic is not None:
                    v_loss, vm = value_loss(
                        self.critic.values(batch),
                        torch.cat([old_values[i] for i in idx]),
                        torch.cat([returns[i] for i in idx]),
                        batch["mask"],
                        self.cfg.value_clip,
                        num_tokens,
                    )
                    v_loss.backward()
                    for k, v in vm.items():
                        sums[k] = sums.get(k, 0.0) + v
            grad_norms.append(self._clip_grad_norm())
            losses.append(float(self._all_sum(mb_loss.reshape(1))[0]))
            if not (math.isfinite(losses[-1]) and math.isfinite(grad_norms[-1])):
                self.optimizer.zero_grad(set_to_none=True)  # nothing of this batch reaches the weights
                if self.critic is not None:
                    self.critic.zero_grad()
                nonfinite = True
                break
            self.optimizer.step()
            if self.critic is not None:
                sums["value_grad_norm_sum"] = sums.get("value_grad_norm_sum", 0.0) + self.critic.step()
            if self.master is not None:
                self.master.refresh()
            updates += 1

        if self.world > 1:  # the same keys on every rank, one with only idle passes included
            keys = sorted(
                set(LOSS_METRICS) | {"idle_passes"} | ({"kl_sum"} if self.ref_policy is not None else set())
            )
            total = self._all_sum(torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64))
            sums = dict(zip(keys, total.tolist()))
        self._count_nonfinite(nonfinite, losses, grad_norms)
        lags = [staleness(self.version, t.version) for t in trajs]
        rewards = [t.reward for t in trajs]
        n_tok = max(sums.get("tokens", 0.0), 1.0)
        lengths = np.array([len(t.response_ids) for t in trajs])
        self.version += 1
        return {
            "version": self.version,
            "loss": float(np.mean(losses)) if losses else 0.0,
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
            "reward_mean": float(np.mean(rewards)),
            "reward_std": float(np.std(rewards)),
            "groups": len(groups),
            "trajectories": len(trajs),
            "tokens": sum(t.num_tokens for t in trajs),
            "response_tokens": sum(len(t.response_ids) for t in trajs),
            "response_len_mean": float(lengths.mean()),
            # the tail a step waits for (`bench convergence` plots them over steps)
            **{f"response_len_p{q}": float(np.percentile(lengths, q)) for q in (50, 90, 99)},
            "response_len_max": int(lengths.max()),
            "staleness_mean": float(np.mean(lags)),
            "staleness_max": int(max(lags)),
            "clip_frac": sums.get("clip_frac_sum", 0.0) / n_tok,
            "ratio_mean": sums.get("ratio_sum", 0.0) / n_tok,
            "is_weight_mean": sums.get("is_weight_sum", 0.0) / n_tok,
            "is_masked_frac": sums.get("is_masked_sum", 0.0) / n_tok,
            "logprob_mismatch_abs": sums.get("mismatch_abs_sum", 0.0) / n_tok,
            "logprob_mismatch_kl": sums.get("mismatch_kl_sum", 0.0) / n_tok,
            # the same |train - rollout| apart: tokens sampled with the weights the trainer scored them with
            # (numerical: kernels, precision) and the rest (that plus the policy's drift since their version)
            **_split_mismatch(sums),
            "updates": updates,
            # a sharded trainer's filler passes (a rank with fewer micro-batches than the busiest), all ranks told
            "idle_passes": int(sums.get("idle_passes", 0)),
            **({"kl": sums.get("kl_sum", 0.0) / n_tok} if self.ref_model is not None else {}),
            **(self._critic_metrics(sums, n_tok, updates) if self.critic is not None else {}),
            "step_time_s": time.perf_counter() - t0,
            # this rank's most GPU memory allocated during the step (weights, optimizer, activations); 0 on CPU
            "peak_memory_gb": torch.cuda.max_memory_allocated(self.device) / 2**30
            if self.device.type == "cuda"
            else 0.0,
            "nonfinite": nonfinite,
            "nonfinite_steps": self.nonfinite_steps,
            "reward_errors_in_batch": sum("reward_error" in t.meta for t in trajs),
        }

    @torch.no_grad()
    def _gae(
        self, trajs: list[Trajectory], micro: list[list[int] | None]
    ) -> tuple[list[list[float]], dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """PPO's advantages for every response token (whitened over the batch's trained tokens), and the values
        and returns the critic's loss needs, by trajectory index: the critic's values before this step, GAE over
        the trained tokens (a tool's output is context: skipped, its tokens get advantage 0)."""
        values: dict[int, torch.Tensor] = {}
        for idx in micro:
            if idx is not None:
                v = self.critic.values(self._collate([trajs[i] for i in idx]))
                for i, part in zip(idx, v.split([len(trajs[i].response_ids) for i in idx])):
                    values[i] = part
        order = sorted(values)
        trained = [[j for j, m in enumerate(trajs[i].trained_mask) if m] for i in order]
        v_trained = [[float(values[i][j]) for j in js] for i, js in zip(order, trained)]
        a, r = gae([trajs[i].reward for i in order], v_trained, self.cfg.gae_gamma, self.cfg.gae_lambda)
        a = whiten_tokens(a)
        adv_of: list[list[float]] = [[0.0] * len(t.response_ids) for t in trajs]
        returns: dict[int, torch.Tensor] = {}
        for i, js, ai, ri in zip(order, trained, a, r):
            ret = values[i].clone()  # untrained tokens: no loss (masked), their return is their value
            for j, x, y in zip(js, ai, ri):
                adv_of[i][j] = x
                ret[j] = y
            returns[i] = ret
        return adv_of, values, returns

    @staticmethod
    def _critic_metrics(sums: dict[str, float], n_tok: float, updates: int) -> dict[str, float]:
        return {
            "value_loss": sums.get("value_loss_sum", 0.0) / n_tok,
            "value_mean": sums.get("value_sum", 0.0) / n_tok,
            "return_mean": sums.get("return_sum", 0.0) / n_tok,
            "value_clip_frac": sums.get("value_clipped_sum", 0.0) / n_tok,
            "value_grad_norm": sums.get("value_grad_norm_sum", 0.0) / max(updates, 1),
        }

    def _same_weights(self, trajs: list[Trajectory], unchanged: bool) -> torch.Tensor:
        """1 on the response tokens of trajectories generated by the weights the trainer holds now (`unchanged`:
        no update of this step has touched them yet), in `_collate`'s flat order."""
        flags = [float(unchanged and t.version == self.version) for t in trajs for _ in t.response_ids]
        return torch.tensor(flags, dtype=torch.float32, device=self.device)

    def _trained(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters the optimizer updates, by name: all of them, or with LoRA the adapters alone."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def _clip_grad_norm(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if hasattr(norm, "full_tensor"):  # sharded: a DTensor, already reduced over the ranks
            norm = norm.full_tensor()
        return float(norm)

    def _all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks (itself with one rank); float64 on the host side of the call."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        out = values.to(self.device, torch.float64)
        dist.all_reduce(out)
        return out.cpu()

    def _idle_pass(self, trajs: list[Trajectory]) -> None:
        """What a real micro-batch runs, in the same order and with zero loss, on the shortest sequence: the
        policy's forward, the reference's forward when the KL term is on, the policy's backward. Every sharded
        module's collectives then run as often as on the busiest rank, without changing any gradient; a rank
        that skipped one would leave the others waiting in its all-gather."""
        self._zero_loss_pass([min(trajs, key=lambda t: t.num_tokens)], reference=True)

    def _zero_loss_pass(self, trajs: list[Trajectory], reference: bool = False) -> None:
        batch = self._collate(trajs, [0.0] * len(trajs))
        logp = self._forward_logprobs(self.policy, batch)
        if reference and self.ref_policy is not None:
            with torch.no_grad():
                self._forward_logprobs(self.ref_policy, batch)
        (logp.sum() * 0.0).backward()

    def warm_up(self, tokens: int = 4096) -> None:
        """One zero-loss forward and backward over about `tokens` synthetic tokens, so the CUDA context, the
        kernels' autotuning and the caching allocator are ready before the first real step: that cost belongs
        to start-up, not to the first step's wall time. No gradient survives it and the optimizer does not
        step, so the weights and the optimizer state are untouched. Every rank runs it (its collectives stay
        in step)."""
        vocab = int(self.model.config.vocab_size)
        half = min(512, int(getattr(self.model.config, "max_position_embeddings", 512) or 512)) // 2
        seqs = [
            Trajectory(
                f"warm-up:{i}",
                -1,
                i,
                [(7 * i + j) % vocab for j in range(half)],
                [(11 * i + j) % vocab for j in range(half)],
                [0.0] * half,
                self.version,
            )
            for i in range(max(1, tokens // (2 * half)))
        ]
        self._zero_loss_pass(seqs)
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _count_nonfinite(self, nonfinite: bool, losses: list[float], grad_norms: list[float]) -> None:
        if not nonfinite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_steps += 1
        self.nonfinite_in_a_row += 1
        if self.nonfinite_in_a_row >= self.cfg.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.nonfinite_in_a_row} trainer steps in a row had a non-finite loss or gradient norm (step "
                f"{self.version + 1}: loss {losses[-1]}, grad norm {grad_norms[-1]}); they were skipped and the "
                "weights are unchanged. Look for non-finite rewards or log-probs, or lower trainer.lr "
                f"(trainer.max_nonfinite_steps={self.cfg.max_nonfinite_steps} is how many are skipped first)"
            )

    def check_finite(self) -> None:
        """Raise `NonFiniteError` naming the first parameter that holds NaN or inf (before a publish or save).
        Sharded: every rank checks its shards and the ranks agree."""
        self.raise_nonfinite(self.nonfinite_flags())

    @torch.no_grad()
    def nonfinite_flags(self) -> torch.Tensor:
        """One flag a parameter (this rank's rows), 1 where it holds NaN or inf; computed on the parameters'
        device without waiting for it, so a publish can copy its weights out meanwhile and judge them after.
        One min-max reduction a parameter (NaN propagates through both, inf shows in one): no copy the size of
        the weights, and one more kernel for them all."""
        params = self._parameters()
        zero = torch.zeros((), device=params[0][1].device)  # stands in for an empty shard's ends
        ends = [v for _, x in params for v in (torch.aminmax(x) if x.numel() else (zero, zero))]
        return (~torch.isfinite(torch.stack(ends).float()).view(-1, 2).all(1)).int()

    def _parameters(self) -> list[tuple[str, torch.Tensor]]:
        """(name, this rank's rows) of every parameter, the local tensors (a sharded parameter's own shard),
        resolved once: the optimizer and checkpoint loads update them in place."""
        if self._locals is None:
            self._locals = [(n, _local(p)) for n, p in self.model.named_parameters()]
        return self._locals

    def raise_nonfinite(self, flags: torch.Tensor, summary: bool = False) -> None:
        """Raise `NonFiniteError` if `nonfinite_flags` (or, `summary`, `published_nonfinite`) found any.
        Sharded: an all-reduce over the ranks, so every rank raises (or not) alike; it returns only once every
        rank has called it, which makes it the publish's barrier too. Waits for the device once. A set summary
        is followed by the per-parameter flags on every rank, to name what is wrong."""
        flags = self._agree(flags)
        if summary:
            if not bool(flags.any()):
                return
            flags = self._agree(self.nonfinite_flags())  # which parameters
        bad_at = flags.nonzero().flatten().tolist()
        if not bad_at:
            if not summary:
                return
            raise NonFiniteError(  # finite in fp32, not once cast
                f"the trainer's weights at version {self.version} overflow {self.publish_dtype} "
                "(publish_dtype): values beyond its range become inf; they are not published"
            )
        bad = [self._parameters()[i][0] for i in bad_at]
        raise NonFiniteError(
            f"the trainer's weights hold NaN or inf at version {self.version} (parameter {bad[0]!r}"
            f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); they are neither published nor saved"
        )

    def _agree(self, flags: torch.Tensor) -> torch.Tensor:
        """The ranks' flags, each the largest any rank holds (one all-reduce); a single trainer's as they are."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.get_backend() == "nccl" and not flags.is_cuda:  # parameters offloaded to the host
                flags = flags.cuda()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return flags

    # ---- batching -------------------------------------------------------------------------------------------

    def plan(self, lengths: list[int]) -> list[tuple[list[int], list[list[int] | None]]]:
        """Per mini-batch: its trajectory indices (all ranks'), and this rank's micro-batches. A mini-batch is
        split across ranks balanced by token count (longest first, each to the rank with the fewest tokens so
        far); every rank gets as many micro-batches as the busiest one, `None` standing for an idle pass."""
        out = []
        for mb in np.array_split(np.arange(len(lengths)), self.cfg.mini_batches):
            mb = mb.tolist()
            if not mb:
                continue
            shares: list[list[int]] = [[] for _ in range(self.world)]
            load = [0] * self.world
            for i in sorted(mb, key=lambda i: (-lengths[i], i)):
                r = min(range(self.world), key=lambda r: (load[r], r))
                shares[r].append(i)
                load[r] += lengths[i]
            micro = [self.micro_batches([lengths[i] for i in s], s) if s else [] for s in shares]
            most = max(len(m) for m in micro)
            out.append((mb, micro[self.rank] + [None] * (most - len(micro[self.rank]))))
        return out

    def micro_batches(self, lengths: list[int], index: list[int]) -> list[list[int]]:
        """`index` cut into micro-batches, longest sequences first, so each micro-batch pads to a length close to
        its own (the loss is normalised by the whole mini-batch's tokens: the order changes no gradient). By
        count (`micro_batch`), or filled up to `micro_batch_tokens` padded tokens when that is set."""
        order = [i for _, i in sorted(zip(lengths, index), key=lambda p: -p[0])]
        width = dict(zip(index, lengths))
        if self.cfg.micro_batch_tokens <= 0:
            n = self.cfg.micro_batch
            return [order[s : s + n] for s in range(0, len(order), n)]
        out: list[list[int]] = []
        size = 0
        for i in order:  # longest first: a padded micro-batch's size is its count x its first length
            grown = size + width[i] if self.packed else (len(out[-1]) + 1) * width[out[-1][0]] if out else 0
            if out and grown <= self.cfg.micro_batch_tokens:
                out[-1].append(i)
                size = grown
            else:
                out.append([i])
                size = width[i]
        return out

    def _collate(
        self, trajs: list[Trajectory], advs: list[float | list[float]] | None = None
    ) -> dict[str, Any]:
        """Packed (`self.packed`): one [1, T] row of all the sequences, with their positions and cumulative
        lengths. Otherwise right-padded [B, L] ids and mask. The rest is flat over the response tokens, in
        trajectory order (`mask` is 0 on a tool's output: context, never trained):
        `positions` (flat index into [B, L] of the prediction of each response token), `targets`, the rollout's
        `behaviour` log-probs, `advantages` and `mask`."""
        if self.packed:
            return self._collate_packed(trajs, advs)
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        positions, targets, behaviour, adv, mask = [], [], [], [], []
        for b, (t, s) in enumerate(zip(trajs, seqs)):
            ids[b, : len(s)] = torch.tensor(s)
            attn[b, : len(s)] = 1
            p, r = len(t.prompt_ids), len(t.response_ids)
            positions.append(torch.arange(b * width + p - 1, b * width + p - 1 + r))
            targets += t.response_ids
            behaviour += t.logprobs
            adv += _token_advantages(advs, b, r)
            mask += t.trained_mask
        batch = {
            "ids": ids,
            "attn": attn,
            "positions": torch.cat(positions),
            "targets": torch.tensor(targets, dtype=torch.long),
            "behaviour": torch.tensor(behaviour, dtype=torch.float32),
            "advantages": torch.tensor(adv, dtype=torch.float32),
            "mask": torch.tensor(mask, dtype=torch.float32),
        }
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _collate_packed(
        self, trajs: list[Trajectory], advs: list[float | list[float]] | None
    ) -> dict[str, Any]:
        ids, pos, positions, targets, behaviour, adv, mask, cu = [], [], [], [], [], [], [], [0]
        for b, t in enumerate(trajs):
            start, p, r = cu[-1], len(t.prompt_ids), len(t.response_ids)
            ids += t.prompt_ids + t.response_ids
            pos += range(p + r)
            positions += range(start + p - 1, start + p - 1 + r)
            targets += t.response_ids
            behaviour += t.logprobs
            adv += _token_advantages(advs, b, r)
            mask += t.trained_mask
            cu.append(start + p + r)
        dev = self.device
        cu_t = torch.tensor(cu, dtype=torch.int32).to(dev, non_blocking=True)
        longest = max(t.num_tokens for t in trajs)
        return {
            "ids": torch.tensor([ids], dtype=torch.long).to(dev, non_blocking=True),
            "attn": None,
            "packed": {
                "position_ids": torch.tensor([pos], dtype=torch.long).to(dev, non_blocking=True),
                "cu_seq_lens_q": cu_t,
                "cu_seq_lens_k": cu_t,
                "max_length_q": longest,
                "max_length_k": longest,
            },
            "positions": torch.tensor(positions, dtype=torch.long).to(dev, non_blocking=True),
            "targets": torch.tensor(targets, dtype=torch.long).to(dev, non_blocking=True),
            "behaviour": torch.tensor(behaviour, dtype=torch.float32).to(dev, non_blocking=True),
            "advantages": torch.tensor(adv, dtype=torch.float32).to(dev, non_blocking=True),
            "mask": torch.tensor(mask, dtype=torch.float32).to(dev, non_blocking=True),
        }

    def _forward_logprobs(self, policy: PolicyLogprobs, batch: dict[str, Any]) -> torch.Tensor:
        """Flat log-probs of the batch's response tokens. bf16 autocast on a single CUDA trainer; a sharded one
        computes in bf16 through FSDP's mixed precision instead."""
        autocast = self.device.type == "cuda" and (
            (self.world == 1 and self.master is None) or policy is self.ref_policy
        )
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return policy(
                batch["ids"], batch["attn"], batch["positions"], batch["targets"], **batch.get("packed", {})
            )

    @torch.no_grad()
    def _logprobs_no_grad(
        self, trajs: list[Trajectory], micro: list[list[int] | None] | None = None
    ) -> dict[int, torch.Tensor]:
        """The current policy's log-probs of the response tokens of each trajectory in `micro` (this rank's
        micro-batches; all of `trajs` by `micro_batch` when not given), by trajectory index."""
        if micro is None:
            micro = self.plan([t.num_tokens for t in trajs])
            micro = [mb for _, mbs in micro for mb in mbs]
        out: dict[int, torch.Tensor] = {}
        for idx in micro:
            if idx is None:
                shortest = min(trajs, key=lambda t: t.num_tokens)
                self._forward_logprobs(self.policy, self._collate([shortest]))
                continue
            logp = self._forward_logprobs(self.policy, self._collate([trajs[i] for i in idx]))
            for i, part in zip(idx, logp.split([len(trajs[i].response_ids) for i in idx])):
                out[i] = part.clone()
        return out

    def response_logprobs(self, trajs: list[Trajectory]) -> list[list[float]]:
        """The current policy's log-probs of each trajectory's response tokens (for checks and evaluation); on a
        sharded trainer every rank must call it, and each gets those of its share (`None` elsewhere)."""
        got = self._logprobs_no_grad(trajs)
        return [got[i].tolist() if i in got else None for i in range(len(trajs))]

    # ---- weights and checkpoints ----------------------------------------------------------------------------

    def publish_names(self) -> list[str]:
        """The published tensors' names, the keys `save_pretrained` writes: with tied embeddings
        `lm_head.weight` is left out (it is `model.embed_tokens.weight`) and loaders re-tie it."""
        if self._names is None:
            names = [lora.base_name(k) for k in self.model.state_dict()]
            self._names = [k for k in names if k is not None]  # LoRA: the base model's names, no adapter
            if _ties_embeddings(self.model):
                self._names.remove("lm_head.weight")
        return list(self._names)

    def named_weights(self, check: bool = True) -> dict[str, torch.Tensor]:
        """The HF state_dict to publish (`publish_names`). The tensors are live views, valid until the next
        `train_step`; copy them out before training on. On CUDA they stay on the GPU (the publisher copies them
        into its registered shared-memory slot); with `publish_dtype` they are cast copies, e.g. bf16 for a bf16
        engine, which halves the bytes on the weight path. Non-finite weights raise `NonFiniteError` instead
        (`check=False`: the caller checks, see `publish_parts`). A sharded trainer has no whole tensors: see
        `weight_shards`."""
        if self.world > 1:
            raise RuntimeError("a sharded trainer publishes its shards (weight_shards), never whole weights")
        if check:
            self.check_finite()
        dtype = getattr(torch, self.publish_dtype) if self.publish_dtype else None
        if self.lora:  # rollouts get the merged model, never the adapters
            return lora.merged_weights(self.model, self.publish_names(), self._merged, dtype)
        if self.master is not None and dtype == self.master.dtype:  # the compute copy is already that cast
            if self._compute_views is None:  # refreshed in place after every update: resolved once
                sd = self.master.compute.state_dict()
                self._compute_views = {k: sd[k].detach() for k in self.publish_names()}
            return dict(self._compute_views)
        sd = self.model.state_dict()
        return {k: sd[k].detach().to(dtype) if dtype else sd[k].detach() for k in self.publish_names()}

    def weight_shards(self, check: bool = True) -> list[WeightShard]:
        """This rank's rows of every published tensor (FSDP shards dim 0 in contiguous row blocks), cast to
        `publish_dtype`: each rank writes them at their offsets into the one flat buffer of the version.
        The cast rows lie back to back in one buffer, kept between publishes and written by one multi-tensor
        copy (a cast a tensor cost a launch and an allocation each); the returned rows are views of it, valid
        until the next call. `check=False`: the caller checks them (`publish_parts`)."""
        if check:
            self.check_finite()
        views = self._shards()
        self._cast = None
        dtype = getattr(torch, self.publish_dtype) if self.publish_dtype else views[0].dtype
        if dtype == views[0].dtype:
            return list(views)  # published as they are
        if self._cast_rows is None or self._cast_rows[0].dtype != dtype:
            # kept between publishes: a fresh allocation of the whole shard each time can make the caching
            # allocator free its cached blocks first, with a device-wide sync (tens to hundreds of ms)
            flat = torch.empty(sum(v.local.numel() for v in views), dtype=dtype, device=views[0].local.device)
            parts = torch.split(flat, [v.local.numel() for v in views])
            self._cast_rows = (flat, [p.view(v.local.shape) for p, v in zip(parts, views)])
        flat, cast = self._cast_rows
        with torch.no_grad():
            torch._foreach_copy_(cast, [v.local for v in views])
        self._cast = flat
        return [WeightShard(v.name, v.shape, dtype, v.first_row, c) for v, c in zip(views, cast)]

    def publish_parts(self) -> tuple[Any, torch.Tensor]:
        """What a publish copies out, and one flag for all of it queued on the device (1: NaN or inf): a single
        trainer's whole tensors (`named_weights`), a sharded one's rows (`weight_shards`). After the copy,
        `raise_nonfinite(flag, summary=True)` judges them, on every rank alike."""
        if self.world > 1:
            shards = self.weight_shards(check=False)
            return shards, self.published_nonfinite()
        flag = self.nonfinite_flags().max().view(1)
        return self.named_weights(check=False), flag

    @torch.no_grad()
    def published_nonfinite(self) -> torch.Tensor:
        """One flag for all the rows the last `weight_shards` cast, 1 if any is NaN or inf: a single reduction
        over the bytes that are published (`raise_nonfinite(..., summary=True)` names the parameters only when
        it is set). Without a cast, the same from the per-parameter `nonfinite_flags`."""
        if self._cast is None:
            return self.nonfinite_flags().max().view(1)
        if not self._cast.numel():
            return torch.zeros(1, dtype=torch.int32, device=self._cast.device)
        return (~torch.isfinite(torch.stack(torch.aminmax(self._cast)).float()).all()).int().view(1)

    def _shards(self) -> list[WeightShard]:
        """This rank's rows of every published tensor as they are (live, in the master dtype), resolved once:
        a model's state_dict costs milliseconds a call for a sharded model (a DTensor detach a tensor)."""
        if self._shard_views is None:
            sd = self.model.state_dict()
            self._shard_views = [
                WeightShard(
                    name,
                    tuple(sd[name].shape),
                    sd[name].dtype,
                    _first_row(sd[name], self.rank, self.world),
                    _local(sd[name]).detach(),
                )
                for name in self.publish_names()
            ]
        return self._shard_views

    def save_checkpoint(self, out: str | Path) -> Path:
        """`out` becomes a whole HF model dir (config, safetensors, and the tokenizer, chat template and
        generation config of the model it started from) plus the optimizer's moments in `optimizer/`, and the
        step, optimizer groups and RNG, with no pickle anywhere (see `state_files`). A sharded trainer writes
        with `torch.distributed.checkpoint`: each rank its own rows, then rank 0 joins the files into the same
        layout (every rank must call this). Any checkpoint resumes onto any number of ranks."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        moments, steps = self._moments()
        if self.lora:  # the merged model (a resume's replicas and `laminar export` load it) and the adapters
            merged = lora.merged_weights(self.model, self.publish_names())
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in merged.items()},
                str(out / "model.safetensors"),
                metadata={"format": "pt"},
            )
            self.model.config.save_pretrained(out)
            if self.model.generation_config is not None:
                self.model.generation_config.save_pretrained(out)
            lora.save_adapter(self.model, out / lora.ADAPTER_DIR)
            save_tensors(moments, out / OPTIMIZER_DIR)
        elif self.world == 1:
            self.model.save_pretrained(out)
            save_tensors(moments, out / OPTIMIZER_DIR)
        else:
            save_sharded(self._model_tensors(), out, whole=True)
            save_sharded(moments, out / OPTIMIZER_DIR, whole=False)
        if self.critic is not None:
            self.critic.save(out / CRITIC_DIR)
        if self.rank == 0:
            if self.world > 1:
                self.model.config.save_pretrained(out)
                if self.model.generation_config is not None:
                    self.model.generation_config.save_pretrained(out)
            if self.model_path:
                copy_tokenizer_files(self.model_path, out)
            groups = self.optimizer.state_dict()["param_groups"]
            meta = {"version": self.version, "ranks": self.world, "config": asdict(self.cfg)}
            rng = {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            }
            save_trainer_state(out, groups, steps, rng, meta)
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
        return out

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what `save_checkpoint` wrote, whatever number of ranks wrote it (`torch.distributed.checkpoint`
        reads each rank's rows from the files)."""
        path = check_model_dir(path)
        groups, steps, rng, meta = load_trainer_state(path)
        trained = self._trained()
        names = [n for n, _ in trained]
        if sorted(steps) != sorted(names):
            raise CheckpointError(
                f"{path / 'trainer_state.json'}: optimizer steps for {len(steps)} parameters, but the model has "
                f"{len(names)} (first difference: {sorted(set(steps) ^ set(names))[:1]}); another model's checkpoint?"
            )
        moments = {f"{kind}.{n}": torch.zeros_like(p) for n, p in trained for kind in MOMENTS}
        try:
            if self.lora:  # the base is `model_path`'s, frozen: only the adapters were trained
                adapters = {lora.adapter_key(n): p.detach() for n, p in trained}
                load_tensors(adapters, path / lora.ADAPTER_DIR, 1)
            else:
                load_tensors(self._model_tensors(), path, self.world)
            load_tensors(moments, path / OPTIMIZER_DIR, self.world)
        except Exception as e:  # noqa: BLE001 - any reader failure is a bad checkpoint, named
            raise CheckpointError(f"{path}: the weights or optimizer moments do not load ({e})") from e
        state = {
            i: {"step": torch.tensor(float(steps[n]))} | {k: moments[f"{k}.{n}"] for k in MOMENTS}
            for i, n in enumerate(names)
        }
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        if self.critic is not None:
            self.critic.load(path / CRITIC_DIR)
        if self.master is not None:
            self.master.refresh()
        self.version = int(meta["version"])
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """The parameters by their HF names (a tied head once), as live tensors: DCP reads and writes them."""
        sd = self.model.state_dict()
        return {k: sd[k] for k in self.publish_names()}

    def _moments(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """AdamW's moments by `exp_avg.NAME` / `exp_avg_sq.NAME`, and each parameter's step count. A parameter
        with no update yet gets zero moments, which is what AdamW starts from."""
        tensors, steps = {}, {}
        for n, p in self._trained():
            st = self.optimizer.state.get(p, {})
            steps[n] = int(st["step"]) if "step" in st else 0
            for kind in MOMENTS:
                tensors[f"{kind}.{n}"] = st[kind] if kind in st else torch.zeros_like(p)
        return tensors, steps


def _token_advantages(advs: list[float | list[float]] | None, b: int, r: int) -> list[float]:
    """The advantage of each of sequence b's r response tokens: its one value repeated, or its per-token list."""
    if advs is None:
        return [0.0] * r
    a = advs[b]
    return list(a) if isinstance(a, list) else [a] * r


class MasterWeights:
    """Mixed precision for one trainer: `compute`, a copy of the fp32 `master` model in `dtype` that runs the
    forward and backward, and the master that the optimizer updates. As the backward finishes each gradient of
    the copy, a hook adds it into the master parameter's fp32 gradient and frees it, so micro-batches
    accumulate in fp32 and the copy holds no gradients between them. `refresh` casts the master into the copy
    after every update. Tied parameters stay tied: the copy is a deep copy, one tensor where the master has one."""

    def __init__(self, master: nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.compute = copy.deepcopy(master).to(dtype)
        # the trained parameters (LoRA: the adapters; the frozen base is cast once, here)
        pairs = zip(master.parameters(), self.compute.parameters())
        self.pairs = [(m, c) for m, c in pairs if m.requires_grad]
        for m, c in self.pairs:
            if m.shape != c.shape:
                raise RuntimeError("the compute copy's parameters do not line up with the master's")
            c.register_post_accumulate_grad_hook(self._accumulate(m))

    @staticmethod
    def _accumulate(m: torch.Tensor):
        def hook(c: torch.Tensor) -> None:
            if m.grad is None:
                m.grad = c.grad.to(m.dtype)
            else:
                m.grad.add_(c.grad)
            c.grad = None

        return hook

    @torch.no_grad()
    def refresh(self) -> None:
        torch._foreach_copy_([c for _, c in self.pairs], [m for m, _ in self.pairs])


@dataclass
class WeightShard:
    """Rows [first_row, first_row + len(local)) of the published tensor `name` of `shape`, held by one rank."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    first_row: int
    local: torch.Tensor


def _split_mismatch(sums: dict[str, float]) -> dict[str, float]:
    """Mean |train - rollout| log-prob over the tokens scored with the rollout's own weights
    (`logprob_mismatch_same_weights`: numerical alone) and over the others (`logprob_mismatch_stale_weights`:
    numerical plus drift); a side with no tokens this step is left out."""
    same_n = sums.get("mismatch_same_tokens", 0.0)
    stale_n = sums.get("tokens", 0.0) - same_n
    out = {}
    if same_n > 0:
        out["logprob_mismatch_same_weights"] = sums.get("mismatch_same_abs_sum", 0.0) / same_n
    if stale_n > 0:
        stale_sum = sums.get("mismatch_abs_sum", 0.0) - sums.get("mismatch_same_abs_sum", 0.0)
        out["logprob_mismatch_stale_weights"] = max(stale_sum, 0.0) / stale_n
    return out


def _local(p: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's own rows (the same storage, no autograd); a plain tensor itself."""
    if hasattr(p, "to_local"):
        with torch.no_grad():
            return p.to_local()
    return p


def _first_row(p: torch.Tensor, rank: int, world: int) -> int:
    """FSDP's dim-0 sharding: rank r holds rows [r c, (r + 1) c) of n, c = ceil(n / world), cut at n."""
    if world == 1 or not hasattr(p, "to_local"):
        return 0
    n = p.shape[0]
    return min(rank * -(-n // world), n)


def compile_layers(model: PreTrainedModel) -> None:
    """Regional compilation: each decoder layer's forward through torch.compile, in place (the module and its
    parameter names stay as they are, so sharding, checkpoints and the publish see the same model). Norms,
    rotary embeddings, activations and casts fuse into a few kernels around the matrix products and the
    attention; the layers share one compiled graph with dynamic shapes (packed micro-batches change length every
    step). The policy's forward passes `use_cache=False`: a KV cache object in the layer's arguments changes
    the graph's guards layer by layer, and the recompile limit then leaves every layer eager."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(
            f"trainer.compile: {type(model).__name__} has no decoder layers at model.get_decoder().layers; "
            "set trainer.compile=false"
        )
    for layer in layers:
        layer.compile(dynamic=True)


def shard_policy(
    policy: PolicyLogprobs, device: torch.device, cpu_offload: bool, reshard_after_forward: bool = True
) -> None:
    """FSDP2: each decoder layer its own unit, then the whole policy (embeddings, final norm, output layer). On
    CUDA: bf16 compute from fp32 master weights, gradients reduced in fp32."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {}
    if device.type == "cuda":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    if device.type == "cuda" and not cpu_offload:
        policy.to(device)
    layers = getattr(policy.model.get_decoder(), "layers", None)
    for layer in layers if layers is not None else []:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(policy, **kw)
