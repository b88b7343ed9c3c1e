"""Keeping the relay chain whole: a dead relay replaced on its machine (or, if the machine is gone, the chain
rebuilt without it; a dead master moved to a live machine), the chain relinked in its new order, and a relink
that timed out tried again."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from laminar.relay.chain import build_chain

log = logging.getLogger(__name__)
RELINK_TRIES = 3  # a relink that timed out is tried again this many times in all, a watch period apart


class MachineLost(RuntimeError):
    """A relay could not start on a machine: it is gone, or going."""


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


class RelayRepair:
    """`Supervisor`'s care of the relays (its fleet, factory and watch)."""

    async def _new_relay(self, node: str, master: bool = False) -> Any:
        """A relay started on `node` and placed in the chain, first if it is the master, else last; the caller
        relinks."""
        fleet = self.fleet
        self.change("relay_made", n=self.relays_made + 1)
        name = f"relay-{'master' if master else node[:6]}-r{self.relays_made}"  # unique within the run
        relay = self.factory.relay(node, name)
        fleet.relay_names[relay._actor_id] = name
        try:  # a machine that is going away (not yet known dead) never starts it: do not wait on it forever
            await asyncio.wait_for(self.factory.ready(relay), self.watch.dead_after_s * 2)
        except (TimeoutError, ray.exceptions.RayError) as e:
            ray.kill(relay)
            raise MachineLost(f"no relay could start on machine {node}: {e!r}") from e
        if master:
            fleet.relays.insert(0, relay)
        else:
            fleet.relay_of_node[node] = relay
            fleet.relays.append(relay)
        fleet.chain_changed()
        return relay

    async def _replace_relay(self, dead: Any, replace: bool = True) -> None:
        """Relink the chain without it at once, then start a new one on its node if that machine is alive (a
        node relay's replicas re-point to it; a new master is picked up by the trainer after its next step,
        `Runtime.train`). A relay whose machine is gone is not replaced there: that machine's replicas are
        dead too, and their replacements bring up a relay wherever they land. Without `replace` (the run is
        ending) it is only dropped from the chain, logged and counted."""
        fleet = self.fleet
        ray.kill(dead)  # a hung one too
        was_master = bool(fleet.relays) and fleet.relays[0]._actor_id == dead._actor_id
        fleet.relays = [r for r in fleet.relays if r._actor_id != dead._actor_id]
        node = fleet.master_node if was_master else None
        if not was_master:
            node = next((n for n, r in fleet.relay_of_node.items() if r._actor_id == dead._actor_id), None)
            if node is not None:
                del fleet.relay_of_node[node]
        fleet.chain_changed()
        await self._relay_lost(node, was_master, replace)

    async def _relay_lost(self, node: str | None, was_master: bool, replace: bool = True) -> None:
        """A relay gone from the chain (already relinked out of `fleet`): counted, and, where its machine is
        alive, replaced. Its `failure` record is written once the outcome is known (`replaced`, and the `error`
        that kept it from being replaced), so the log never says `replaced: false` of a relay that was; its time
        is when the loss was found."""
        fleet = self.fleet
        fleet.count("relays")
        found, outcome = time.time(), {"replaced": False}
        try:
            if replace:
                await self._replace_lost_relay(node, was_master, outcome)
        except Exception as e:
            outcome["error"] = repr(e)
            raise
        finally:  # timed when it was found, not when the replacement was done
            fleet.event("failure", t=found, what="relay", node=node, **outcome)

    async def _replace_lost_relay(self, node: str | None, was_master: bool, outcome: dict[str, Any]) -> None:
        fleet = self.fleet
        alive = node is not None and node in await asyncio.get_running_loop().run_in_executor(
            None, alive_nodes
        )
        if fleet.relays:  # the rest of the chain keeps flowing while the replacement starts
            try:
                await self._relink_retried()
            except ray.exceptions.ActorDiedError:  # another relay died too: the watch replaces it next
                pass
        if not alive:
            return
        try:
            relay = await self._new_relay(node, master=was_master)
        except MachineLost as e:  # the machine went with its relay; its replicas' replacements go elsewhere
            outcome["error"] = str(e)
            return
        outcome["replaced"] = True
        if not was_master:  # a master is picked up by the trainer after its next step
            await asyncio.gather(
                *[
                    fleet.handles[rid].set_relay.remote(relay)
                    for rid, n in fleet.node_of_replica.items()
                    if n == node and fleet.handles.get(rid) is not None
                ]
            )
        try:
            await self._relink_retried()
        except ray.exceptions.ActorDiedError as e:  # another relay died meanwhile: the watch replaces it next
            outcome["relink_error"] = repr(e)

    async def _relink_retried(self) -> None:
        """`relink`, tried `RELINK_TRIES` times a watch period apart: a relink that timed out under load is not
        the chain's loss. A relay that died meanwhile still fails it: the watch finds that one and replaces it."""
        for attempt in range(1, RELINK_TRIES + 1):
            try:
                await self.relink()
                return
            except ray.exceptions.ActorDiedError:
                raise
            except (TimeoutError, ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as e:
                if attempt == RELINK_TRIES:
                    raise
                log.warning("relinking the relay chain (try %d of %d): %r", attempt, RELINK_TRIES, e)
                await asyncio.sleep(self.watch.heartbeat_s)

    async def relink(self) -> None:
        relays, timeout = list(self.fleet.relays), self.watch.timeout_s
        await asyncio.get_running_loop().run_in_executor(None, lambda: build_chain(relays, timeout=timeout))

    async def move_master(self, node: str) -> list[Any]:
        """The trainer came back on another machine: a new master relay there heads the chain (the old one,
        alive or not, is dropped). Returns the new chain."""
        fleet = self.fleet
        head = fleet.relays[0] if fleet.relays else None
        node_relays = {r._actor_id for r in fleet.relay_of_node.values()}
        if (
            fleet.master_node == node
            and head is not None
            and head._actor_id not in node_relays
            and await self._answers(head.ping.remote())
        ):  # asked again (the driver's call retried after the manager's loss): it is there already
            return list(fleet.relays)
        if head is not None and head._actor_id not in node_relays:
            ray.kill(fleet.relays.pop(0))
        fleet.master_node = node
        fleet.chain_changed()
        await self._new_relay(node, master=True)
        await self._relink_retried()
        return list(fleet.relays)
