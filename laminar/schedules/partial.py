"""Partial rollout (AReaL / Kimi-style): like stream (the same dispatch bound k and the same in-order
consumption), but every update interrupts in-flight trajectories, which resume on the new weights after
re-prefilling their KV cache; one trajectory then mixes versions, and the re-prefilled tokens are the price
(counted per trajectory). The interruption lives in the replica (`interrupt_on_update`), set for this schedule."""

from laminar.schedules.stream import dispatch, run

__all__ = ["dispatch", "run"]
