"""The partial response pool: the in-flight frontier, so a trajectory can be moved or recovered with its progress.

A trajectory with tool turns is kept whole: its tokens with their loss mask (a tool's output is context, mask 0)
and its tool state (`laminar.tools.turns.TurnState.as_dict()`: its turns so far, the call it waits for and that
call's result once known), so a recovery continues after its last completed turn."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from laminar.data.records import PromptGroup


@dataclass
class PartialTrajectory:
    """What a trajectory has produced so far, where it runs, and under which version (which never changes)."""

    traj_id: str
    group_id: int
    sample_idx: int
    group_size: int
    prompt_ids: list[int]
    version: int
    replica: int
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    restarts: int = 0
    loss_mask: list[int] = field(default_factory=list)  # per response token; [] = all sampled
    tool: dict[str, Any] | None = None  # its tool state at the last report (None: no tool turn yet)
    # the group's row, so a recovered trajectory is still scored against it (e.g. its answer)
    meta: dict[str, Any] = field(default_factory=dict)

    def group(self) -> PromptGroup:
        return PromptGroup(self.group_id, list(self.prompt_ids), self.group_size, dict(self.meta))


class PartialPool:
    """Keyed by traj_id. Rollouts stream progress in; the manager reads it back to move or recover work."""

    def __init__(self) -> None:
        self.entries: dict[str, PartialTrajectory] = {}
        self.finished = 0
        self.moved = 0
        self.restarted = 0

    def start(self, group: PromptGroup, replica: int, version: int) -> None:
        """Registers all n samples of a group on one replica at one version. Starting them again where they
        already are is nothing (a call retried after the pool's process was lost)."""
        for i in range(group.n):
            tid = group.traj_id(i)
            old = self.entries.get(tid)
            if old is not None and (old.replica, old.version) == (replica, version):
                continue
            if old is not None:
                raise KeyError(
                    f"partial pool: trajectory {tid} is already in flight on replica {self.entries[tid].replica}"
                )
            self.entries[tid] = self._entry(group, i, replica, version)

    @staticmethod
    def _entry(group: PromptGroup, idx: int, replica: int, version: int) -> PartialTrajectory:
        return PartialTrajectory(
            group.traj_id(idx),
            group.group_id,
            idx,
            group.n,
            list(group.prompt_ids),
            version,
            replica,
            meta=dict(group.meta),
        )

    def _get(self, traj_id: str) -> PartialTrajectory:
        try:
            return self.entries[traj_id]
        except KeyError:
            raise KeyError(f"partial pool: trajectory {traj_id} is not in flight") from None

    def append(
        self,
        traj_id: str,
        tokens: list[int],
        logprobs: list[float],
        mask: list[int] | None = None,
        tool: dict[str, Any] | None = None,
    ) -> None:
        """More tokens; `mask` is theirs (None: all sampled), `tool` the tool state they end in (None: as it was)."""
        if len(tokens) != len(logprobs) or (mask is not None and len(mask) != len(tokens)):
            raise ValueError(
                f"partial pool: {traj_id}: {len(tokens)} tokens but {len(logprobs)} log-probs"
                + (f" and a mask of {len(mask)}" if mask is not None else "")
            )
        e = self._get(traj_id)
        if (
            mask is not None or e.loss_mask
        ):  # kept per token once any mask came (tokens before it were sampled)
            e.loss_mask.extend([1] * (len(e.response_ids) - len(e.loss_mask)))
            e.loss_mask.extend(mask if mask is not None else [1] * len(tokens))
        e.response_ids.extend(tokens)
        e.logprobs.extend(logprobs)
        if tool is not None:
            e.tool = tool

    def progress(self, updates: dict[str, tuple], at: dict[str, int] | None = None) -> None:
        """One call per engine step (or a few) for a whole replica: per trajectory `(tokens, logprobs)`, or
        `(tokens, logprobs, mask, tool)` with tool turns. Unknown ids (already finished) are skipped. `at`: how
        many tokens each had reported before these, so a call made twice (retried after the pool's process was
        lost) adds its tokens once; an update past a gap is dropped (the pool keeps the prefix it has, which a
        recovery continues from)."""
        for tid, update in updates.items():
            e = self.entries.get(tid)
            if e is None:
                continue
            have = len(e.response_ids) - (at or {}).get(tid, len(e.response_ids))
            if have < 0 or have > len(update[0]):
                continue
            tokens, logprobs, *rest = update
            if rest and rest[0] is not None:
                rest[0] = list(rest[0])[have:]
            self.append(tid, list(tokens)[have:], list(logprobs)[have:], *rest)

    def finish(self, traj_id: str) -> PartialTrajectory | None:
        """The trajectory reached the experience buffer; drop it from the frontier."""
        e = self.entries.pop(traj_id, None)
        if e is not None:
            self.finished += 1
        return e

    def finish_many(self, traj_ids: list[str]) -> None:
        for tid in traj_ids:
            self.finish(tid)

    def move(self, traj_ids: list[str], replica: int) -> None:
        """Repack or recovery placed them on another replica (of the same version), their tokens kept. Ids
        that finished meanwhile are skipped."""
        for tid in traj_ids:
            e = self.entries.get(tid)
            if e is not None and e.replica != replica:
                e.replica = replica
                self.moved += 1

    def restart(self, group: PromptGroup, sample_idxs: list[int], replica: int, version: int) -> None:
        """These samples start over from their prompt on `replica` at `version` (recovery: their version is
        gone, their group restarts whole, or they never began): counted as restarts. A sample already restarted
        on `replica` at `version` stays as it is (a call made twice)."""
        for i in sample_idxs:
            old = self.entries.get(group.traj_id(i))
            if old is not None and old.restarts and (old.replica, old.version) == (replica, version):
                continue
            e = self.entries[group.traj_id(i)] = self._entry(group, i, replica, version)
            e.restarts = (old.restarts if old else 0) + 1
            self.restarted += 1

    def get(self, traj_id: str) -> PartialTrajectory:
        return copy.deepcopy(self._get(traj_id))

    def on_replica(self, replica: int) -> list[PartialTrajectory]:
        """Everything in flight on one replica, e.g. a dead one's work to recover."""
        return [copy.deepcopy(e) for e in self.entries.values() if e.replica == replica]

    def of_groups(self, group_ids: list[int]) -> list[PartialTrajectory]:
        """Every sample of these groups in flight, wherever it runs (recovery keeps a group on one version)."""
        wanted = set(group_ids)
        return [copy.deepcopy(e) for e in self.entries.values() if e.group_id in wanted]

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, traj_id: str) -> bool:
        return traj_id in self.entries

    def stats(self) -> dict[str, int]:
        return {
            "in_flight": len(self.entries),
            "tokens": sum(len(e.response_ids) for e in self.entries.values()),
            "finished": self.finished,
            "moved": self.moved,
            "restarted": self.restarted,
        }

    def snapshot(self) -> dict[str, Any]:
        return {
            "entries": [asdict(e) for e in self.entries.values()],
            "counters": {"finished": self.finished, "moved": self.moved, "restarted": self.restarted},
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.entries = {e["traj_id"]: PartialTrajectory(**copy.deepcopy(e)) for e in snap["entries"]}
        for k, v in snap["counters"].items():
            setattr(self, k, v)
