"""What a replica keeps of each request it decodes, and the sampling seed every replica derives alike: plain
records, importable by the control plane without torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from laminar.data.records import PromptGroup

if TYPE_CHECKING:
    from laminar.tools.turns import TurnState


def sample_seed(run_seed: int, traj_id: str) -> int:
    """A trajectory's sampling stream depends on the run and its id only, wherever it is decoded."""
    digest = hashlib.blake2b(f"{run_seed}/{traj_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


@dataclass
class InFlight:
    group: PromptGroup
    sample_idx: int
    version: int
    t_start: float
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reported: int = 0  # tokens already sent to the partial response pool
    tool: TurnState | None = None  # its tool state while it moves between replicas (export to import)
