"""The trainer: a Hugging Face policy, AdamW and the GRPO step; plain Python (the runtime wraps it in an actor)."""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, PreTrainedModel

from laminar.data.codec import copy_tokenizer_files
from laminar.data.records import Trajectory
from laminar.data.staleness import staleness
from laminar.trainer.grpo import GRPOConfig, group_advantages, grpo_loss, token_logprobs
from laminar.trainer.state_files import CheckpointError, load_trainer_state, save_trainer_state

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass
class TrainerConfig:
    model_path: str = ""
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 32  # sequences per forward/backward; memory, not maths
    micro_batch_tokens: int = (
        0  # > 0: micro-batches filled up to this many padded tokens instead (longest first)
    )
    mini_batches: int = 1  # optimizer updates per train_step (version still counts train_steps)
    seed: int = 0
    threads: int = 1
    device: str = "cpu"  # cpu | cuda (fp32 master weights; bf16 autocast on CUDA)
    publish_dtype: str = ""  # dtype of the published weights; empty = the parameters' (float32)
    max_nonfinite_steps: int = 3  # non-finite steps skipped in a row before NonFiniteError
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self) -> None:
        if isinstance(self.grpo, dict):
            self.grpo = GRPOConfig(**self.grpo)
        if self.micro_batch_tokens < 0:
            raise ValueError(f"trainer.micro_batch_tokens={self.micro_batch_tokens}: must be >= 0")
        for name in ("lr", "micro_batch_size", "mini_batches", "threads", "max_nonfinite_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"trainer.{name}={getattr(self, name)}: must be > 0")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"trainer.device={self.device!r}: must be cpu, cuda or cuda:N")
        if self.publish_dtype not in ("", "float32", "bfloat16"):
            raise ValueError(f"trainer.publish_dtype={self.publish_dtype!r}: must be '', float32 or bfloat16")


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

    def __init__(self, cfg: TrainerConfig, model: PreTrainedModel | None = None) -> None:
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"trainer.device={cfg.device!r}, but CUDA is not available here")
        self.model = (
            (model if model is not None else load_policy(cfg.model_path)).float().to(self.device).train()
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        # The KL reference is the starting policy, frozen; never saved: a resumed or restarted trainer loads it
        # again from the same starting weights, so a checkpoint holds the policy alone.
        self.ref_model = self._load_reference(model) if cfg.grpo.kl_coef > 0 else None
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self.version = 0
        self.nonfinite_steps = 0  # skipped steps, all told
        self.nonfinite_in_a_row = 0

    def _load_reference(self, model: PreTrainedModel | None) -> PreTrainedModel:
        """A frozen copy of the starting weights, in eval mode; bf16 on CUDA (it only ever runs under bf16
        autocast there, and it halves its memory), float32 on CPU."""
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if model is not None:  # given in memory: copy it before the first update
            ref = copy.deepcopy(self.model).to(dtype)
        else:
            path = check_model_dir(self.cfg.model_path)
            ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        ref.requires_grad_(False)
        return ref.eval()

    # ---- the step -------------------------------------------------------------------------------------------

    def train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        """One GRPO step on complete groups; returns metrics. Staleness is measured against the version the
        trainer holds when it consumes the data (before this step's update).

        A step whose loss or gradient norm is not finite is skipped: no optimizer update (with several
        mini-batches, from the first non-finite one on), the version still advances (the batch is consumed) and
        `nonfinite` is set in the metrics.
        `max_nonfinite_steps` such steps in a row raise `NonFiniteError`."""
        t0 = time.perf_counter()
        for g in groups:
            for t in g:
                if len(t.logprobs) != len(t.response_ids):
                    raise ValueError(
                        f"trajectory {t.traj_id}: {len(t.logprobs)} log-probs for {len(t.response_ids)} response tokens"
                    )
        advs = group_advantages([[t.reward for t in g] for g in groups], self.cfg.grpo.adv_eps)
        trajs = [t for g in groups for t in g]
        adv_of = [a for ga in advs for a in ga]
        proximal = None
        if self.cfg.grpo.proximal == "trainer":
            proximal = self._logprobs_no_grad(self.model, trajs)

        sums: dict[str, float] = {}
        losses, grad_norms = [], []
        nonfinite = False
        updates = 0
        for mb in np.array_split(np.arange(len(trajs)), self.cfg.mini_batches):
            mb = mb.tolist()
            if not mb:
                continue
            num_tokens = sum(len(trajs[i].response_ids) for i in mb)
            self.optimizer.zero_grad(set_to_none=True)
            mb_loss = 0.0
            for idx in self.micro_batches([trajs[i].num_tokens for i in mb], mb):
                batch = self._collate([trajs[i] for i in idx], [adv_of[i] for i in idx])
                logp = self._forward_logprobs(self.model, batch)
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref = self._forward_logprobs(self.ref_model, batch)
                loss, m = grpo_loss(
                    logp,
                    batch["behaviour"],
                    batch["advantages"],
                    batch["mask"],
                    self.cfg.grpo,
                    num_tokens,
                    proximal=self._pad_like([proximal[i] for i in idx], batch) if proximal else None,
                    ref_logp=ref,
                )
                loss.backward()
                mb_loss += loss.detach().item()
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
            grad_norms.append(
                float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
            )
            losses.append(mb_loss)
            if not (math.isfinite(mb_loss) and math.isfinite(grad_norms[-1])):
                self.optimizer.zero_grad(set_to_none=True)  # nothing of this batch reaches the weights
                nonfinite = True
                break
            self.optimizer.step()
            updates += 1

        self._count_nonfinite(nonfinite, losses, grad_norms)
        lags = [staleness(self.version, t.version) for t in trajs]
        rewards = [t.reward for t in trajs]
        n_tok = max(sums.get("tokens", 0.0), 1.0)
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
            "response_len_mean": float(np.mean([len(t.response_ids) for t in trajs])),
            "staleness_mean": float(np.mean(lags)),
            "staleness_max": int(max(lags)),
            "clip_frac": sums.get("clip_frac_sum", 0.0) / n_tok,
            "ratio_mean": sums.get("ratio_sum", 0.0) / n_tok,
            "is_weight_mean": sums.get("is_weight_sum", 0.0) / n_tok,
            "is_masked_frac": sums.get("is_masked_sum", 0.0) / n_tok,
            "logprob_mismatch_abs": sums.get("mismatch_abs_sum", 0.0) / n_tok,
            "logprob_mismatch_kl": sums.get("mismatch_kl_sum", 0.0) / n_tok,
            "updates": updates,
            **({"kl": sums.get("kl_sum", 0.0) / n_tok} if self.ref_model is not None else {}),
            "step_time_s": time.perf_counter() - t0,
            "nonfinite": nonfinite,
            "nonfinite_steps": self.nonfinite_steps,
            "reward_errors_in_batch": sum("reward_error" in t.meta for t in trajs),
        }

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
        """Raise `NonFiniteError` naming the first parameter that holds NaN or inf (before a publish or save)."""
        params = list(self.model.named_parameters())
        flags = torch.stack([torch.isfinite(p).all() for _, p in params])
        if bool(flags.all()):
            return
        bad = [name for (name, _), ok in zip(params, flags.tolist()) if not ok]
        raise NonFiniteError(
            f"the trainer's weights hold NaN or inf at version {self.version} (parameter {bad[0]!r}"
            f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); they are neither published nor saved"
        )

    # ---- batching -------------------------------------------------------------------------------------------

    def micro_batches(self, lengths: list[int], index: list[int]) -> list[list[int]]:
        """`index` cut into micro-batches, longest sequences first, so each micro-batch pads to a length close to
        its own (the loss is normalised by the whole mini-batch's tokens: the order changes no gradient). By
        count (`micro_batch_size`), or filled up to `micro_batch_tokens` padded tokens when that is set."""
        order = [i for _, i in sorted(zip(lengths, index), key=lambda p: -p[0])]
        width = dict(zip(index, lengths))
        if self.cfg.micro_batch_tokens <= 0:
            n = self.cfg.micro_batch_size
            return [order[s : s + n] for s in range(0, len(order), n)]
        out: list[list[int]] = []
        for i in order:  # longest first: a micro-batch's padded size is its count x its first length
            if out and (len(out[-1]) + 1) * width[out[-1][0]] <= self.cfg.micro_batch_tokens:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def _collate(self, trajs: list[Trajectory], advs: list[float] | None = None) -> dict[str, torch.Tensor]:
        """Right-padded [B, L] ids; the other tensors are [B, L-1], aligned with next-token predictions."""
        seqs = [t.prompt_ids + t.response_ids for t in trajs]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width - 1))
        behaviour = torch.zeros((len(seqs), width - 1))
        adv = torch.zeros((len(seqs), width - 1))
        for b, (t, s) in enumerate(zip(trajs, seqs)):
            ids[b, : len(s)] = torch.tensor(s)
            attn[b, : len(s)] = 1
            p, r = len(t.prompt_ids), len(t.response_ids)
            mask[b, p - 1 : p - 1 + r] = 1.0
            behaviour[b, p - 1 : p - 1 + r] = torch.tensor(t.logprobs, dtype=torch.float32)
            if advs is not None:
                adv[b, p - 1 : p - 1 + r] = advs[b]
        batch = {"ids": ids, "attn": attn, "mask": mask, "behaviour": behaviour, "advantages": adv}
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    @staticmethod
    def _pad_like(rows: list[torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = torch.zeros_like(batch["mask"])
        for b, r in enumerate(rows):
            out[b, : len(r)] = r
        return out

    def _forward_logprobs(self, model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cuda = self.device.type == "cuda"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=batch["ids"], attention_mask=batch["attn"]).logits[:, :-1]
        return token_logprobs(logits, batch["ids"][:, 1:], self.cfg.grpo.temperature)

    @torch.no_grad()
    def _logprobs_no_grad(self, model: PreTrainedModel, trajs: list[Trajectory]) -> list[torch.Tensor]:
        """Per trajectory, the log-probs over [0, p-1+r) so they line up with `_collate`'s time axis."""
        out: list[torch.Tensor] = []
        for start in range(0, len(trajs), self.cfg.micro_batch_size):
            chunk = trajs[start : start + self.cfg.micro_batch_size]
            logp = self._forward_logprobs(model, self._collate(chunk))
            out += [logp[b, : t.num_tokens - 1].clone() for b, t in enumerate(chunk)]
        return out

    def response_logprobs(self, trajs: list[Trajectory]) -> list[list[float]]:
        """The current policy's log-probs of each trajectory's response tokens (for checks and evaluation)."""
        rows = self._logprobs_no_grad(self.model, trajs)
        return [r[len(t.prompt_ids) - 1 :].tolist() for r, t in zip(rows, trajs)]

    # ---- weights and checkpoints ----------------------------------------------------------------------------

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The HF state_dict to publish, with the keys `save_pretrained` writes: when embeddings are tied,
        `lm_head.weight` is left out (it is `model.embed_tokens.weight`) and loaders re-tie it. The tensors are
        live views, valid until the next `train_step`; copy them out before training on. On CUDA they stay on the
        GPU (the publisher copies them into its registered shared-memory slot); with `publish_dtype` they are cast
        copies, e.g. bf16 for a bf16 engine, which halves the bytes on the weight path. Non-finite weights
        raise `NonFiniteError` instead."""
        self.check_finite()
        sd = self.model.state_dict()
        if _ties_embeddings(self.model):
            sd.pop("lm_head.weight", None)
        if self.cfg.publish_dtype:
            dtype = getattr(torch, self.cfg.publish_dtype)
            return {k: v.detach().to(dtype) for k, v in sd.items()}
        return {k: v.detach() for k, v in sd.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])

    def save_checkpoint(self, out: str | Path) -> Path:
        """`out` becomes a whole HF model dir (config, safetensors, and the tokenizer, chat template and
        generation config of the model it started from) plus optimizer, RNG and step, with no pickle anywhere
        (see `state_files`)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        if self.cfg.model_path:
            copy_tokenizer_files(self.cfg.model_path, out)
        state = self.state_dict()
        meta = {"version": self.version, "config": asdict(self.cfg)}
        save_trainer_state(out, state["optimizer"], state["rng"], meta)
        return out

    def load_checkpoint(self, path: str | Path) -> None:
        path = check_model_dir(path)
        optimizer, rng, meta = load_trainer_state(path)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            raise CheckpointError(f"{path / 'model.safetensors'}: the weights do not load ({e})") from e
        self.load_state_dict(
            {"model": model.state_dict(), "optimizer": optimizer, "version": meta["version"], "rng": rng}
        )
