"""The policy-gradient loss: GRPO's group-normalised advantages and clipped loss (Clip-Higher, token-level
mean, TIS/MIS), and the algorithms that differ from it in one term each (README "Algorithms"): the advantage
(Dr.GRPO, RLOO, REINFORCE++), the aggregation over tokens (Dr.GRPO, GSPO) and the ratio (GSPO); and PPO's
per-token advantages from a learned critic (`gae`, `value_loss`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from laminar.config import ADVANTAGES, LOSS_AGGS, RATIOS, RolloutConfig, TrainerConfig


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
    advantage: str = "grpo"  # ADVANTAGES: see `advantages`
    loss_agg: str = "token_mean"  # LOSS_AGGS: see `aggregate`
    ratio: str = "token"  # RATIOS: token, or GSPO's one ratio a sequence (`sequence_ratio`)
    norm_tokens: int = 0  # seq_mean_token_sum_norm's constant: the longest response (rollout.max_new_tokens)

    @classmethod
    def of(cls, t: TrainerConfig, r: RolloutConfig) -> GRPOConfig:
        """The loss of a run: the `trainer` section's terms, and the distribution the rollout samples from (a
        greedy rollout's log-probs are taken at temperature 1) with its longest response as Dr.GRPO's constant.
        Decoupled PPO (`trainer.correction` tis or mis) takes the ratio against the trainer's own log-probs."""
        return cls(
            clip_low=t.clip_low,
            clip_high=t.clip_high,
            temperature=r.temperature if r.temperature > 0 else 1.0,
            top_k=r.top_k,
            top_p=r.top_p,
            proximal="behaviour" if t.correction == "none" else "trainer",
            is_correction=t.correction,
            is_cap=t.is_cap,
            kl_coef=t.kl_coef,
            advantage=t.advantage,
            loss_agg=t.loss_agg,
            ratio=t.ratio,
            norm_tokens=r.max_new_tokens,
        )

    def __post_init__(self) -> None:
        for name, valid in (("advantage", ADVANTAGES), ("loss_agg", LOSS_AGGS), ("ratio", RATIOS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"grpo.{name}={getattr(self, name)!r}: expected one of {', '.join(valid)}")
        if self.ratio == "sequence" and self.loss_agg != "seq_mean_token_mean":
            raise ValueError(
                f"grpo.ratio='sequence' needs grpo.loss_agg='seq_mean_token_mean' (GSPO), not {self.loss_agg!r}"
            )
        if self.loss_agg == "seq_mean_token_sum_norm" and self.norm_tokens <= 0:
            raise ValueError(
                f"grpo.norm_tokens={self.norm_tokens}: seq_mean_token_sum_norm needs a positive constant"
            )
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


def advantages(
    rewards: list[list[float]], lengths: list[list[int]], kind: str = "grpo", eps: float = 1e-6
) -> list[list[float]]:
    """One advantage a trajectory (every token of it gets it), by group of samples of one prompt; `lengths`
    are each trajectory's trained tokens, the weights of REINFORCE++'s whitening over the batch. A group of
    one sample has no baseline: zeros, as in `group_advantages`.

    - grpo: (r - mean) / (std + eps), the group's population std (`group_advantages`).
    - drgrpo: r - mean (Dr.GRPO, arXiv 2503.20783: no std scaling).
    - rloo: r - the mean of the group's other samples = n / (n - 1) (r - mean) (arXiv 2402.14740).
    - reinforce_pp: r whitened over every trained token of the batch: (r - mu) / sqrt(var + 1e-8), mu and the
      unbiased var over tokens (REINFORCE++, arXiv 2501.03262, outcome reward, gamma 1).
    - reinforce_pp_baseline: r - the group's mean, then whitened over the batch the same way.
    """
    if kind == "grpo":
        return group_advantages(rewards, eps)
    out = []
    for group in rewards:
        r, n = torch.tensor(group, dtype=torch.float64), len(group)
        if kind == "reinforce_pp":
            out.append(r)
        elif n < 2:
            out.append(torch.zeros_like(r))
        elif kind == "rloo":
            out.append((r - r.mean()) * n / (n - 1))
        else:  # drgrpo, reinforce_pp_baseline
            out.append(r - r.mean())
    if kind.startswith("reinforce_pp"):
        out = _whiten(out, [torch.tensor(g, dtype=torch.float64) for g in lengths])
    return [a.tolist() for a in out]


def gae(
    rewards: list[float], values: list[list[float]], gamma: float = 1.0, lam: float = 1.0
) -> tuple[list[list[float]], list[list[float]]]:
    """PPO's per-token advantages and returns (GAE, arXiv 1506.02438) for each trajectory's trained tokens, its
    outcome reward on the last one and 0 on the others: delta_t = r_t + gamma V_{t+1} - V_t (V after the last
    token is 0), A_t = delta_t + gamma lam A_{t+1}, return_t = A_t + V_t. `values`: the critic's V(s_t), the
    value of the state each trained token is emitted from. With gamma = lam = 1 (the defaults, as verl's) A_t is
    r - V_t."""
    advs, rets = [], []
    for r, v in zip(rewards, values):
        a, running = [0.0] * len(v), 0.0
        for t in range(len(v) - 1, -1, -1):
            nxt = v[t + 1] if t + 1 < len(v) else 0.0
            delta = (r if t == len(v) - 1 else 0.0) + gamma * nxt - v[t]
            running = delta + gamma * lam * running
            a[t] = running
        advs.append(a)
        rets.append([x + y for x, y in zip(a, v)])
    return advs, rets


def whiten_tokens(
    advs: list[list[float]],
    eps: float = 1e-8,
    moments: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[list[float]]:
    """Every token's advantage less the batch's mean over tokens, over its standard deviation (PPO's usual
    normalisation, verl's `masked_whiten`); a batch of one token is only centred. `moments`: sums a float64
    vector over the ranks of a sharded trainer, each holding its share of the batch's tokens, so the mean and
    deviation are the whole batch's (two passes, as a one-process variance is)."""
    flat = torch.tensor([x for a in advs for x in a], dtype=torch.float64)
    total = (lambda v: v) if moments is None else moments
    n, s = total(torch.tensor([flat.numel(), float(flat.sum())], dtype=torch.float64)).tolist()
    if n == 0:
        return advs
    mean = s / n
    squares = float(total(torch.tensor([float(((flat - mean) ** 2).sum())], dtype=torch.float64))[0])
    scale = math.sqrt(squares / (n - 1) + eps) if n > 1 else 1.0
    out = ((flat - mean) / scale).tolist()
    split, i = [], 0
    for a in advs:
        split.append(out[i : i + len(a)])
        i += len(a)
    return split


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    num_tokens: int | float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, 0.5 max((V - R)^2, (V_clipped - R)^2) with V_clipped within `clip` of the
    step's starting values, summed over the trained tokens and divided by `num_tokens` (the mini-batch's, so
    micro-batches add up to its token mean). Metrics are sums over this micro-batch's trained tokens."""
    mask = mask.float()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = (per_token * mask).sum() / max(float(num_tokens), 1.0)
    with torch.no_grad():
        metrics = {
            "value_loss_sum": float((per_token * mask).sum()),
            "value_sum": float((values * mask).sum()),
            "return_sum": float((returns * mask).sum()),
            "value_clipped_sum": float(
                (((values - returns) ** 2 < (clipped - returns) ** 2).float() * mask).sum()
            ),
        }
    return loss, metrics


def _whiten(values: list[torch.Tensor], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """(x - mean) / sqrt(var + 1e-8) with every trained token counted once: the mean and the unbiased variance
    weighted by each trajectory's token count, over the whole batch (verl's `masked_whiten`)."""
    x, w = torch.cat(values), torch.cat(weights)
    total = w.sum()
    if total <= 1:
        return [torch.zeros_like(v) for v in values]
    mean = (w * x).sum() / total
    var = (w * (x - mean) ** 2).sum() / total * total / (total - 1)
    return [(v - mean) / torch.sqrt(var + 1e-8) for v in values]


def informative(rewards: list[float]) -> bool:
    """A group whose rewards are all equal has zero advantage on every token: no GRPO signal. DAPO's dynamic
    sampling drops such groups rather than spend a step's slots on them."""
    return len(set(rewards)) > 1


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
# the critic's loss metrics (`value_loss`), summed over micro-batches and ranks
VALUE_METRICS = ("value_loss_sum", "value_sum", "return_sum", "value_clipped_sum")
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
    seq_lengths: list[int] | None = None,
    num_seqs: int | float = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sum of per-token losses divided by `num_tokens`, the response-token count of the whole mini-batch, so
    micro-batches accumulate to a token-level mean (long responses weigh by their length, as in DAPO); the
    other `cfg.loss_agg` modes divide by the mini-batch's `num_seqs` (`aggregate`). `seq_lengths`: the number
    of elements of each sequence, in order, over the flattened tensors (needed by the sequence-level terms).

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
    seq = None
    if cfg.ratio != "token" or cfg.loss_agg != "token_mean":
        if seq_lengths is None or sum(seq_lengths) != mask.numel():
            raise ValueError(f"grpo_loss: {cfg.ratio} ratio / {cfg.loss_agg} needs the sequences' lengths")
        seq = torch.repeat_interleave(
            torch.arange(len(seq_lengths), device=mask.device),
            torch.tensor(seq_lengths, device=mask.device),
        ).view(mask.shape)
    if cfg.ratio == "token":
        ratio = torch.exp(logp - old.detach())
    else:
        ratio = sequence_ratio(logp, old, mask, seq, len(seq_lengths))
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = -w * torch.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if cfg.kl_coef > 0 and ref_logp is not None:
        d = torch.where(mask > 0, ref_logp.detach() - logp, 0.0)  # exp() of padding could overflow to inf
        # k3: its value estimates KL(pi || ref) on the policy's samples; as a loss (samples fixed) its gradient
        # is, in expectation, that of KL(ref || pi)
        kl = torch.exp(d) - d - 1.0
        per_token = per_token + cfg.kl_coef * kl
    if cfg.loss_agg == "token_mean":
        loss = (per_token * mask).sum() / max(float(num_tokens), 1.0)
    else:
        loss = aggregate(per_token, mask, seq, len(seq_lengths), cfg, num_seqs)

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


def _per_sequence(x: torch.Tensor, seq: torch.Tensor, n: int) -> torch.Tensor:
    """The sum of `x` over each sequence (`seq`: each element's sequence index)."""
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, seq.reshape(-1), x.reshape(-1))


def sequence_ratio(
    logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, seq: torch.Tensor, n: int
) -> torch.Tensor:
    """GSPO's ratio (arXiv 2507.18071): s_i = exp(mean over the sequence's trained tokens of log pi / pi_old),
    the same value on each token of sequence i, clipped as one. Its gradient flows through each token's own
    log-prob, s_i,t = sg[s_i] x pi_t / sg[pi_t], so a sequence mean of the per-token terms has the gradient
    of s_i itself; the log is capped at 10 (verl's `compute_policy_loss_gspo`)."""
    log_ratio = torch.where(mask > 0, logp - old, 0.0).detach()
    count = _per_sequence(mask, seq, n).clamp(min=1.0)
    log_s = _per_sequence(log_ratio, seq, n) / count
    return torch.exp((logp - logp.detach() + log_s[seq]).clamp(max=10.0))


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    seq: torch.Tensor,
    n: int,
    cfg: GRPOConfig,
    num_seqs: int | float,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss, `num_seqs` being the mini-batch's sequences with a
    trained token (so micro-batches and ranks add up to the mini-batch's value):
    - seq_mean_token_mean: the mean over sequences of each one's token mean (GSPO; verl's seq-mean-token-mean);
    - seq_mean_token_sum_norm: the mean over sequences of each one's token sum divided by the constant
      `norm_tokens` (Dr.GRPO, arXiv 2503.20783: no length normalisation, a constant in its place)."""
    masked = per_token * mask
    if cfg.loss_agg == "seq_mean_token_mean":
        means = _per_sequence(masked, seq, n) / _per_sequence(mask, seq, n).clamp(min=1.0)
        return means.sum() / max(float(num_seqs), 1.0)
    return masked.sum() / (max(float(num_seqs), 1.0) * cfg.norm_tokens)
