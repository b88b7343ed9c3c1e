"""Recovering a dead replica's work (design section 6) from the partial response pool.

A trajectory continues on a live replica of its own version from the tokens the pool holds; tokens it made
after its last progress report are made again, identically, since its sampling stream depends only on its
seed and position. Only when no replica of its version is left does it start over from its prompt (counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.engine import ExportedRequest, SamplingParams
from laminar.rollout.replica import InFlight, sample_seed


@dataclass
class Recovery:
    recovered: list[tuple[int, list[tuple[ExportedRequest, InFlight]]]]  # (replica, items) to import
    restarted: list[tuple[int, list[tuple[ExportedRequest, InFlight]]]]


def restart_item(
    group: PromptGroup, sample_idx: int, sampling: dict[str, Any], run_seed: int, now: float
) -> tuple[ExportedRequest, InFlight]:
    """A trajectory starting over from its prompt (the importing replica stamps its own version on it)."""
    tid = group.traj_id(sample_idx)
    params = SamplingParams(seed=sample_seed(run_seed, tid), **{**sampling, **group.meta.get("sampling", {})})
    return ExportedRequest(tid, list(group.prompt_ids), [], [], [], params, -1), InFlight(
        group, sample_idx, -1, now
    )


def plan_recovery(
    entries: list[PartialTrajectory],
    groups: dict[int, PromptGroup],
    live: dict[int, int],
    sampling: dict[str, Any],
    run_seed: int,
    now: float,
) -> Recovery:
    """`live` maps replica -> version. Each trajectory goes to the least-loaded live replica of its version,
    or (restart) to the least-loaded live replica of any version with no tokens kept."""
    load = dict.fromkeys(live, 0)
    recovered: dict[int, list] = {}
    restarted: dict[int, list] = {}
    for e in sorted(entries, key=lambda e: e.traj_id):
        group = groups.get(e.group_id) or PromptGroup(
            e.group_id, list(e.prompt_ids), n=e.sample_idx + 1, meta={}
        )
        params = SamplingParams(
            seed=sample_seed(run_seed, e.traj_id), **{**sampling, **group.meta.get("sampling", {})}
        )
        same = [r for r, v in live.items() if v == e.version]
        if same:
            target = min(same, key=lambda r: (load[r], r))
            tokens, logprobs, version = list(e.response_ids), list(e.logprobs), e.version
            bucket = recovered
        elif live:
            target = min(live, key=lambda r: (load[r], r))
            tokens, logprobs, version = [], [], live[target]
            bucket = restarted
        else:
            continue  # nothing alive: the caller keeps them in the pool for the replacement
        load[target] += 1
        exported = ExportedRequest(
            e.traj_id, list(e.prompt_ids), tokens, logprobs, [version] * len(tokens), params, version
        )
        state = InFlight(
            group, e.sample_idx, version, now, list(tokens), list(logprobs), reported=len(tokens)
        )
        bucket.setdefault(target, []).append((exported, state))
    return Recovery(sorted(recovered.items()), sorted(restarted.items()))
