"""The trainer's batches: a step's trajectories planned into mini-batches split across the ranks by tokens, cut
into micro-batches, and collated into tensors (right-padded, or packed into one row)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from laminar.data.records import Trajectory


class Batching:
    """`Trainer`'s batching (reads `cfg`, `world`, `rank`, `packed`, `pad_id` and `device`)."""

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


def _token_advantages(advs: list[float | list[float]] | None, b: int, r: int) -> list[float]:
    """The advantage of each of sequence b's r response tokens: its one value repeated, or its per-token list."""
    if advs is None:
        return [0.0] * r
    a = advs[b]
    return list(a) if isinstance(a, list) else [a] * r
