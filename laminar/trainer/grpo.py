"""GRPO: group-normalised advantages and the clipped policy loss (Clip-Higher, token-level mean, TIS/MIS)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GRPOConfig:
    """Loss knobs. `proximal="behaviour"` is plain PPO against the rollout's log-probs; `"trainer"` is decoupled
    PPO: the ratio is taken against the trainer's own pre-update log-probs, and the gap between those and the
    rollout's is corrected by an importance weight, truncated (`tis`) or masked (`mis`) above `is_cap`."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    temperature: float = 1.0
    top_k: int = 0  # the rollout's truncation, so the trainer's log-probs are of the distribution sampled
    top_p: float = 1.0
    proximal: str = "behaviour"  # "behaviour" | "trainer"
    is_correction: str = "none"  # "none" | "tis" | "mis"
    is_cap: float = 2.0
    kl_coef: float = 0.0  # 0 = KL-free (no reference model)
    adv_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.proximal not in ("behaviour", "trainer"):
            raise ValueError(f"grpo.proximal={self.proximal!r}: expected 'behaviour' or 'trainer'")
        if self.is_correction not in ("none", "tis", "mis"):
            raise ValueError(f"grpo.is_correction={self.is_correction!r}: expected 'none', 'tis' or 'mis'")
        if self.is_correction != "none" and self.proximal != "trainer":
            raise ValueError(
                "grpo.is_correction needs grpo.proximal='trainer' (the weight is proximal/behaviour)"
            )
        for name in ("clip_low", "clip_high", "temperature", "is_cap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"grpo.{name}={getattr(self, name)}: must be > 0")
        if self.clip_low >= 1:
            raise ValueError(f"grpo.clip_low={self.clip_low}: must be < 1 (the lower clip is 1 - clip_low)")
        if self.top_k < 0:
            raise ValueError(f"grpo.top_k={self.top_k}: must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"grpo.top_p={self.top_p}: must be in (0, 1]")
        if self.kl_coef < 0:
            raise ValueError(f"grpo.kl_coef={self.kl_coef}: must be >= 0")


def group_advantages(rewards: list[list[float]], eps: float = 1e-6) -> list[list[float]]:
    """(r - mean) / (std + eps) within each group (population std); a group with one reward gets zeros."""
    out = []
    for group in rewards:
        r = torch.tensor(group, dtype=torch.float64)
        adv = (r - r.mean()) / (r.std(unbiased=False) + eps)
        out.append(adv.tolist())
    return out


def informative(rewards: list[float]) -> bool:
    """A group whose rewards are all equal has zero advantage on every token: no GRPO signal. DAPO's dynamic
    sampling drops such groups rather than spend a step's slots on them."""
    return len(set(rewards)) > 1


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each target under softmax(logits / T), the same quantity the engine records."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def importance_weights(
    proximal: torch.Tensor, behaviour: torch.Tensor, mode: str, cap: float
) -> torch.Tensor:
    """pi_prox / pi_behav per token: capped (TIS) or zeroed above the cap (MIS); no gradient flows through it."""
    w = torch.exp((proximal - behaviour).detach())
    if mode == "tis":
        return w.clamp(max=cap)
    if mode == "mis":
        return torch.where(w <= cap, w, torch.zeros_like(w))
    return torch.ones_like(w)


# the metric sums `grpo_loss` returns ("kl_sum" too with a reference); a sharded trainer reduces exactly these
LOSS_METRICS = (
    "clip_frac_sum",
    "ratio_sum",
    "is_weight_sum",
    "is_masked_sum",
    "mismatch_abs_sum",
    "mismatch_kl_sum",
    "mismatch_same_abs_sum",
    "mismatch_same_tokens",
    "tokens",
)


def grpo_loss(
    logp: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    num_tokens: int | float,
    proximal: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    same_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sum of per-token losses divided by `num_tokens`, the response-token count of the whole mini-batch, so
    micro-batches accumulate to a token-level mean (long responses weigh by their length, as in DAPO).

    All tensors are [batch, time]; `mask` is 1 on response tokens. Metrics are sums over this micro-batch's
    masked tokens (keys ending in `_sum`) so the caller can average them over the mini-batch.

    `same_weights` is 1 on tokens whose rollout ran the very weights the train log-prob (`proximal`, else
    `logp`) was computed with: there the train/rollout mismatch is numerical alone (kernels, precision); on the
    others it also holds the policy's drift since the rollout's version. The two are reported apart.
    """
    mask = mask.float()
    old = behaviour if cfg.proximal == "behaviour" else proximal
    if old is None:
        raise ValueError("grpo_loss: proximal='trainer' needs the trainer's pre-update log-probs")
    w = importance_weights(old, behaviour, cfg.is_correction, cfg.is_cap)
    ratio = torch.exp(logp - old.detach())
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = -w * torch.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if cfg.kl_coef > 0 and ref_logp is not None:
        d = torch.where(mask > 0, ref_logp.detach() - logp, 0.0)  # exp() of padding could overflow to inf
        # k3: its value estimates KL(pi || ref) on the policy's samples; as a loss (samples fixed) its gradient
        # is, in expectation, that of KL(ref || pi)
        kl = torch.exp(d) - d - 1.0
        per_token = per_token + cfg.kl_coef * kl
    loss = (per_token * mask).sum() / max(float(num_tokens), 1.0)

    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - cfg.clip_low) & (advantages < 0)) | (
            (ratio > 1.0 + cfg.clip_high) & (advantages > 0)
        )
        train_vs_rollout = (proximal if proximal is not None else logp).detach() - behaviour
        metrics = {
            "clip_frac_sum": float((is_clipped.float() * mask).sum()),
            "ratio_sum": float((ratio * mask).sum()),
            "is_weight_sum": float((w * mask).sum()),
            "is_masked_sum": float(((w == 0).float() * mask).sum()),
            "mismatch_abs_sum": float((train_vs_rollout.abs() * mask).sum()),
            # k3 estimate of KL(rollout || train) from the rollout's own samples: exp(d) - 1 - d, d = train - rollout
            "mismatch_kl_sum": float(((torch.exp(train_vs_rollout) - 1.0 - train_vs_rollout) * mask).sum()),
            "tokens": float(mask.sum()),
        }
        same = mask * (same_weights.float() if same_weights is not None else torch.zeros_like(mask))
        metrics["mismatch_same_abs_sum"] = float((train_vs_rollout.abs() * same).sum())
        metrics["mismatch_same_tokens"] = float(same.sum())
        if kl is not None:
            metrics["kl_sum"] = float((kl * mask).sum())
    return loss, metrics
