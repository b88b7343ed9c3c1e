"""The trainer's forward passes outside the step's loss: log-probs without a gradient (for checks, evaluation
and the step's own before-update log-probs), the zero-loss passes that keep a sharded trainer's ranks in step,
and the start-up warm-up."""

from __future__ import annotations

from typing import Any

import torch

from laminar.data.records import Trajectory
from laminar.trainer.logprobs import PolicyLogprobs


class Forwards:
    """`Trainer`'s forward passes (reads `model`, `policy`, `ref_policy`, `critic`, `master`, `optimizer`,
    `device`, `world` and `version`; uses `plan` and `_collate` of `Batching`)."""

    def _idle_pass(self, trajs: list[Trajectory]) -> None:
        """What a real micro-batch runs, in the same order and with zero loss, on the shortest sequence: the
        policy's forward, the reference's forward when the KL term is on, the policy's backward, and the critic's
        forward and backward with PPO's critic. Every sharded
        module's collectives then run as often as on the busiest rank, without changing any gradient; a rank
        that skipped one would leave the others waiting in its all-gather."""
        self._zero_loss_pass([min(trajs, key=lambda t: t.num_tokens)], every_model=True)

    def _zero_loss_pass(self, trajs: list[Trajectory], every_model: bool = False) -> None:
        """A zero-loss forward and backward of the policy; `every_model`: of the KL reference and the critic too,
        where the run has them (in a real micro-batch's order)."""
        batch = self._collate(trajs, [0.0] * len(trajs))
        logp = self._forward_logprobs(self.policy, batch)
        if every_model and self.ref_policy is not None:
            with torch.no_grad():
                self._forward_logprobs(self.ref_policy, batch)
        (logp.sum() * 0.0).backward()
        if every_model and self.critic is not None:
            (self.critic.values(batch).sum() * 0.0).backward()

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
