"""Small typed records that cross process boundaries on the control plane (never weights)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def traj_id(group_id: int, sample_idx: int) -> str:
    """A trajectory's id, the same in every record of the run: "GROUP:SAMPLE"."""
    return f"{group_id}:{sample_idx}"


def group_of(traj_id: str) -> int:
    """The group a trajectory id belongs to (`traj_id`'s inverse, first half)."""
    return int(traj_id.split(":", 1)[0])


@dataclass
class PromptGroup:
    """One prompt and the number of samples GRPO compares for it; dispatched whole to one replica."""

    group_id: int
    prompt_ids: list[int]
    n: int
    meta: dict[str, Any] = field(default_factory=dict)

    def traj_id(self, sample_idx: int) -> str:
        return traj_id(self.group_id, sample_idx)


@dataclass
class Trajectory:
    """A finished, scored response with the policy version that generated it and its behaviour log-probs."""

    traj_id: str
    group_id: int
    sample_idx: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    version: int
    reward: float = 0.0
    finish_reason: str = "length"
    replica: int = -1
    t_start: float = 0.0
    t_end: float = 0.0
    # One entry per response token when a schedule resumes a trajectory on newer weights (partial rollout);
    # empty when the whole trajectory came from `version`.
    token_versions: list[int] = field(default_factory=list)
    reprefill_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def versions(self) -> set[int]:
        return set(self.token_versions) if self.token_versions else {self.version}
