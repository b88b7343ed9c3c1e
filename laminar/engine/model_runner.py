"""Tensors in, logits out: owns the network, the KV cache, the RoPE table and (on CUDA) the decode graphs."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from laminar.engine import paged_attention
from laminar.engine.attention import AttentionContext
from laminar.engine.config import ModelConfig
from laminar.engine.model import CausalLM
from laminar.engine.rope import cos_sin_table
from laminar.engine.sequence import Sequence

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
    ):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.block_size, self.max_model_len = block_size, max_model_len
        with torch.device(device), _default_dtype(dtype):
            self.model = CausalLM(cfg).eval().requires_grad_(False)
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
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.max_num_seqs = max_num_seqs
        self._table = np.full((max_num_seqs, self.max_blocks), self.scratch_block, dtype=np.int32)
        self.use_cuda_graphs = use_cuda_graphs and device.type == "cuda"

    @staticmethod
    def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem

    # ---- inputs -------------------------------------------------------------------------------------------
    def _slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _to_device(self, x: list | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=dtype)
        return t.to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Run every token of each sequence from position 0; logits [B, V] at each last token."""
        lens = [len(s) for s in seqs]
        ids = [t for s in seqs for t in s.token_ids]
        positions = np.concatenate([np.arange(n) for n in lens])
        bs = self.block_size
        slots = np.concatenate(
            [
                np.asarray(s.block_table, dtype=np.int64).repeat(bs)[:n] * bs + np.arange(n) % bs
                for s, n in zip(seqs, lens)
            ]
        )
        pad_index = unpad_index = None
        t = max(lens)
        if any(n != t for n in lens):
            starts = np.cumsum([0] + lens[:-1])
            ar = np.arange(t)
            pad = np.where(ar[None, :] < np.asarray(lens)[:, None], starts[:, None] + ar[None, :], 0)
            unpad = np.concatenate([i * t + np.arange(n) for i, n in enumerate(lens)])
            pad_index, unpad_index = self._to_device(pad, torch.int64), self._to_device(unpad, torch.int64)
        ctx = AttentionContext(
            is_prefill=True,
            slot_mapping=self._to_device(slots, torch.int64),
            seq_lens=lens,
            pad_index=pad_index,
            unpad_index=unpad_index,
        )
        pos = self._to_device(positions, torch.int64)
        hidden = self.model(
            self._to_device(ids, torch.int64), self.cos_sin[pos], self.k_cache, self.v_cache, ctx
        )
        last = self._to_device(np.cumsum(lens) - 1, torch.int64)
        for s in seqs:
            s.num_cached = len(s)
        return self.model.logits(hidden[last])

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token per sequence (its last, not yet cached); logits [B, V]."""
        bsz = len(seqs)
        graph_bs = self._graph_size(bsz)
        rows = graph_bs or bsz
        ids = np.zeros(rows, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        slots = np.full(rows, self.scratch_block * self.block_size, dtype=np.int64)
        lens = np.ones(rows, dtype=np.int32)
        table = (
            self._table
            if rows <= self.max_num_seqs
            else np.full((rows, self.max_blocks), self.scratch_block, np.int32)
        )
        max_len = 0
        for i, s in enumerate(seqs):
            n = len(s)
            ids[i], positions[i], lens[i] = s.token_ids[-1], n - 1, n
            slots[i] = self._slot(s, n - 1)
            table[i, : len(s.block_table)] = s.block_table
            max_len = max(max_len, n)
        width = self.max_blocks if graph_bs else -(-max_len // self.block_size)
        block_tables = self._to_device(table[:rows, :width].copy(), torch.int32)
        table[:bsz, :] = self.scratch_block
        for s in seqs:
            s.num_cached = len(s)
        if graph_bs:
            return self._replay(graph_bs, ids, positions, slots, block_tables, lens)[:bsz]
        ctx = AttentionContext(
            is_prefill=False,
            slot_mapping=self._to_device(slots, torch.int64),
            block_tables=block_tables,
            context_lens=self._to_device(lens, torch.int32),
            max_context_len=max_len,
            use_triton=self.use_triton,
        )
        pos = self._to_device(positions, torch.int64)
        hidden = self.model(
            self._to_device(ids, torch.int64), self.cos_sin[pos], self.k_cache, self.v_cache, ctx
        )
        return self.model.logits(hidden)

    # ---- CUDA graphs --------------------------------------------------------------------------------------
    def _graph_size(self, bsz: int) -> int:
        if not self.graphs:
            return 0
        return next((b for b in sorted(self.graphs) if b >= bsz), 0)

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Capture decode for padded batch sizes up to max_num_seqs; launch overhead then vanishes."""
        if not (self.use_cuda_graphs and self.use_triton):
            return
        sizes = [b for b in GRAPH_BATCH_SIZES if b < self.max_num_seqs] + [self.max_num_seqs]
        n = max(sizes)
        self.static = {
            "ids": torch.zeros(n, dtype=torch.int64, device=self.device),
            "pos": torch.zeros(n, dtype=torch.int64, device=self.device),
            "slots": torch.full(
                (n,), self.scratch_block * self.block_size, dtype=torch.int64, device=self.device
            ),
            "tables": torch.full(
                (n, self.max_blocks), self.scratch_block, dtype=torch.int32, device=self.device
            ),
            "lens": torch.ones(n, dtype=torch.int32, device=self.device),
        }
        st = self.static
        pool = None
        for b in sorted(sizes, reverse=True):
            ctx = AttentionContext(
                is_prefill=False,
                slot_mapping=st["slots"][:b],
                block_tables=st["tables"][:b],
                context_lens=st["lens"][:b],
                use_triton=True,
            )

            def run(b=b, ctx=ctx):
                h = self.model(st["ids"][:b], self.cos_sin[st["pos"][:b]], self.k_cache, self.v_cache, ctx)
                return self.model.logits(h)

            run()  # warm up (Triton compile, cuBLAS handles) outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = run()
            pool = graph.pool()
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize()

    def _replay(self, b, ids, positions, slots, block_tables, lens) -> torch.Tensor:
        st = self.static
        st["ids"][:b].copy_(torch.from_numpy(ids), non_blocking=True)
        st["pos"][:b].copy_(torch.from_numpy(positions), non_blocking=True)
        st["slots"][:b].copy_(torch.from_numpy(slots), non_blocking=True)
        st["lens"][:b].copy_(torch.from_numpy(lens), non_blocking=True)
        st["tables"][:b].copy_(block_tables, non_blocking=True)
        graph, out = self.graphs[b]
        graph.replay()
        return out
