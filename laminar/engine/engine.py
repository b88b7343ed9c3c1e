"""The engine loop: requests in, one scheduled step at a time, tokens and finished requests out.

Requests can leave (`export_request`) and enter (`import_request`) mid-generation: the receiver re-prefills
prompt plus tokens so far and continues with the same sampling stream, so a moved request produces what it would
have produced had it stayed. Weights are swapped in place (`load_weights`): parameters are copied into, the KV
cache is never reallocated.

With `tensor_parallel`, N processes each run one of these on a shard of the network (`tensor_parallel.py`), making
the same calls in the same order.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from laminar.engine.block_manager import BlockManager
from laminar.engine.config import ModelConfig, SamplingParams, Speculation
from laminar.engine.drafter import Drafter, next_draft_len
from laminar.engine.layout import WeightLayout
from laminar.engine.model_runner import Launched, ModelRunner
from laminar.engine.sampler import SamplingBatch, accepted_prefix, request_key
from laminar.engine.scheduler import Scheduler
from laminar.engine.sequence import (
    EngineStats,
    ExportedRequest,
    FinishedRequest,
    MovedKV,
    Sequence,
    StepOutput,
)
from laminar.engine.tensor_parallel import TPGroup, local_config, shard_state_dict
from laminar.engine.weights import load_safetensors_dir, unflatten

CPU_KV_BUDGET = 1 << 30  # default KV cache on CPU: 1 GiB (or less if the running cap needs less)
# rows a verify step may hold (a request's last token and each of its draft tokens is a row); with speculation
# the decode graphs are captured up to this many
VERIFY_ROWS = 128


class Engine:
    def __init__(
        self,
        model_config: ModelConfig,
        *,
        weights: dict[str, torch.Tensor] | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_num_seqs: int = 64,
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        max_model_len: int | None = None,
        version: int = 0,
        max_num_batched_tokens: int | None = None,
        gpu_memory_utilization: float = 0.9,
        use_cuda_graphs: bool = True,
        share_prompts: bool = True,
        pipeline: bool | None = None,
        speculation: Speculation | None = None,
        tensor_parallel: TPGroup | None = None,
    ):
        """`weights=None` keeps the random initialisation (benchmarks); otherwise a Hugging Face state dict.
        `share_prompts=False` makes every sample prefill its own prompt (the measure of what sharing saves).
        `pipeline`: queue each decode step before the last one's tokens reach the host (`step`); by default on
        where decode runs as CUDA graphs (the host's work per step then hides behind the device's), off on
        CPU, where nothing runs asynchronously to hide it behind. `speculation`: grouped speculative decoding
        (`_drafts`, `_verify`); None: off. `tensor_parallel`: this process's rank among those that run this engine
        together (each holds its shard of the weights and KV cache; no CUDA graphs yet); every rank must be built
        with the same arguments and make the same calls. None, or a world of 1: one process."""
        self.config = cfg = model_config
        self.tp = tensor_parallel if tensor_parallel is not None and tensor_parallel.world > 1 else None
        self.shard_config = local_config(cfg, self.tp.world) if self.tp else cfg  # this rank's network
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' but torch.cuda.is_available() is False; use device='cpu'")
        self.max_model_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.block_size = block_size
        self.speculation = speculation or Speculation()
        speculating = self.speculation.mode != "off"
        if num_kv_blocks is None:
            rows = max(max_num_seqs, VERIFY_ROWS if speculating else 0)
            num_kv_blocks = self._default_kv_blocks(dtype, max_num_seqs, rows, gpu_memory_utilization)
            if self.tp:  # each rank's free memory differs; their caches, and so their schedules, must not
                num_kv_blocks = self.tp.agree_min(num_kv_blocks, self.device)
        self.runner = ModelRunner(
            self.shard_config,
            device=self.device,
            dtype=dtype,
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
            max_model_len=self.max_model_len,
            max_num_seqs=max_num_seqs,
            use_cuda_graphs=use_cuda_graphs,
            max_rows=VERIFY_ROWS if speculating else 0,
            tensor_parallel=self.tp,
        )
        self.blocks = BlockManager(num_kv_blocks, block_size)
        self.scheduler = Scheduler(
            self.blocks, max_num_seqs, max_num_batched_tokens or max(self.max_model_len, 8192)
        )
        self.version = version
        self.tokens_generated = 0
        self.eos = set(cfg.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self._prompt_leads: dict[tuple[int, ...], Sequence] = {}  # prompt -> the first live request with it
        self.share_prompts = share_prompts
        self.prefill_tokens = 0
        self.decode_steps = self.queued_ahead = self.dropped_rows = 0
        self.drafter = Drafter() if speculating else None
        self.verify_steps = self.draft_rows = self.verify_tokens = 0
        self.draft_tokens = self.accepted_tokens = 0
        self.draft_s = 0.0
        self._keys: dict[str, int] = {}
        self._inflight: Launched | None = None  # a decode step queued, not yet collected
        self._ready: StepOutput | None = None  # a step collected early, not yet returned by `step`
        if weights is not None:
            self.load_state_dict(weights, version)
        self.runner.capture_graphs()
        self.pipeline = bool(self.runner.graphs) if pipeline is None else pipeline

    @classmethod
    def from_pretrained(cls, path: str | Path, eos_token_ids: Iterable[int] = (), **kw) -> Engine:
        """A local Hugging Face model directory: config.json plus *.safetensors. Generation ends on the end
        tokens of config.json and generation_config.json, and on `eos_token_ids` (the tokenizer's EOS, the
        run's stop tokens)."""
        cfg = ModelConfig.from_dir(path)
        cfg.eos_token_ids = tuple(dict.fromkeys([*cfg.eos_token_ids, *eos_token_ids]))
        return cls(cfg, weights=load_safetensors_dir(path), **kw)

    def _default_kv_blocks(self, dtype: torch.dtype, max_num_seqs: int, rows: int, utilization: float) -> int:
        per_block = ModelRunner.kv_bytes_per_block(self.shard_config, self.block_size, dtype)
        wanted = max_num_seqs * -(-self.max_model_len // self.block_size)
        if self.device.type != "cuda":
            return max(1, min(wanted, CPU_KV_BUDGET // per_block))
        cfg, elem = self.shard_config, torch.empty((), dtype=dtype).element_size()
        params = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) + cfg.num_layers * (
            cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
            + 3 * cfg.hidden_size * cfg.intermediate_size
        )
        free, total = torch.cuda.mem_get_info(self.device)
        activations = rows * cfg.vocab_size * 4 * 3 + (2 << 30)  # a decode step's rows of logits
        budget = free - params * elem - activations - (1 - utilization) * total
        return max(1, min(wanted, int(budget // per_block)))

    # ---- requests -----------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._check_new(request_id, len(prompt_token_ids), "prompt")
        vocab = self.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {request_id!r}: token ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )
        seq = Sequence(request_id, list(prompt_token_ids), len(prompt_token_ids), params)
        # the samples of a group share a prompt: the first computes it, the others start from its blocks
        key = tuple(prompt_token_ids)
        lead = self._prompt_leads.get(key)
        if lead is not None and self._seqs.get(lead.request_id) is lead:
            seq.share_from = lead if self.share_prompts else None
        else:
            self._prompt_leads[key] = seq
        self._admit(seq)

    def _check_new(self, request_id: str, num_tokens: int, what: str) -> None:
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in this engine; ids must be unique")
        if num_tokens < 1:
            raise ValueError(f"request {request_id!r}: empty {what}; give at least one token")
        if num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request_id!r}: {what} has {num_tokens} tokens but max_model_len is {self.max_model_len}; "
                f"it must be at most {self.max_model_len - 1} tokens to leave room for one new token"
            )
        need = self.blocks.blocks_for(num_tokens + 1)
        if need > self.blocks.num_blocks:
            raise ValueError(
                f"request {request_id!r}: {what} of {num_tokens} tokens needs {need} KV blocks but the cache has "
                f"{self.blocks.num_blocks}; raise num_kv_blocks or shorten the {what}"
            )

    def _admit(self, seq: Sequence) -> None:
        p = seq.params
        seq.watch_tokens = frozenset(
            (*p.stop_token_ids, *p.park_token_ids, *(() if p.ignore_eos else self.eos))
        )
        seq.limit = min(seq.num_prompt_tokens + p.max_new_tokens, self.max_model_len)
        self._seqs[seq.request_id] = seq
        self._keys[seq.request_id] = request_key(seq.params.seed, seq.request_id)
        if self.drafter is not None:
            seq.group, seq.stream = self.drafter.join(seq.request_id, seq.token_ids, seq.num_prompt_tokens)
            seq.draft_len = max(1, self.speculation.max_draft // 2)
        self.scheduler.waiting.append(seq)

    def abort(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.scheduler.remove(seq)
            self._keys.pop(request_id)
            key = tuple(seq.token_ids[: seq.num_prompt_tokens])
            if self._prompt_leads.get(key) is seq:
                del self._prompt_leads[key]
            if seq.group is not None:
                self.drafter.leave(seq.group, seq.stream, seq.token_ids)
                seq.group = None

    def export_request(self, request_id: str, with_kv: bool = False) -> ExportedRequest:
        """Remove a request and return what another engine needs to continue it; `with_kv`: with the keys and
        values it has cached, so an engine of the same weights takes them over instead of prefilling again (under
        tensor parallelism, this rank's KV heads: the same rank of an engine of the same degree takes them)."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(
                f"request {request_id!r} is not in this engine (finished, aborted, or never added)"
            )
        kv = self.runner.read_kv(seq.block_table, seq.num_cached) if with_kv and seq.num_cached else None
        self.abort(request_id)
        return ExportedRequest(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_ids,
            logprobs=list(seq.logprobs),
            token_versions=list(seq.token_versions),
            params=seq.params,
            version=self.version,
            output_mask=seq.mask() if seq.output_mask else [],
            parked=seq.parked,
            kv=kv,
        )

    def import_request(self, exported: ExportedRequest) -> None:
        """Queue a moved request; it re-prefills prompt plus outputs, then continues its own sampling stream. A
        request that was parked (waiting for a tool) stays parked here until `resume`. One that brings its keys
        and values (`kv`) from an engine of this version starts from them and prefills only the rest, when they
        fit this engine's cache and free blocks; otherwise it re-prefills as any other."""
        e = exported
        if len(e.logprobs) != len(e.output_token_ids):
            raise ValueError(
                f"request {e.request_id!r}: {len(e.logprobs)} log-probs for {len(e.output_token_ids)} tokens"
            )
        tokens = list(e.prompt_token_ids) + list(e.output_token_ids)
        self._check_new(e.request_id, len(tokens), "prompt plus outputs")
        if e.kv is not None and e.kv.shard != self.runner.shard:
            raise ValueError(
                f"request {e.request_id!r}: its keys and values are shard {e.kv.shard} (rank, world) but this "
                f"engine is rank {self.runner.shard[0]} of {self.runner.shard[1]}; give each rank its own rank's "
                "shard, or between degrees tensor_parallel.gather_kv then split_kv (or export without with_kv)"
            )
        versions = list(e.token_versions) or [e.version] * len(e.output_token_ids)
        seq = Sequence(
            e.request_id,
            tokens,
            len(e.prompt_token_ids),
            e.params,
            list(e.logprobs),
            versions,
            output_mask=list(e.output_mask),
        )
        if e.kv is not None and e.version == self.version:
            self._take_kv(seq, e.kv)
        self._admit(seq)
        if e.parked:
            self.scheduler.park(seq)

    def _take_kv(self, seq: Sequence, kv: MovedKV) -> None:
        """Give `seq` blocks holding `kv`, if it matches this model and every block it needs is free (else it
        re-prefills). A waiting request holding blocks gives them up to one that cannot start otherwise."""
        if kv.num_tokens >= len(seq) or not self.runner.fits_kv(kv):
            return
        if not self.blocks.can_allocate(seq):
            return
        self.blocks.allocate(seq)
        self.runner.write_kv(seq.block_table, kv)
        seq.num_cached = kv.num_tokens

    # ---- tool turns ---------------------------------------------------------------------------------------
    def park(self, request_id: str) -> None:
        """Take a request out of the batch between steps (its model turn ended in a tool call), keeping its
        cached prefix; `resume` brings it back. Parked requests give their blocks up first when blocks run out."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(
                f"request {request_id!r} is not in this engine (finished, aborted, or never added)"
            )
        if not seq.parked:
            self.scheduler.park(seq)

    def resume(self, request_id: str, context_ids: list[int]) -> FinishedRequest | None:
        """Append `context_ids` (a tool's output, as the chat template renders it) to a parked request and queue
        it: its next prefill covers only what it has not cached (the last sampled token and these), then it
        samples on from the same stream. The appended tokens are context: mask 0, log-prob 0.0, never trained.
        A request that no longer fits the context ends here with reason "length" (returned)."""
        seq = self._seqs.get(request_id)
        if seq is None or not seq.parked:
            raise KeyError(f"request {request_id!r} is not parked in this engine; park it before resume")
        vocab = self.config.vocab_size
        bad = [t for t in context_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {request_id!r}: context ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )
        if len(seq) + len(context_ids) >= self.max_model_len:
            return self._finish(seq, "length")
        mask = seq.mask()
        seq.token_ids.extend(context_ids)
        seq.logprobs.extend([0.0] * len(context_ids))
        seq.token_versions.extend([self.version] * len(context_ids))
        seq.output_mask = mask + [0] * len(context_ids)
        self.scheduler.unpark(seq)
        return None

    def output_mask(self, request_id: str) -> list[int]:
        """Per output token so far: 1 sampled, 0 appended context."""
        return self._seqs[request_id].mask()

    def has_unfinished(self) -> bool:
        if not self._seqs:
            self._drain()  # every row of a step in flight is dropped: let it end
        return bool(self._seqs) or self._ready is not None

    def progress(self, request_id: str) -> tuple[list[int], list[float]]:
        """Output tokens and their log-probs so far (what the partial response pool keeps)."""
        seq = self._seqs[request_id]
        return seq.output_ids, list(seq.logprobs)

    # ---- the loop -----------------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one step and return what it produced. With `pipeline`, a decode step queues the next one before
        it waits for its own tokens, so the host's bookkeeping overlaps the device's work (see `_launch_next`)."""
        if self._ready is not None:  # a step that a weight load waited for, handed out now
            out, self._ready = self._ready, None
            return out
        if self._inflight is None:
            seqs, is_prefill = self.scheduler.schedule()
            if not seqs:
                return StepOutput()
            lens = [len(s) for s in seqs]
            sb = self._sampling(seqs, lens)
            if is_prefill:
                for s in seqs:
                    if s.num_cached == 0:
                        s.num_prefilled += s.num_output  # outputs recomputed after preemption or import
                num_tokens = sum(n - s.num_cached for s, n in zip(seqs, lens))
                self.prefill_tokens += num_tokens
                tokens, logprobs = self.runner.prefill(seqs, sb)
                return self._record(
                    seqs, tokens, logprobs, StepOutput(is_prefill=True, num_tokens=num_tokens)
                )
            drafts = self._drafts(seqs)
            if drafts is not None:
                return self._verify(seqs, drafts)
            self._inflight = self.runner.launch_decode(seqs, lens, sb)
        step, self._inflight = self._inflight, None
        live = self._live_rows(step)  # nothing between the two changes a request
        if self.pipeline:
            self._inflight = self._launch_next(step, live)
        return self._collect(step, live)

    def _sampling(self, seqs: list[Sequence], lens: list[int]) -> SamplingBatch:
        return SamplingBatch.of([s.params for s in seqs], [self._keys[s.request_id] for s in seqs], lens)

    def _launch_next(self, step: Launched, live: list[bool]) -> Launched | None:
        """Queue the decode step that follows `step`, before `step`'s tokens are known: its rows are `step`'s,
        less those that reach their length limit with it, and each takes as input the token `step` samples for
        it (on the device). A row whose request stops, parks, leaves or is aborted meanwhile is dropped when
        this step is collected (its key and value written past what the request counts as cached, or into
        blocks already freed; the device runs every later step after it). Only when the scheduler would decode
        the same requests: nothing waits to be admitted, no top-k/top-p row, and every block fits without
        preempting anyone. Otherwise None, and the next `step` schedules as usual."""
        if self.scheduler.waiting or self._may_draft(step.seqs):
            return None
        seqs, lens, rows, grow, need, bs = [], [], [], [], 0, self.blocks.block_size
        for i, (s, n, ok) in enumerate(zip(step.seqs, step.ctx_lens, live)):
            if ok and n + 1 < s.limit:  # one more token will not reach its length limit
                seqs.append(s)
                lens.append(n + 1)
                rows.append(i)
                more = -(-(n + 1) // bs) - len(s.block_table)  # blocks the next token needs
                if more > 0:
                    grow.append((s, n + 1))
                    need += more
        if not seqs:
            return None
        sb = step.sampling.advance(rows)
        if sb.filtered or need > len(self.blocks.free):
            return None
        for s, n in grow:
            self.blocks.allocate(s, n)
        self.queued_ahead += 1
        return self.runner.launch_decode(seqs, lens, sb, after=step)

    def _collect(self, step: Launched, live: list[bool]) -> StepOutput:
        """Wait for a decode step and record its tokens for the rows still live (see `_launch_next`)."""
        tokens, logprobs = self.runner.collect(step)
        seqs, kept_tokens, kept_logprobs = [], [], []
        for s, n, ok, tok, lp in zip(step.seqs, step.ctx_lens, live, tokens, logprobs):
            if ok:
                s.num_cached = n
                seqs.append(s)
                kept_tokens.append(tok)
                kept_logprobs.append(lp)
        self.decode_steps += 1
        self.dropped_rows += len(step.seqs) - len(seqs)
        out = StepOutput(is_prefill=False, num_tokens=len(seqs))
        return self._record(seqs, kept_tokens, kept_logprobs, out)

    def _live_rows(self, step: Launched) -> list[bool]:
        """For each row of a queued decode step, whether it still counts: its request is here, not parked, and
        has exactly the tokens the row read."""
        seqs = self._seqs
        return [
            seqs.get(s.request_id) is s and not s.parked and len(s.token_ids) == n
            for s, n in zip(step.seqs, step.ctx_lens)
        ]

    def _record(self, seqs, tokens: list[int], logprobs: list[float], out: StepOutput) -> StepOutput:
        """Append each sequence's sampled token; finish or park those it ends."""
        if self._guessing(seqs) and not out.is_prefill:
            self._guess(seqs, tokens)
        version, new_tokens = self.version, out.new_tokens
        for seq, tok, lp in zip(seqs, tokens, logprobs):
            seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            seq.token_versions.append(version)
            new_tokens[seq.request_id] = [tok]
            if tok not in seq.watch_tokens and len(seq.token_ids) < seq.limit:
                continue  # neither ends nor parks it (`_admit`)
            self._end(seq, tok, out)
        self.tokens_generated += len(seqs)
        return out

    def _end(self, seq: Sequence, tok: int, out: StepOutput) -> bool:
        """Finish or park `seq` if `tok`, just appended, ends or parks it; whether it did."""
        reason = self._finish_reason(seq, tok)
        if reason:
            out.finished.append(self._finish(seq, reason))
            return True
        if tok in seq.params.park_token_ids:
            self.scheduler.park(seq)
            out.parked.append(seq.request_id)
            return True
        return False

    # ---- speculation --------------------------------------------------------------------------------------
    def _may_draft(self, seqs: list[Sequence]) -> bool:
        """Whether a decode step of `seqs` may verify drafts (then it runs step by step, never queued ahead:
        a draft continues the tokens the step before sampled)."""
        spec = self.speculation
        if spec.mode == "off" or not seqs:
            return False
        if spec.mode == "on":
            return True
        low = spec.min_acceptance
        return len(seqs) <= spec.max_batch and any(
            s.group is not None and s.group.acceptance >= low for s in seqs
        )

    def _guessing(self, seqs: list[Sequence]) -> bool:
        spec = self.speculation
        return spec.mode == "auto" and len(seqs) <= spec.max_batch

    def _drafts(self, seqs: list[Sequence]) -> list[list[int]] | None:
        """Each scheduled request's draft tokens ([] for none), or None when no request drafts. A draft stops
        one token short of the request's length limit, and within its share of the step's rows (`VERIFY_ROWS`)
        and of the free blocks (never preempting anyone for a draft)."""
        if not self._may_draft(seqs):
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

    def _drain(self) -> None:
        """Wait for the step in flight and keep what it produced for the next `step` to return."""
        if self._inflight is not None:
            step, self._inflight = self._inflight, None
            out = self._collect(step, self._live_rows(step))
            if out.new_tokens:
                assert self._ready is None, "at most one step is ever in flight"
                self._ready = out

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos):
            return "stop"
        if len(seq.token_ids) >= seq.limit:  # max_new_tokens or max_model_len (`_admit`)
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> FinishedRequest:
        self.abort(seq.request_id)
        return FinishedRequest(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_ids,
            logprobs=seq.logprobs,
            finish_reason=reason,
            version=seq.token_versions[0] if seq.token_versions else self.version,
            token_versions=seq.token_versions,
            reprefill_tokens=seq.num_prefilled,
            output_mask=seq.mask() if seq.output_mask else [],
        )

    # ---- weights ------------------------------------------------------------------------------------------
    def load_weights(self, flat: np.ndarray | torch.Tensor, layout: WeightLayout, version: int) -> None:
        """From the relay's flat buffer: views over it, copied into the existing parameters."""
        self.load_state_dict(unflatten(flat, layout), version)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy Hugging Face-named tensors into the parameters in place (CUDA graphs and KV cache stay valid).
        Under tensor parallelism `state` is the whole model; this rank copies its slices."""
        self._drain()  # a step in flight samples with the weights and version it was queued under
        if self.tp:
            state = shard_state_dict(state, self.config, self.tp.rank, self.tp.world)
        params = dict(self.runner.model.named_parameters())  # a tied lm_head appears once, as the embedding
        tied_extra = {"lm_head.weight"} if self.config.tie_word_embeddings else set()
        missing = sorted(set(params) - set(state))
        if missing:
            raise KeyError(
                f"missing weight(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} ({len(missing)} of "
                f"{len(params)}); expected Hugging Face names such as 'model.layers.0.self_attn.q_proj.weight'"
            )
        unexpected = sorted(
            k for k in set(state) - set(params) - tied_extra if not k.endswith("rotary_emb.inv_freq")
        )
        if unexpected:
            raise KeyError(
                f"unexpected weight(s) {unexpected[:5]} for a {self.config.family} model of this shape; "
                f"expected names such as {sorted(params)[:3]}"
            )
        for name, p in params.items():
            src = state[name]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(
                    f"weight {name!r} has shape {tuple(src.shape)}; this model expects {tuple(p.shape)}"
                )
            p.copy_(src, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the source buffer may be reused as soon as we return
        self.version = version

    # ---- stats --------------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return EngineStats(
            waiting=len(self.scheduler.waiting),
            running=len(self.scheduler.running),
            kv_blocks_used=self.blocks.num_used,
            kv_blocks_total=self.blocks.num_blocks,
            tokens_generated=self.tokens_generated,
            peak_kv_blocks=self.blocks.peak_used,
            version=self.version,
            num_preemptions=self.scheduler.num_preemptions,
            block_size=self.block_size,
            parked=len(self.scheduler.parked),
            prefill_tokens=self.prefill_tokens,
            shared_prompt_tokens=self.scheduler.shared_prompt_tokens,
            decode_steps=self.decode_steps,
            queued_ahead=self.queued_ahead,
            dropped_rows=self.dropped_rows,
            verify_steps=self.verify_steps,
            draft_rows=self.draft_rows,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            verify_tokens=self.verify_tokens,
            draft_s=self.draft_s,
        )

    def reset_peak(self) -> None:
        """Start a new peak window (the repack planner compares current KV use to this batch's peak)."""
        self.blocks.reset_peak()
