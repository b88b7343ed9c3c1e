"""What the manager's three parts share inside its actor: who runs, what each replica owes, the relay chain, and
the run's event log. The dispatcher (`laminar.manager.dispatcher`) hands out work, the supervisor
(`laminar.manager.supervisor`) keeps the fleet alive, the repack loop (`laminar.manager.repacker`) moves tails;
they run on one event loop, so none of this needs a lock except around moves (`placing`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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


def _unjournaled(record: dict[str, Any]) -> None:
    """A manager without a journal (an in-process one in the unit tests)."""


KEYS_KEPT = 4096  # keys of recent events made by calls that may come twice (a retry after the manager's loss)


@dataclass
class Fleet:
    """Every change to what lasts is applied by `apply` and written to the manager's journal (`journal`), so the
    manager's restarted self replays the same records into the same state (`laminar.manager.manager`). Actor
    handles are not written: replicas and relays are found again by name (the run's factory names them)."""

    t0: float
    handles: dict[int, Any] = field(default_factory=dict)  # live replicas by id
    owed: dict[int, dict[int, PromptGroup]] = field(
        default_factory=dict
    )  # replica -> groups not yet complete
    # group -> the version its samples are generated with (the dispatch staleness bound reads the oldest)
    owed_version: dict[int, int] = field(default_factory=dict)
    relays: list[Any] = field(default_factory=list)  # the chain, master first
    relay_of_node: dict[str, Any] = field(default_factory=dict)
    node_of_replica: dict[int, str] = field(default_factory=dict)
    master_node: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)  # not yet in the driver's log
    events_from: int = 0  # the number of `events[0]`: the driver acknowledges events by number
    failures: dict[str, int] = field(default_factory=failure_counts)
    replacing: set[int] = field(default_factory=set)  # dead replicas whose replacement has not started
    relay_names: dict[Any, str] = field(default_factory=dict)  # a relay's actor id -> its name
    # the chain as last written, by name: how a restarted manager finds its relays again
    chain_names: list[str] = field(default_factory=list)
    node_names: dict[str, str] = field(default_factory=dict)
    keys: dict[str, None] = field(default_factory=dict)  # recent events' keys, oldest first
    # A repack round's moves and a recovery never interleave; stopping waits for either to finish.
    placing: asyncio.Lock = field(default_factory=asyncio.Lock)
    journal: Callable[[dict[str, Any]], None] = _unjournaled

    def change(self, op: str, **fields: Any) -> Any:
        record = {"op": op, **fields}
        out = self.apply(record)
        self.journal({"part": "fleet", **record})
        return out

    def apply(self, r: dict[str, Any]) -> Any:
        """One change, as the live manager makes it and as its restarted self replays it."""
        op = r["op"]
        if op == "event":
            self.events.append(r["record"])
            if r.get("key") is not None:
                self.keys[r["key"]] = None
                while len(self.keys) > KEYS_KEPT:
                    del self.keys[next(iter(self.keys))]
        elif op == "ack":
            drop = max(0, min(r["upto"] - self.events_from, len(self.events)))
            del self.events[:drop]
            self.events_from += drop
        elif op == "owe":
            group = PromptGroup(**r["group"])
            self.owed.setdefault(r["replica"], {})[group.group_id] = group
            if r.get("version") is not None:
                self.owed_version[group.group_id] = r["version"]
        elif op == "settle":
            for groups in self.owed.values():
                groups.pop(r["group"], None)
            self.owed_version.pop(r["group"], None)
        elif op == "forget":
            for gid in self.owed.pop(r["replica"], {}):
                if not any(gid in groups for groups in self.owed.values()):
                    self.owed_version.pop(gid, None)
        elif op == "reserve":
            self.node_of_replica[r["rid"]] = ""
        elif op == "replica":  # up (its handle: the caller's, or found by name after a restart)
            self.node_of_replica[r["rid"]] = r["node"]
            self.handles[r["rid"]] = r.get("handle")
            self.replacing.discard(r["replacing"])
        elif op == "drop":
            self.handles.pop(r["rid"], None)
            if r["replace"]:
                self.replacing.add(r["rid"])
        elif op == "chain":
            self.master_node = r["master_node"]
            self.chain_names, self.node_names = list(r["relays"]), dict(r["nodes"])
        elif op == "count":
            self.failures[r["what"]] += r["n"]
        else:
            raise ValueError(f"manager journal: unknown fleet record {op!r}")
        return None

    def state(self) -> dict[str, Any]:
        """What lasts, as JSON data (a journal snapshot)."""
        return {
            "replicas": {str(rid): self.node_of_replica.get(rid, "") for rid in self.handles},
            "node_of_replica": {str(k): v for k, v in self.node_of_replica.items()},
            "owed": [[rid, [asdict(g) for g in groups.values()]] for rid, groups in self.owed.items()],
            "owed_version": [[gid, v] for gid, v in self.owed_version.items()],
            "chain": {"relays": self.chain_names, "nodes": self.node_names, "master_node": self.master_node},
            "events": self.events,
            "events_from": self.events_from,
            "failures": self.failures,
            "replacing": sorted(self.replacing),
            "keys": list(self.keys),
        }

    def load(self, s: dict[str, Any]) -> None:
        self.node_of_replica = {int(k): v for k, v in s["node_of_replica"].items()}
        self.handles = {int(rid): None for rid in s["replicas"]}
        self.owed = {rid: {g["group_id"]: PromptGroup(**g) for g in gs} for rid, gs in s["owed"]}
        self.owed_version = {gid: v for gid, v in s.get("owed_version", [])}
        self.apply({"op": "chain", **s["chain"]})
        self.events, self.events_from = list(s["events"]), s["events_from"]
        self.failures = {**failure_counts(), **s["failures"]}
        self.replacing = set(s["replacing"])
        self.keys = dict.fromkeys(s["keys"])

    # ---- the changes -------------------------------------------------------------------------------------
    def event(
        self, kind: str, *, key: str | None = None, t: float | None = None, **fields: Any
    ) -> dict | None:
        """Append to the event log (taken into metrics.jsonl by the driver); returns it. `t`: when it happened
        (now); `key`: an event a call made twice would log twice is logged once (None: this one already was)."""
        if key is not None and key in self.keys:
            return None
        record = {"kind": kind, "t": (time.time() if t is None else t) - self.t0, **fields}
        self.change("event", record=record, key=key)
        return record

    def take_events(self, acked: int) -> tuple[int, list[dict[str, Any]]]:
        """The events from number `acked` on (those before it are in the driver's log and go): the driver passes
        how many it holds, so an answer that never reached it is given again. Returns the first one's number."""
        if acked > self.events_from:
            self.change("ack", upto=acked)
        return self.events_from, list(self.events)

    def owe(self, replica: int, group: PromptGroup, version: int | None = None) -> None:
        """`replica` has samples of `group` to finish: if it dies, recovery rebuilds them from this row.
        `version`: the one they are generated with (None: as before; a repack moves them to its own version)."""
        self.change("owe", replica=replica, group=asdict(group), version=version)

    def oldest_owed(self) -> int | None:
        """The oldest version a group still being generated holds; None when none is."""
        return min(self.owed_version.values(), default=None)

    def settle(self, group_id: int) -> None:
        """The group is complete in the buffer: no replica owes it any more (repack may have spread it)."""
        if any(group_id in groups for groups in self.owed.values()):
            self.change("settle", group=group_id)

    def forget(self, replica: int) -> None:
        """A dead replica's work has been placed elsewhere."""
        if replica in self.owed:
            self.change("forget", replica=replica)

    def reserve(self, rid: int) -> None:
        """The id of a replica being made: never given to another."""
        self.change("reserve", rid=rid)

    def add_replica(self, rid: int, handle: Any, node: str, replacing: int | None = None) -> None:
        self.change("replica", rid=rid, node=node, replacing=replacing)
        self.handles[rid] = handle

    def drop_replica(self, rid: int, replace: bool) -> Any:
        """Out of the fleet (dead); with `replace`, owed a replacement. Returns its handle, if it had one."""
        handle = self.handles.get(rid)
        self.change("drop", rid=rid, replace=replace)
        return handle

    def count(self, what: str, n: int = 1) -> None:
        if n:
            self.change("count", what=what, n=n)

    def chain_record(self) -> dict[str, Any]:
        name = self.relay_names.get
        return {
            "relays": [name(r._actor_id, "") for r in self.relays],
            "nodes": {node: name(r._actor_id, "") for node, r in self.relay_of_node.items()},
            "master_node": self.master_node,
        }

    def chain_changed(self) -> None:
        """The relay chain, each machine's relay or the master's machine changed: written by the relays' names."""
        self.change("chain", **self.chain_record())
