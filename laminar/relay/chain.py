"""Placing relays on nodes and linking them into the chain the manager orders.

The chain is a list of relay handles, master first. Linking is idempotent: a relay whose downstream is
unchanged keeps its connection; one whose downstream changed offers its newest version to the new one.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from laminar.relay.relay import RelayActor, RelaySettings


def relay_on_node(
    node_id: str, name: str, settings: RelaySettings, namespace: str | None = None, **relay_kwargs: Any
) -> Any:
    """Start one relay actor pinned to a Ray node (hard affinity: it must share /dev/shm with its readers).
    Its secret travels here, as an actor argument over Ray, never over the relay link. With `namespace` (a run's)
    it is named `name` there and outlives the process that made it (the run's factory: the manager, which may be
    restarted)."""
    named = {"name": name, "namespace": namespace, "lifetime": "detached"} if namespace else {"name": None}
    return RelayActor.options(
        **named,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(name, **settings.kwargs(), **relay_kwargs)


def build_chain(relays: list[Any], *, timeout: float = 30.0) -> list[tuple[str, int]]:
    """Link relays[i] -> relays[i+1]; the last gets no downstream. Returns their addresses. Each relay learns
    its upstream's name first, so it accepts that relay, and only that one, before it connects."""
    pings = ray.get([r.ping.remote() for r in relays], timeout=timeout)
    names = [p["name"] for p in pings]
    if len(set(names)) != len(names):
        raise ValueError(f"relay names must be unique within a chain, got {names}")
    addrs = [tuple(p["address"]) for p in pings]
    ray.get([r.set_upstream.remote(up) for r, up in zip(relays, [None, *names[:-1]])], timeout=timeout)
    ray.get([r.set_downstream.remote(d) for r, d in zip(relays, [*addrs[1:], None])], timeout=timeout)
    return addrs
