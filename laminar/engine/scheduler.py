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
        self.shared_prompt_tokens = 0

    def schedule(self) -> tuple[list[Sequence], bool]:
        batch, tokens, deferred, in_batch = [], 0, [], set()
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._waits_for_its_prompt(seq):
                deferred.append(self.waiting.popleft())  # a later step, it shares the computed prompt
                continue
            self._share_prompt(seq, in_batch)
            if batch and tokens + len(seq) - seq.num_cached > self.max_num_batched_tokens:
                break
            if not self.blocks.can_allocate(seq) and not self._free_parked(seq):
                break
            self.blocks.allocate(seq)
            self.running.append(self.waiting.popleft())
            batch.append(seq)
            in_batch.add(id(seq))
            tokens += len(seq) - seq.num_cached
        self.waiting.extendleft(reversed(deferred))
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

    def _waits_for_its_prompt(self, seq: Sequence) -> bool:
        """A group's later sample waits while the group's first is queued behind it (after a preemption); if the
        first is gone (finished, moved, preempted and not yet back), it prefills alone."""
        lead = seq.share_from
        return lead is not None and not seq.block_table and lead in self.waiting and not lead.block_table

    def _share_prompt(self, seq: Sequence, in_batch: set[int]) -> None:
        """Start `seq` from its group's first sample's full prompt blocks (at least one prompt token is left to
        prefill: its logits give the first sample). The first may be in this very prefill: every layer stores the
        step's keys and values before any query reads the cache, so `seq` reads the prompt its first computes in
        the same forward, and a group's prompt costs one step, not two. Blocks are shared only whole, so no one
        writes into a block another reads: the partly filled last block of the prompt is computed again."""
        lead, seq.share_from = seq.share_from, None
        if lead is None or seq.block_table or lead.parked or not lead.block_table:  # gone, or not running
            return
        n = (seq.num_prompt_tokens - 1) // self.blocks.block_size
        computed = len(lead) if id(lead) in in_batch else lead.num_cached  # in this step: all of it
        if n == 0 or len(lead.block_table) < n or computed < n * self.blocks.block_size:
            return
        if lead.token_ids[: n * self.blocks.block_size] != seq.token_ids[: n * self.blocks.block_size]:
            return
        self.blocks.share(seq, lead.block_table[:n])
        seq.num_cached = n * self.blocks.block_size
        self.shared_prompt_tokens += seq.num_cached

    def _free_parked(self, seq: Sequence) -> bool:
        """Take blocks back from parked requests, longest-parked first, then from waiting ones that hold moved
        keys and values (`Engine.import_request`), until `seq` fits; True if it does. Those re-prefill later."""
        for p in [*self.parked, *(w for w in self.waiting if w is not seq)]:
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
