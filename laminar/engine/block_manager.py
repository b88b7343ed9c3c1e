"""Paged KV blocks: a free list of fixed-size blocks and each sequence's table of the blocks it holds."""

from __future__ import annotations

from collections import deque

from laminar.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.peak_used = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_for(len(seq)) - len(seq.block_table) <= len(self.free)

    def allocate(self, seq: Sequence) -> None:
        """Blocks for every token of `seq` (prefill), or for one more token (decode)."""
        need = self.blocks_for(len(seq)) - len(seq.block_table)
        if need > len(self.free):
            raise RuntimeError(f"{seq.request_id}: needs {need} KV blocks, {len(self.free)} free")
        seq.block_table.extend(self.free.popleft() for _ in range(need))
        self.peak_used = max(self.peak_used, self.num_used)

    def release(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []
        seq.num_cached = 0

    def reset_peak(self) -> None:
        self.peak_used = self.num_used
