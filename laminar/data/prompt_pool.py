"""The prompt pool: a cursor over the dataset that hands out prompt groups and is part of a checkpoint."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from laminar.data.dataset import validate_rows
from laminar.data.records import PromptGroup


class PromptPool:
    """Hands out groups in a seeded shuffled order, epoch after epoch. Group ids are unique and increasing,
    so a group id names one draw of one row. A group handed out stays `outstanding` until `done`; groups given
    back (their replica died before it started them) are re-issued first with the same id, so the experience
    buffer can still detect duplicates."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        encode: Callable[[str], list[int]],
        n: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if not rows:
            raise ValueError("prompt pool: the dataset has no rows")
        if n < 1:
            raise ValueError(f"prompt pool: n={n}: a group needs at least one sample")
        self.rows = validate_rows(rows)
        self.encode = encode
        self.n = n
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0
        self.next_group_id = 0
        self.order = self._order(0)
        self.returned: deque[PromptGroup] = deque()
        self.outstanding: dict[int, PromptGroup] = {}

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _fresh(self) -> PromptGroup:
        if self.cursor == len(self.order):
            self.epoch += 1
            self.cursor = 0
            self.order = self._order(self.epoch)
        idx = self.order[self.cursor]
        self.cursor += 1
        row = self.rows[idx]
        try:
            prompt_ids = self.encode(row["prompt"])
        except Exception as e:
            raise ValueError(
                f"prompt pool row {idx}: cannot encode field 'prompt' ({type(e).__name__}: {e})"
            ) from e
        meta = {**row, "row": idx, "epoch": self.epoch}
        group = PromptGroup(group_id=self.next_group_id, prompt_ids=prompt_ids, n=self.n, meta=meta)
        self.next_group_id += 1
        return group

    def next_groups(self, count: int) -> list[PromptGroup]:
        """Re-issued groups first (oldest first), then fresh ones from the cursor."""
        out = []
        for _ in range(count):
            group = self.returned.popleft() if self.returned else self._fresh()
            self.outstanding[group.group_id] = group
            out.append(group)
        return out

    def give_back(self, groups: list[PromptGroup]) -> None:
        """Queue groups to be handed out again (same id); unknown or finished groups are an error."""
        for g in groups:
            if g.group_id not in self.outstanding:
                raise KeyError(
                    f"prompt pool: group {g.group_id} is not outstanding (never issued, or already done)"
                )
            del self.outstanding[g.group_id]
            self.returned.append(g)

    def done(self, group_id: int) -> None:
        """The group's trajectories reached the experience buffer; it is no longer the pool's concern."""
        self.outstanding.pop(group_id, None)

    def reissue_outstanding(self) -> int:
        """After a restore without an in-flight frontier: every outstanding group goes back in the queue."""
        groups = sorted(self.outstanding.values(), key=lambda g: g.group_id)
        self.give_back(groups)
        return len(groups)

    def queued_group_ids(self) -> list[int]:
        """Groups issued before and waiting to be handed out again (not anybody's work right now)."""
        return [g.group_id for g in self.returned]

    def stats(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "issued": self.next_group_id,
            "outstanding": len(self.outstanding),
            "returned": len(self.returned),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "next_group_id": self.next_group_id,
            "seed": self.seed,
            "num_rows": len(self.rows),
            "returned": [asdict(g) for g in self.returned],
            "outstanding": [asdict(g) for g in self.outstanding.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_rows"] != len(self.rows):
            raise ValueError(
                f"prompt pool: checkpoint was taken over {state['num_rows']} rows, this dataset has {len(self.rows)}"
            )
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.cursor = state["cursor"]
        self.next_group_id = state["next_group_id"]
        self.order = self._order(self.epoch)
        self.returned = deque(PromptGroup(**g) for g in state["returned"])
        self.outstanding = {g["group_id"]: PromptGroup(**g) for g in state["outstanding"]}
