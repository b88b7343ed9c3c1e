"""A few trained trajectories of a step as text, for a person watching the run: every `run.samples_every` steps,
`run.samples_per_step` of them go to `RUN_DIR/samples.jsonl` and to the trackers (TensorBoard's text tab, a W&B
table). `trajectories.jsonl` keeps every trajectory as data; this is the file to read."""

from __future__ import annotations

from typing import Any

from laminar.data.records import Trajectory


def due(every: int, step: int) -> bool:
    """Whether trainer step `step` shows samples (`every` 0: never)."""
    return every > 0 and step % every == 0


def pick(groups: list[list[Trajectory]], count: int) -> list[Trajectory]:
    """`count` trajectories spread over the step's groups: the first sample of each group, then the second of
    each, and so on, so that every prompt of the step shows before any shows twice."""
    out: list[Trajectory] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out[:count]


def prompt_text(tokenizer: Any, ids: list[int]) -> str:
    """The prompt as the model read it (the chat template's text included), without special tokens."""
    return tokenizer.decode([i for i in ids if 0 <= i < len(tokenizer)], skip_special_tokens=True)


def sample_rows(groups: list[list[Trajectory]], step: int, count: int, codec: Any) -> list[dict[str, Any]]:
    """The rows of `samples.jsonl` for one step; `codec` is the run's `TaskCodec` (the response as the reward
    read it, `response_text`, as `trajectories.jsonl` has it)."""
    return [
        {
            "step": step,
            "traj_id": t.traj_id,
            "version": t.version,
            "replica": t.replica,
            "reward": t.reward,
            "finish_reason": t.finish_reason,
            "prompt_text": prompt_text(codec.tokenizer, t.prompt_ids),
            "response_text": codec.response_text(t.response_ids, t.loss_mask),
        }
        for t in pick(groups, count)
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    """One step's samples as TensorBoard's text tab renders them (Markdown)."""
    blocks = []
    for r in rows:
        head = (
            f"**{r['traj_id']}**: reward {r['reward']}, version {r['version']}, replica {r['replica']}, "
            f"{r['finish_reason']}"
        )
        blocks.append(f"{head}\n\n```\n{r['prompt_text']}\n```\n\n```\n{r['response_text']}\n```")
    return "\n\n---\n\n".join(blocks)
