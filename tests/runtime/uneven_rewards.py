"""A reward that makes half of the prompts uninformative, for the dynamic-sampling test: a prompt whose first
digit is odd scores 0 on every sample (its group has no GRPO signal); the others score the reverse task's
partial credit plus a little per response token, so their samples almost always differ."""

from __future__ import annotations

from typing import Any

from laminar.rewards.reverse import reverse_reward


def odd_first_digit_scores_zero(response: str, row: dict[str, Any]) -> float:
    if int(row["prompt"].split()[0]) % 2:
        return 0.0
    return reverse_reward(response, row) + 0.01 * len(response.split())
