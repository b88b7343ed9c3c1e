"""Tensors in, logits out: owns the network, the KV cache, the RoPE table and (on CUDA) the decode graphs.

Under tensor parallelism the runner holds one rank's shard: the network and cache of `cfg`, that rank's shape."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from laminar.engine import paged_attention, sampler
from laminar.engine.attention import AttentionContext
from laminar.engine.config import ModelConfig
from laminar.engine.fused import Fused
from laminar.engine.model import CausalLM
from laminar.engine.rope import cos_sin_table
from laminar.engine.sampler import SamplingBatch
from laminar.engine.sequence import MovedKV, Sequence
from laminar.engine.tensor_parallel import TPGroup


@dataclass
class Launched:
    """A decode step queued on the device: its rows, each row's context length, their sampling inputs, and its
    samples (device tensors; on CUDA also pinned host copies on their way, done when `event` is)."""

    seqs: list[Sequence]
    ctx_lens: list[int]
    sampling: SamplingBatch
    tokens: torch.Tensor
    logprobs: torch.Tensor
    host_tokens: torch.Tensor | None = None
    host_logprobs: torch.Tensor | None = None
    event: torch.cuda.Event | None = None


GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


@contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        num_kv_blocks: int,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        use_cuda_graphs: bool,
        max_rows: int = 0,
        tensor_parallel: TPGroup | None = None,
    ):
        """`max_rows`: the most rows a decode step may have when more than `max_num_seqs` (speculation verifies
        several tokens a request, one row each); the decode graphs are captured up to it. `tensor_parallel`:
        this rank's place, `cfg` then its shard's shape (`tensor_parallel.local_config`)."""
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.tp = tensor_parallel
        self.shard = (tensor_parallel.rank, tensor_parallel.world) if tensor_parallel else (0, 1)
        self.block_size, self.max_model_len = block_size, max_model_len
        fused = Fused(compile=device.type == "cuda" and use_cuda_graphs)
        if device.type == "cuda":
            fused.warm_up(device, dtype, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        with torch.device(device), _default_dtype(dtype):
            self.model = CausalLM(cfg, fused, tensor_parallel).eval().requires_grad_(False)
        self.cos_sin = cos_sin_table(
            cfg.rope_parameters, cfg.head_dim, cfg.max_position_embeddings, max_model_len
        )
        self.cos_sin = self.cos_sin.to(device)
        # One extra block at the end is scratch: padded rows of a captured graph write and read only there.
        self.num_kv_blocks = num_kv_blocks
        self.scratch_block = num_kv_blocks
        shape = (cfg.num_layers, num_kv_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.max_blocks = -(-max_model_len // block_size)
        self.use_triton = device.type == "cuda" and paged_attention.available()
        self.graphs: dict[int, tuple] = {}  # batch size -> (graph, logits, tokens, logprobs)
        self._turn = self._out_turn = 0  # which pinned input / output buffers the next launch takes
        self.max_num_seqs = max_num_seqs
        self.max_rows = max(max_num_seqs, max_rows)
        self._host_out = [
            (
                torch.empty(self.max_rows, dtype=torch.int64, pin_memory=device.type == "cuda"),
                torch.empty(self.max_rows, dtype=torch.float32, pin_memory=device.type == "cuda"),
            )
            for _ in range(2)
        ]
        # tensor parallel captures its NCCL all-reduces in the graphs too, unless its group asks for eager steps
        graphs_here = tensor_parallel is None or tensor_parallel.graphs
        self.use_cuda_graphs = use_cuda_graphs and device.type == "cuda" and graphs_here

    @staticmethod
    def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem

    # ---- moved keys and values ----------------------------------------------------------------------------
    def read_kv(self, block_table: list[int], num_tokens: int) -> MovedKV:
        """The first `num_tokens` cached keys and values of a request, as host bytes (`MovedKV`)."""
        blocks = torch.as_tensor(block_table[: -(-num_tokens // self.block_size)], device=self.device)

        def take(cache: torch.Tensor) -> np.ndarray:
            rows = cache.index_select(1, blocks).flatten(1, 2)[:, :num_tokens].contiguous()
            return rows.cpu().view(torch.uint8).numpy().reshape(-1)

        _, _, _, heads, dim = self.k_cache.shape
        return MovedKV(
            num_tokens,
            (self.k_cache.shape[0], num_tokens, heads, dim),
            self._kv_dtype(),
            take(self.k_cache),
            take(self.v_cache),
            self.shard,
        )

    def fits_kv(self, kv: MovedKV) -> bool:
        """Whether `kv` came from an engine of this model shape and cache dtype."""
        layers, _, heads, dim = kv.shape
        same_shape = (layers, heads, dim) == (self.k_cache.shape[0], *self.k_cache.shape[3:])
        return same_shape and kv.dtype == self._kv_dtype()

    def _kv_dtype(self) -> str:
        return str(self.k_cache.dtype).removeprefix("torch.")

    def write_kv(self, block_table: list[int], kv: MovedKV) -> None:
        """Put moved keys and values into this engine's blocks `block_table` (which cover `kv.num_tokens`)."""
        pos = torch.arange(kv.num_tokens)
        table = torch.as_tensor(block_table, dtype=torch.long)
        slots = (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)
        for cache, data in ((self.k_cache, kv.keys), (self.v_cache, kv.values)):
            rows = torch.from_numpy(np.array(data)).view(cache.dtype).view(kv.shape).to(self.device)
            cache.flatten(1, 2).index_copy_(1, slots, rows)

    # ---- inputs -------------------------------------------------------------------------------------------
    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _to_device(self, x: list | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=dtype)
        return t.to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], sb: SamplingBatch) -> tuple[list[int], list[float]]:
        """Run each sequence's tokens from its first uncached one (position 0, unless a resumed request kept its
        prefix); sample after each last token."""
        starts = [s.num_cached for s in seqs]
        lens = [len(s) - c for s, c in zip(seqs, starts)]
        ids = [t for s, c in zip(seqs, starts) for t in s.token_ids[c:]]
        positions = np.concatenate([np.arange(c, len(s)) for s, c in zip(seqs, starts)])
        bs = self.block_size
        slots = np.concatenate(
            [
                np.asarray(s.block_table, dtype=np.int64).repeat(bs)[c : len(s)] * bs
                + np.arange(c, len(s)) % bs
                for s, c in zip(seqs, starts)
            ]
        )
        pad_index = unpad_index = None
        t = max(lens)
        if any(n != t for n in lens):
            begins = np.cumsum([0] + lens[:-1])
            ar = np.arange(t)
            pad = np.where(ar[None, :] < np.asarray(lens)[:, None], begins[:, None] + ar[None, :], 0)
            unpad = np.concatenate([i * t + np.arange(n) for i, n in enumerate(lens)])
            pad_index, unpad_index = self._to_device(pad, torch.int64), self._to_device(unpad, torch.int64)
        ctx = AttentionContext(
            is_prefill=True,
            slot_mapping=self._to_device(slots, torch.int64),
            seq_lens=lens,
            pad_index=pad_index,
            unpad_index=unpad_index,
        )
        if any(starts):  # a resumed request: its queries read the cached prefix
            width = max(len(s.block_table) for s in seqs)
            tables = np.zeros((len(seqs), width), dtype=np.int32)
            for i, s in enumerate(seqs):
                tables[i, : len(s.block_table)] = s.block_table
            ctx.context_starts = starts
            ctx.block_tables = self._to_device(tables, torch.int32)
            ctx.max_context_len = max(len(s) for s in seqs)
        pos = self._to_device(positions, torch.int64)
        hidden = self.model(
            self._to_device(ids, torch.int64), self.cos_sin[pos], self.k_cache, self.v_cache, ctx
        )
        last = self._to_device(np.cumsum(lens) - 1, torch.int64)
        for s in seqs:
            s.num_cached = len(s)
        return self.sample(self.model.logits(hidden[last]), sb)

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], sb: SamplingBatch) -> tuple[list[int], list[float]]:
        """One new token per sequence (its last, not yet cached): sample it, return (tokens, log-probs)."""
        return self.collect(self.launch_decode(seqs, [len(s) for s in seqs], sb))

    @torch.inference_mode()
    def launch_decode(
        self,
        seqs: list[Sequence],
        ctx_lens: list[int],
        sb: SamplingBatch,
        after: Launched | None = None,
        ids: list[int] | None = None,
    ) -> Launched:
        """Queue a decode step and return without waiting for it. Row i reads the first `ctx_lens[i]` tokens of
        `seqs[i]`, its last one as input. With `after` (a step still on its way, whose rows these sequences
        are), each input token is the one `after` samples for the same sequence: taken on the device, so this
        step is queued before that one's tokens reach the host. With `ids`, row i's input token is `ids[i]`
        instead (a verify step: a sequence in several rows, one a draft token, each reading one more token than
        the last; a row's key and value go to its position's slot). `collect` gives the tokens and log-probs."""
        bsz = len(seqs)
        graph_bs = self._graph_size(bsz)
        rows = graph_bs or bsz
        if graph_bs:  # two pinned buffers in turn: the other may still feed the step before this one
            self._turn ^= 1
            st = self._stagings[self._turn]
            st.fill_padding(rows, self.scratch_block, self.block_size, start=bsz)
        else:
            st = _Staging(rows, self.max_blocks, pinned=False)
            st.fill_padding(rows, self.scratch_block, self.block_size)
        bs = self.block_size
        if after is not None:
            src = {id(s): i for i, s in enumerate(after.seqs)}
            st.ids[:bsz] = [src[id(s)] for s in seqs]
        elif ids is not None:
            st.ids[:bsz] = ids
        else:
            st.ids[:bsz] = [s.token_ids[n - 1] for s, n in zip(seqs, ctx_lens)]
        lens = np.fromiter(ctx_lens, np.int64, bsz)
        st.pos[:bsz], st.lens[:bsz] = lens - 1, lens
        st.slots[:bsz] = [s.block_table[(n - 1) // bs] * bs + (n - 1) % bs for s, n in zip(seqs, ctx_lens)]
        st.write_tables([s.block_table for s in seqs])
        st.keys[:bsz], st.temps[:bsz] = sb.keys, sb.temperatures
        if graph_bs:
            self.static_in.copy_(st.buf, non_blocking=True)
            dev = self._static
        else:
            dev = _Staging.to_device(st, self.device)
        if after is not None:  # the input tokens: rows of the earlier step's samples
            dev.ids[:bsz] = after.tokens[dev.ids[:bsz]]
        if graph_bs:
            graph, logits, tokens, logprobs = self.graphs[graph_bs]
            graph.replay()
            if sb.filtered:  # top-k / top-p rows: the graph's sampler has no filters
                tokens, logprobs = self._sample(logits[:bsz], sb)
        else:
            ctx = AttentionContext(
                is_prefill=False,
                slot_mapping=dev.slots,
                block_tables=dev.tables[:, : -(-max(ctx_lens) // bs)],
                context_lens=dev.lens,
                max_context_len=max(ctx_lens),
                use_triton=self.use_triton,
            )
            hidden = self.model(dev.ids, self.cos_sin[dev.pos], self.k_cache, self.v_cache, ctx)
            tokens, logprobs = self._sample(self.model.logits(hidden), sb)
        return self._launched(seqs, ctx_lens, sb, tokens[:bsz], logprobs[:bsz])

    def _launched(self, seqs, ctx_lens, sb, tokens: torch.Tensor, logprobs: torch.Tensor) -> Launched:
        """On CUDA the results start for pinned host memory now, before a later step can overwrite them."""
        if self.device.type != "cuda":
            return Launched(seqs, ctx_lens, sb, tokens, logprobs)
        n = len(seqs)
        self._out_turn ^= 1
        host_t, host_lp = (x[:n] for x in self._host_out[self._out_turn])
        if len(host_t) < n:  # a batch past the graphs' sizes: a buffer of its own
            host_t = torch.empty(n, dtype=torch.int64, pin_memory=True)
            host_lp = torch.empty(n, dtype=torch.float32, pin_memory=True)
        host_t.copy_(tokens, non_blocking=True)
        host_lp.copy_(logprobs, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Launched(seqs, ctx_lens, sb, tokens, logprobs, host_t, host_lp, event)

    @staticmethod
    def collect(step: Launched) -> tuple[list[int], list[float]]:
        """Wait for a launched step; its tokens and log-probs, row by row."""
        if step.event is None:
            return step.tokens.tolist(), step.logprobs.tolist()
        step.event.synchronize()
        return step.host_tokens.tolist(), step.host_logprobs.tolist()

    def sample(self, logits: torch.Tensor, sb: SamplingBatch) -> tuple[list[int], list[float]]:
        tokens, logprobs = self._sample(logits, sb)
        return tokens.tolist(), logprobs.tolist()

    def _sample(self, logits: torch.Tensor, sb: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        def put(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x).to(self.device)

        top_k, top_p = (put(sb.top_k), put(sb.top_p)) if sb.filtered else (None, None)
        tokens, logprobs = sampler.sample(logits, put(sb.temperatures), put(sb.keys), top_k, top_p)
        if self.tp is not None and self.tp.check:
            self.tp.check_same(tokens, "sampled tokens")
            self.tp.check_same(logprobs, "log-probs")
        return tokens, logprobs

    # ---- CUDA graphs --------------------------------------------------------------------------------------
    def _graph_size(self, bsz: int) -> int:
        return next((b for b in sorted(self.graphs) if b >= bsz), 0)

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Capture decode plus sampling for padded batch sizes up to `max_rows`.

        Inputs travel in one pinned buffer and one copy; the graph reads views of its device twin.
        """
        if not (self.use_cuda_graphs and self.use_triton):
            return
        sizes = [b for b in GRAPH_BATCH_SIZES if b < self.max_rows] + [self.max_rows]
        n = max(sizes)
        self._stagings = [_Staging(n, self.max_blocks, pinned=True) for _ in range(2)]
        for staging in self._stagings:
            staging.fill_padding(n, self.scratch_block, self.block_size)
        staging = self._stagings[0]
        self.static_in = staging.buf.to(self.device)
        self._static = dev = _Staging.to_device(staging, self.device, self.static_in)
        pool = None
        for b in sorted(sizes, reverse=True):
            ctx = AttentionContext(
                is_prefill=False,
                slot_mapping=dev.slots[:b],
                block_tables=dev.tables[:b],
                context_lens=dev.lens[:b],
                use_triton=True,
            )

            def run(b=b, ctx=ctx):
                h = self.model(dev.ids[:b], self.cos_sin[dev.pos[:b]], self.k_cache, self.v_cache, ctx)
                logits = self.model.lm_head(h)  # the model's dtype: the sampler reads it as float32
                return (logits, *sampler.sample_triton(logits, dev.temps[:b], dev.keys[:b]))

            run()  # warm up (Triton compile, cuBLAS handles) outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outs = run()
            pool = graph.pool()
            self.graphs[b] = (graph, *outs)
        torch.cuda.synchronize()


class _Staging:
    """Decode inputs for up to n rows in one int64 buffer: ids, positions, slots, context lengths, sampling keys,
    block tables, then temperatures (float32 viewed over the tail). One host-to-device copy per step."""

    def __init__(self, n: int, width: int, pinned: bool, buf: torch.Tensor | None = None):
        self.n, self.width = n, width
        size = 5 * n + n * width + -(-n // 2)
        self.buf = buf if buf is not None else torch.empty(size, dtype=torch.int64, pin_memory=pinned)
        view = self.buf if buf is not None else self.buf.numpy()
        self.ids, self.pos, self.slots, self.lens, self.keys = (view[i * n : (i + 1) * n] for i in range(5))
        self.tables = view[5 * n : 5 * n + n * width].reshape(n, width)
        tail = view[5 * n + n * width :]
        self.temps = tail.view(torch.float32)[:n] if buf is not None else tail.view(np.float32)[:n]
        # each row's block table as last written (`write_tables`), and its length
        self.held: list[list[int] | None] = [None] * n
        self.held_len = [0] * n

    def fill_padding(self, rows: int, scratch_block: int, block_size: int, start: int = 0) -> None:
        """Rows start..rows-1, past the batch, read and write only the scratch block. A buffer used again keeps
        its batch rows' old table entries past their blocks: valid block ids, and never read."""
        self.ids[start:rows], self.pos[start:rows], self.lens[start:rows] = 0, 0, 1
        self.slots[start:rows] = scratch_block * block_size
        self.tables[start:rows] = scratch_block
        self.temps[start:rows] = 1.0
        self.held[start:rows] = [None] * (rows - start)

    def write_tables(self, block_tables: list[list[int]]) -> None:
        """Row i's block table, written only where this buffer does not hold it yet. A sequence's table is only
        ever appended to or replaced by a new list, so a row that holds the same list needs only its new
        entries. Entries past a row's blocks are left as they are: never read (the row's length masks them)."""
        tables, held, held_len = self.tables, self.held, self.held_len
        for i, table in enumerate(block_tables):
            if held[i] is table:
                if held_len[i] != len(table):
                    tables[i, held_len[i] : len(table)] = table[held_len[i] :]
            else:
                tables[i, : len(table)] = table
                held[i] = table
            held_len[i] = len(table)

    @staticmethod
    def to_device(st: _Staging, device: torch.device, dst: torch.Tensor | None = None) -> _Staging:
        if dst is None:
            dst = st.buf.to(device) if device.type == "cuda" else st.buf
        return _Staging(st.n, st.width, pinned=False, buf=dst)
