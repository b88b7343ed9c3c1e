"""Paged KV blocks: a free list of fixed-size blocks, each sequence's table of the blocks it holds, and a
reference count per block, since the samples of a group share their prompt's full blocks (`share`)."""

from __future__ import annotations

from collections import deque

from laminar.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.peak_used = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_for(len(seq)) - len(seq.block_table) <= len(self.free)

    def allocate(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Blocks for every token of `seq` (prefill), or for one more token (decode); `num_tokens`: for that
        many (a decode step queued before the token it reads is appended)."""
        need = self.blocks_for(len(seq) if num_tokens is None else num_tokens) - len(seq.block_table)
        if need > len(self.free):
            raise RuntimeError(f"{seq.request_id}: needs {need} KV blocks, {len(self.free)} free")
        for _ in range(need):
            block = self.free.popleft()
            self.refs[block] = 1
            seq.block_table.append(block)
        self.peak_used = max(self.peak_used, self.num_used)

    def share(self, seq: Sequence, blocks: list[int]) -> None:
        """`seq` (holding no blocks) starts with `blocks`, full blocks another sequence has computed."""
        assert not seq.block_table, "a sequence shares blocks only before it holds any"
        for block in blocks:
            self.refs[block] += 1
        seq.block_table = list(blocks)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (a verify step's rejected draft tokens). The
        table becomes a new list: a list is only ever appended to, which the decode staging relies on."""
        keep = self.blocks_for(num_tokens)
        if keep >= len(seq.block_table):
            return
        for block in seq.block_table[keep:]:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        seq.block_table = seq.block_table[:keep]

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; a block no sequence holds goes back to the free list."""
        for block in seq.block_table:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        seq.block_table = []
        seq.num_cached = 0

    def reset_peak(self) -> None:
        self.peak_used = self.num_used
