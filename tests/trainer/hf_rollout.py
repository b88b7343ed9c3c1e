"""Rollouts with Hugging Face `generate` for the learning check (`test_learning`): the trainer tested without the
rollout engine. Test code, so it lives with the tests."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from laminar.data.records import PromptGroup, Trajectory


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each target under softmax(logits / T), the same quantity the engine records."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate_groups(
    model: PreTrainedModel,
    groups: list[PromptGroup],
    *,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    version: int = 0,
    greedy: bool = False,
) -> list[list[Trajectory]]:
    """Samples each group's n responses; log-probs are under softmax(logits / T), as the engine records them."""
    was_training = model.training
    model.eval()
    prompts = [g.prompt_ids for g in groups for _ in range(g.n)]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, p in enumerate(prompts):  # left padding, as generate expects for decoder-only models
        ids[b, width - len(p) :] = torch.tensor(p)
        attn[b, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=attn,
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=1.0 if not greedy else None,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1)
    logp = token_logprobs(logits, new, 1.0 if greedy else temperature)
    model.train(was_training)

    result: list[list[Trajectory]] = []
    b = 0
    for g in groups:
        row = []
        for i in range(g.n):
            toks = new[b].tolist()
            finish = "length"
            if eos_id in toks:
                toks = toks[: toks.index(eos_id) + 1]
                finish = "stop"
            row.append(
                Trajectory(
                    traj_id=g.traj_id(i),
                    group_id=g.group_id,
                    sample_idx=i,
                    prompt_ids=list(g.prompt_ids),
                    response_ids=toks,
                    logprobs=logp[b, : len(toks)].tolist(),
                    version=version,
                    finish_reason=finish,
                )
            )
            b += 1
        result.append(row)
    return result
