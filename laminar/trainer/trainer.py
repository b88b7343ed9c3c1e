"""The trainer: a Hugging Face policy, AdamW and the GRPO step; plain Python (the runtime wraps it in an actor).
Its other jobs live beside it, one module each, mixed into `Trainer`: batching (`batches`), the publish
(`publish`), checkpoints (`checkpointing`), the non-finite guard (`finite`), the forward passes outside the
step's loss (`forward`); the model's layout over devices is `sharding`."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from laminar.config import RolloutConfig, TrainerConfig
from laminar.data.records import Trajectory
from laminar.data.staleness import staleness
from laminar.engine.model_dir import check_model_dir
from laminar.trainer import lora
from laminar.trainer.batches import Batching
from laminar.trainer.checkpointing import Checkpointing
from laminar.trainer.critic import Critic
from laminar.trainer.finite import FiniteChecks
from laminar.trainer.forward import Forwards
from laminar.trainer.grpo import (
    LOSS_METRICS,
    VALUE_METRICS,
    GRPOConfig,
    advantages,
    gae,
    grpo_loss,
    value_loss,
    whiten_tokens,
)
from laminar.trainer.logprobs import PolicyLogprobs
from laminar.trainer.packing import supports_packing, use_packed_attention
from laminar.trainer.publish import Publishing, WeightShard
from laminar.trainer.sharding import MasterWeights, clip_grad_norm, compile_layers, shard_policy


def load_policy(path: str | Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(check_model_dir(path), dtype=torch.float32)
    return model.train()


class Trainer(Batching, Forwards, Publishing, Checkpointing, FiniteChecks):
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
        # PPO's learned critic (trainer.advantage=gae): a copy of the starting decoder with a value head, sharded
        # over the ranks as the policy is
        self.critic = (
            Critic(
                model, cfg.critic_lr, cfg.weight_decay, cfg.max_grad_norm, self.device, world, cfg.cpu_offload
            )
            if cfg.advantage == "gae"
            else None
        )
        self.lora = cfg.lora_rank > 0
        if self.lora:
            if world > 1:
                raise ValueError("trainer.lora_rank > 0 needs one trainer rank (trainer.num_workers=1)")
            lora.add_adapters(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, model_path)
            if cfg.publishes_adapters:
                lora.adapted_modules(model)  # every adapter one the engine can add
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
        self._merged: dict[str, torch.Tensor] = {}  # LoRA: the published buffers kept (see named_weights)
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
        # Decoupled PPO's pre-update log-probs: with one update a step they are the training forward's own
        # (detached below), so the extra pass runs only when later mini-batches train on updated weights
        decoupled = self.loss.proximal == "trainer"
        if decoupled and len(plan) > 1:
            proximal = self._logprobs_no_grad(trajs, [mb for _, mbs in plan for mb in mbs])

        sums: dict[str, float] = {}
        losses, grad_norms, value_norms = [], [], []
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
                    proximal=torch.cat([proximal[i] for i in idx])
                    if proximal
                    else (logp.detach() if decoupled else None),
                    ref_logp=ref,
                    same_weights=self._same_weights([trajs[i] for i in idx], decoupled or updates == 0),
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
                    (v_loss * self.world).backward()  # FSDP averages over ranks, as the policy's
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
                value_norms.append(self.critic.step())
            if self.master is not None:
                self.master.refresh()
            updates += 1

        if self.world > 1:  # the same keys on every rank, one with only idle passes included
            keys = sorted(
                set(LOSS_METRICS)
                | {"idle_passes"}
                | ({"kl_sum"} if self.ref_policy is not None else set())
                | (set(VALUE_METRICS) if self.critic is not None else set())
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
            **(self._critic_metrics(sums, n_tok, value_norms) if self.critic is not None else {}),
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
            if idx is None:  # sharded, this rank done: a forward keeps the critic's all-gathers in step
                self.critic.values(self._collate([min(trajs, key=lambda t: t.num_tokens)]))
                continue
            v = self.critic.values(self._collate([trajs[i] for i in idx]))
            for i, part in zip(idx, v.split([len(trajs[i].response_ids) for i in idx])):
                values[i] = part
        order = sorted(values)
        trained = [[j for j, m in enumerate(trajs[i].trained_mask) if m] for i in order]
        v_trained = [[float(values[i][j]) for j in js] for i, js in zip(order, trained)]
        a, r = gae([trajs[i].reward for i in order], v_trained, self.cfg.gae_gamma, self.cfg.gae_lambda)
        a = whiten_tokens(a, moments=self._all_sum)  # over the whole batch's tokens, every rank's
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
    def _critic_metrics(sums: dict[str, float], n_tok: float, norms: list[float]) -> dict[str, float]:
        return {
            "value_loss": sums.get("value_loss_sum", 0.0) / n_tok,
            "value_mean": sums.get("value_sum", 0.0) / n_tok,
            "return_mean": sums.get("return_sum", 0.0) / n_tok,
            "value_clip_frac": sums.get("value_clipped_sum", 0.0) / n_tok,
            "value_grad_norm": float(np.mean(norms)) if norms else 0.0,
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
        return clip_grad_norm(self.model.parameters(), self.cfg.max_grad_norm)

    def _all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks (itself with one rank); float64 on the host side of the call."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        out = values.to(self.device, torch.float64)
        dist.all_reduce(out)
        return out.cpu()


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
