"""The engine loop: requests in, one scheduled step at a time, tokens and finished requests out.

Requests can leave (`export_request`) and enter (`import_request`) mid-generation: the receiver re-prefills
prompt plus tokens so far and continues with the same sampling stream, so a moved request produces what it would
have produced had it stayed. Weights are swapped in place (`load_weights`): parameters are copied into, the KV
cache is never reallocated.

With `tensor_parallel`, N processes each run one of these on a shard of the network (`tensor_parallel.py`), making
the same calls in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from laminar.engine.adapters import AdaptedWeights, is_adapters
from laminar.engine.block_manager import BlockManager
from laminar.engine.config import ModelConfig, SamplingParams, Speculation
from laminar.engine.drafter import Drafter
from laminar.engine.gate import Gate
from laminar.engine.layout import WeightLayout
from laminar.engine.model_runner import Launched, ModelRunner
from laminar.engine.moves import RequestMoves
from laminar.engine.sampler import SamplingBatch, request_key
from laminar.engine.scheduler import Scheduler
from laminar.engine.sequence import (
    FinishedRequest,
    Sequence,
    StepOutput,
)
from laminar.engine.speculative import VERIFYING, Speculating
from laminar.engine.stats import EngineStats
from laminar.engine.tensor_parallel import TPGroup, local_config, shard_spec
from laminar.engine.weights import load_safetensors_dir, staged_copy, unflatten

CPU_KV_BUDGET = 1 << 30  # default KV cache on CPU: 1 GiB (or less if the running cap needs less)
# rows a verify step may hold (a request's last token and each of its draft tokens is a row); with speculation
# the decode graphs are captured up to this many
VERIFY_ROWS = 128


class Engine(RequestMoves, Speculating):
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
        self.gate = Gate(self.speculation.cost_ratio) if speculating else None  # auto's: verify or not
        self.verify_steps = self.draft_rows = self.verify_tokens = 0
        self.draft_tokens = self.accepted_tokens = 0
        self.draft_s = 0.0
        self._keys: dict[str, int] = {}
        self._inflight: Launched | None = None  # a decode step queued, not yet collected
        self._ready: StepOutput | None = None  # a step collected early, not yet returned by `step`
        self.adapted = AdaptedWeights()  # the base of the weights a LoRA adapter version changes
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

    def has_unfinished(self) -> bool:
        if not self._seqs:
            self._drain()  # every row of a step in flight is dropped: let it end
        return bool(self._seqs) or self._ready is not None

    # ---- the loop -----------------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one step and return what it produced. With `pipeline`, a decode step queues the next one before
        it waits for its own tokens, so the host's bookkeeping overlaps the device's work (see `_launch_next`)."""
        if self._ready is not None:  # a step that a weight load waited for, handed out now
            out, self._ready = self._ready, None
            return self._ended(out)
        if self._inflight is None:
            seqs, is_prefill = self.scheduler.schedule()
            if not seqs:
                return self._ended(StepOutput())
            lens = [len(s) for s in seqs]
            sb = self._sampling(seqs, lens)
            if is_prefill:
                for s in seqs:
                    if s.num_cached == 0:
                        s.num_prefilled += s.num_output  # outputs recomputed after preemption or import
                num_tokens = sum(n - s.num_cached for s, n in zip(seqs, lens))
                self.prefill_tokens += num_tokens
                tokens, logprobs = self.runner.prefill(seqs, sb)
                out = StepOutput(is_prefill=True, num_tokens=num_tokens)
                return self._ended(self._record(seqs, tokens, logprobs, out))
            drafts = self._drafts(seqs)
            if drafts is not None:
                return self._ended(self._verify(seqs, drafts), "verify", len(seqs))
            self._inflight = self.runner.launch_decode(seqs, lens, sb)
        step, self._inflight = self._inflight, None
        live = self._live_rows(step)  # nothing between the two changes a request
        if self.pipeline:
            self._inflight = self._launch_next(step, live)
        return self._ended(self._collect(step, live), "plain", len(step.seqs))

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
        if self.scheduler.waiting:
            return None
        choice = self._choose(step.seqs)
        if choice in VERIFYING:
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
        self._commit(len(step.seqs), choice, False)
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
            loss_mask=seq.mask() if seq.loss_mask else [],
        )

    # ---- weights ------------------------------------------------------------------------------------------
    def load_weights(self, flat: np.ndarray | torch.Tensor, layout: WeightLayout, version: int) -> None:
        """From the relay's flat buffer: views over it, copied into the existing parameters."""
        self.load_state_dict(unflatten(flat, layout), version)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy Hugging Face-named tensors into the parameters in place (CUDA graphs and KV cache stay valid).
        Under tensor parallelism `state` is the whole model; this rank copies its slices. A version of LoRA
        adapters alone (`adapters.py`) is added to the base: the weights last loaded whole."""
        self._drain()  # a step in flight samples with the weights and version it was queued under
        params = dict(self.runner.model.named_parameters())  # a tied lm_head appears once, as the embedding
        if is_adapters(state):
            if self.tp:
                raise ValueError("a LoRA adapter version under tensor parallelism: publish the merged model")
            self.adapted.apply(params, state)
        else:
            self._load_whole(params, state)
            self.adapted.clear()  # these weights are the base from now on
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the source buffer may be reused as soon as we return
        self.version = version

    def _load_whole(self, params: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
        """Copy a whole Hugging Face state dict in; under tensor parallelism, this rank's slices of it
        (`shard_spec`), taken as views of the whole tensors."""
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
        staging: torch.Tensor | None = None  # one device buffer for every strided slice, in stream order
        for name, p in params.items():
            whole = state[name]
            spec = shard_spec(name, self.config, self.tp.rank, self.tp.world) if self.tp else None
            src = whole if spec is None else whole.narrow(*spec)
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(
                    f"weight {name!r} has shape {tuple(src.shape)}; this model expects {tuple(p.shape)}"
                )
            if src.is_contiguous():
                p.copy_(src, non_blocking=True)
            else:  # a rank's columns (o_proj, down_proj): strided in host memory, so copied whole, sliced here
                staging, flat = staged_copy(staging, whole, self.device)
                p.copy_(flat.view(whole.shape).narrow(*spec))

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
            gate_steps=dict(self.gate.steps) if self.gate else {},
            gate_ms_per_token=self.gate.ms_per_token() if self.gate else {},
        )

    def reset_peak(self) -> None:
        """Start a new peak window (the repack planner compares current KV use to this batch's peak)."""
        self.blocks.reset_peak()
