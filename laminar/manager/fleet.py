"""What the manager's three parts share inside its actor: who runs, what each replica owes, the relay chain, and
the run's event log. The dispatcher (`laminar.manager.dispatcher`) hands out work, the supervisor
(`laminar.manager.supervisor`) keeps the fleet alive, the repack loop (`laminar.manager.repacker`) moves tails;
they run on one event loop, so none of this needs a lock except around moves (`placing`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from laminar.data.records import PromptGroup


def failure_counts() -> dict[str, int]:
    return {
        "rollouts": 0,
        "relays": 0,
        "trainer": 0,
        "recovered_trajectories": 0,
        "restarted_trajectories": 0,
        "restarted_groups": 0,
        "tool_reruns": 0,  # tool calls run again because their result was lost with their replica
    }


@dataclass
class Fleet:
    t0: float
    handles: dict[int, Any] = field(default_factory=dict)  # live replicas by id
    owed: dict[int, dict[int, PromptGroup]] = field(
        default_factory=dict
    )  # replica -> groups not yet complete
    relays: list[Any] = field(default_factory=list)  # the chain, master first
    relay_of_node: dict[str, Any] = field(default_factory=dict)
    node_of_replica: dict[int, str] = field(default_factory=dict)
    master_node: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=failure_counts)
    # A repack round's moves and a recovery never interleave; stopping waits for either to finish.
    placing: asyncio.Lock = field(default_factory=asyncio.Lock)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append to the event log (drained into metrics.jsonl by the driver); returns it for later fields."""
        record = {"kind": kind, "t": time.time() - self.t0, **fields}
        self.events.append(record)
        return record

    def owe(self, replica: int, group: PromptGroup) -> None:
        """`replica` has samples of `group` to finish: if it dies, recovery rebuilds them from this row."""
        self.owed.setdefault(replica, {})[group.group_id] = group

    def settle(self, group_id: int) -> None:
        """The group is complete in the buffer: no replica owes it any more (repack may have spread it)."""
        for groups in self.owed.values():
            groups.pop(group_id, None)
