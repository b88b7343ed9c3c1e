"""Grouped speculative decoding in the engine's loop: drafts proposed from the text of a request's group
(`drafter.py`), verified in one decode step that draws at every drafted position what a plain step would, and
kept up to the first disagreement, so the tokens and their log-probs are exactly a plain decode's."""

from __future__ import annotations

import time

from laminar.engine.drafter import next_draft_len
from laminar.engine.gate import expected_tokens
from laminar.engine.sampler import SamplingBatch, accepted_prefix
from laminar.engine.sequence import Sequence, StepOutput

VERIFYING = ("verify", "explore_verify")  # the choices (`_choose`) under which a step verifies drafts


class Speculating:
    """`Engine`'s speculation (`speculation`, its drafter's groups, `gate`, block manager, model runner and
    counters)."""

    def _choose(self, seqs: list[Sequence]) -> str | None:
        """How a decode step of `seqs` goes: under `on` "verify"; under `auto` the gate's choice ("verify",
        "plain", "explore_verify", "explore_plain"), or None where no request may draft (a running batch over
        `max_batch`, no group accepting at least `min_acceptance`); under off None. A step that verifies runs
        step by step, never queued ahead: a draft continues the tokens the step before sampled."""
        spec = self.speculation
        if spec.mode == "off" or not seqs:
            return None
        if spec.mode == "on":
            return "verify"
        if len(seqs) > spec.max_batch:
            return None
        low = spec.min_acceptance
        drafting = [s for s in seqs if s.group is not None and s.group.acceptance >= low]
        if not drafting:
            return None
        tokens = sum(expected_tokens(s.group.acceptance, s.draft_len) for s in drafting)
        return self.gate.choose(len(seqs), (tokens + len(seqs) - len(drafting)) / len(seqs))

    def _commit(self, batch: int, choice: str | None, verified: bool) -> None:
        """A decode step of `batch` requests runs, verifying drafts or not: the gate's bookkeeping (auto)."""
        if choice is not None and self.speculation.mode == "auto":
            self.gate.commit(batch, choice, verified)

    def _ended(self, out: StepOutput, path: str | None = None, batch: int = 0) -> StepOutput:
        """`out`, after the gate times the step that made it (a decode step on `path` of `batch` requests)."""
        if self.gate is not None:
            self.gate.ended(batch, path, sum(len(t) for t in out.new_tokens.values()))
        return out

    def _guessing(self, seqs: list[Sequence]) -> bool:
        spec = self.speculation
        return spec.mode == "auto" and len(seqs) <= spec.max_batch

    def _drafts(self, seqs: list[Sequence]) -> list[list[int]] | None:
        """Each scheduled request's draft tokens ([] for none), or None when the step does not verify (its
        choice, or no request found a draft). A draft stops one token short of the request's length limit, and
        within its share of the step's rows (`VERIFY_ROWS`) and of the free blocks (never preempting anyone for
        a draft)."""
        choice = self._choose(seqs)
        if choice not in VERIFYING:
            self._commit(len(seqs), choice, False)
            return None
        spec, t = self.speculation, time.perf_counter()
        share = min(spec.max_draft, (self.runner.max_rows - len(seqs)) // len(seqs))
        low = spec.min_acceptance if spec.mode == "auto" else 0.0
        free, bs = len(self.blocks.free), self.blocks.block_size
        caught: set[int] = set()
        drafts, any_draft = [], False
        for s in seqs:
            g, k, n = s.group, min(s.draft_len, share, s.limit - len(s) - 1), len(s)
            if g is None or k < 1 or g.acceptance < low:
                drafts.append([])
                continue
            if id(g) not in caught:
                g.catch_up()
                caught.add(id(g))
            d = g.propose(s.stream, k)[: (len(s.block_table) + free) * bs - n]
            free -= max(0, self.blocks.blocks_for(n + len(d)) - len(s.block_table))
            drafts.append(d)
            any_draft |= bool(d)
        self.draft_s += time.perf_counter() - t
        self._commit(len(seqs), choice, any_draft)
        return drafts if any_draft else None

    def _guess(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """auto: a request whose group's drafts fell below `min_acceptance` drafts nothing, but the drafter still
        guesses its next token (one lookup). Whether the token sampled is the guess keeps the group's rate
        current, so a group whose text comes to agree drafts again. Before any token of the step is appended:
        a guess sees what a draft before the step would have seen."""
        t, low, caught = time.perf_counter(), self.speculation.min_acceptance, set()
        for s, tok in zip(seqs, tokens):
            g = s.group
            if g is None or g.acceptance >= low:
                continue
            if id(g) not in caught:
                g.catch_up()
                caught.add(id(g))
            guess = g.propose(s.stream, 1)
            if guess:
                g.record(int(guess[0] == tok), 1)
        self.draft_s += time.perf_counter() - t

    def _verify(self, seqs: list[Sequence], drafts: list[list[int]]) -> StepOutput:
        """One decode step that also checks drafts: a request with draft d_1..d_m takes m + 1 rows, row i reading
        its tokens plus d_1..d_i (its key and value written at its position), and each row draws the token a
        plain decode step would draw there. The draft is accepted up to the first token the draws disagree with
        (`accepted_prefix`); the request gets the accepted tokens and the draw after them, each with the
        log-prob a plain step records, up to any token that ends or parks it. Rejected tokens' keys and values
        lie past what the request counts as cached, and the blocks past its new length go back."""
        rows, lens, ids, starts = [], [], [], []
        for s, d in zip(seqs, drafts):
            n = len(s)
            if d:
                self.blocks.allocate(s, n + len(d))
            starts.append(len(rows))
            rows += [s] * (len(d) + 1)
            lens += range(n, n + len(d) + 1)
            ids += [s.token_ids[-1], *d]
        sb = SamplingBatch.of([s.params for s in rows], [self._keys[s.request_id] for s in rows], lens)
        tokens, logprobs = self.runner.collect(self.runner.launch_decode(rows, lens, sb, ids=ids))
        if self._guessing(seqs):
            plain = [i for i, d in enumerate(drafts) if not d]
            self._guess([seqs[i] for i in plain], [tokens[starts[i]] for i in plain])
        out = StepOutput(is_prefill=False, num_tokens=len(rows))
        version, max_draft = self.version, self.speculation.max_draft
        for s, d, r in zip(seqs, drafts, starts):
            m, group = len(d), s.group
            j = accepted_prefix(d, tokens[r : r + m])
            kept = 0
            for tok, lp in zip(tokens[r : r + j + 1], logprobs[r : r + j + 1]):
                s.token_ids.append(tok)
                s.logprobs.append(lp)
                s.token_versions.append(version)
                kept += 1
                if (tok in s.watch_tokens or len(s.token_ids) >= s.limit) and self._end(s, tok, out):
                    break
            out.new_tokens[s.request_id] = tokens[r : r + kept]
            self.tokens_generated += kept
            if self._seqs.get(s.request_id) is s:  # still here (running or parked)
                s.num_cached = len(s) - 1
                self.blocks.truncate(s, len(s))
            if m:
                self.draft_rows += 1
                self.draft_tokens += m
                self.accepted_tokens += j
                self.verify_tokens += kept
                if group is not None:
                    group.record(j, m)
                s.draft_len = next_draft_len(s.draft_len, j, m, max_draft)
        self.decode_steps += 1
        self.verify_steps += 1
        return out
