"""Who runs this step: admit waiting requests (prefill) while slots and blocks allow, else decode the running set.

Like nano-vllm, a step is all prefill or all decode. When a decode step runs out of blocks, the newest running
request is preempted: its blocks are freed and it goes back to the front of the queue to be recomputed later,
with its tokens, log-probs and sampling stream intact. Parked requests (waiting for a tool) keep their blocks
until blocks run short: then the longest-parked gives its blocks up first, before any running request (it will
re-prefill its whole context when it resumes).
"""

from __future__ import annotations

from collections import deque

from laminar.engine.block_manager import BlockManager
from laminar.engine.sequence import Sequence


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: list[Sequence] = []  # oldest first
        self.num_preemptions = 0

    def schedule(self) -> tuple[list[Sequence], bool]:
        batch, tokens = [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if batch and tokens + len(seq) > self.max_num_batched_tokens:
                break
            if not self.blocks.can_allocate(seq) and not self._free_parked(seq):
                break
            self.blocks.allocate(seq)
            self.running.append(self.waiting.popleft())
            batch.append(seq)
            tokens += len(seq)
        if batch:
            return batch, True

        scheduled: list[Sequence] = []
        queue = deque(self.running)
        while queue:
            seq = queue.popleft()
            while not self.blocks.can_allocate(seq) and not self._free_parked(seq):
                victim = queue.pop() if queue else seq
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                self.blocks.allocate(seq)
                scheduled.append(seq)
        self.running = scheduled
        return list(scheduled), False  # a copy: finishing requests leave self.running mid-step

    def preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _free_parked(self, seq: Sequence) -> bool:
        """Take blocks back from parked requests, longest-parked first, until `seq` fits; True if it does."""
        for p in self.parked:
            if self.blocks.can_allocate(seq):
                break
            if p.block_table:
                self.blocks.release(p)
                self.num_preemptions += 1
        return self.blocks.can_allocate(seq)

    def park(self, seq: Sequence) -> None:
        """Out of the batch, its blocks kept (its cached prefix serves the resume)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        seq.parked = True
        self.parked.append(seq)

    def unpark(self, seq: Sequence) -> None:
        """Back in the queue: its next prefill covers what it has not cached (what was appended, at least)."""
        self.parked.remove(seq)
        seq.parked = False
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished, aborted or exported request and free its blocks."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.parked:
            self.parked.remove(seq)
        else:
            self.running.remove(seq)
        self.blocks.release(seq)
