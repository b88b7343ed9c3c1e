"""Attention over the paged KV cache: one context per forward pass, prefill and decode paths.

A prefill usually starts at position 0 (preempted and imported requests recompute), and its attention needs only
the step's own keys and values; the cache is written for later decode steps. A request resumed after a tool call
keeps its cached prefix and prefills only what came after it (`context_starts`): its queries read the prefix
from the cache, gathered by block table as decode does on CPU. Decode reads the cache
through each sequence's block table: on CUDA with a Triton kernel that walks the blocks in place, on CPU by
gathering the blocks (cheap there, and it keeps the CPU path dependency-free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from laminar.engine import paged_attention


@dataclass
class AttentionContext:
    """Tensors that say where this step's tokens come from and go to; built by the model runner."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [N] int64: flat KV slot (block * block_size + offset) of each token
    # prefill: tokens are sequences laid end to end; `pad_index` [B, T] gathers them into a right-padded batch
    # (None when all have the same length), `unpad_index` [N] gathers them back.
    seq_lens: list[int] | None = None
    pad_index: torch.Tensor | None = None
    unpad_index: torch.Tensor | None = None
    # decode: one token per sequence
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32
    context_lens: torch.Tensor | None = None  # [B] int32, including this step's token
    max_context_len: int = 0  # CPU gather width; ignored by the CUDA kernel
    use_triton: bool = False
    # prefill after a cached prefix: where each sequence's new tokens start (None: every one starts at 0);
    # `block_tables` and `max_context_len` then cover the whole sequences
    context_starts: list[int] | None = None
    extend_mask: torch.Tensor | None = None  # built by the first layer's extend_attention, reused by the rest


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext
):
    """Write this step's keys/values into their slots; caches are [num_blocks, block_size, kv_heads, head_dim]."""
    kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, v)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
) -> torch.Tensor:
    """Causal attention within each sequence. q: [N, H, D]; k, v: [N, KV, D] -> [N, H, D].

    Right padding is safe under a causal mask: padded keys come after every real query.
    """
    assert ctx.seq_lens is not None
    if ctx.context_starts is not None:
        raise ValueError("prefill after a cached prefix reads the cache: use extend_attention")
    b, t = len(ctx.seq_lens), max(ctx.seq_lens)
    if ctx.pad_index is None:
        qb, kb, vb = (x.view(b, t, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
    else:
        qb, kb, vb = (x[ctx.pad_index].transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
    out = out.transpose(1, 2)  # [B, T, H, D]
    if ctx.unpad_index is None:
        return out.reshape(-1, *out.shape[2:])
    return out.reshape(b * t, *out.shape[2:])[ctx.unpad_index]


def extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext
) -> torch.Tensor:
    """Prefill of tokens that follow a cached prefix (this step's keys are already stored). q: [N, H, D], the
    new tokens laid end to end; query i of a sequence sits at position start + i and sees keys 0..start + i."""
    assert ctx.seq_lens is not None and ctx.context_starts is not None and ctx.block_tables is not None
    b, t = len(ctx.seq_lens), max(ctx.seq_lens)
    heads, dim = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    nblocks = -(-ctx.max_context_len // block_size)
    table = ctx.block_tables[:, :nblocks].long()
    width = nblocks * block_size
    k = k_cache[table].view(b, width, kv_heads, dim).transpose(1, 2)
    v = v_cache[table].view(b, width, kv_heads, dim).transpose(1, 2)
    qb = (q.view(b, t, heads, dim) if ctx.pad_index is None else q[ctx.pad_index]).transpose(1, 2)
    if ctx.extend_mask is None:  # the same for every layer of this forward
        starts = torch.tensor(ctx.context_starts, device=q.device)
        lens = torch.tensor(ctx.seq_lens, device=q.device)
        rows = torch.arange(t, device=q.device)
        keys = torch.arange(width, device=q.device)
        mask = (
            keys[None, None, :] <= (starts[:, None] + rows[None, :])[:, :, None]
        )  # causal, after each prefix
        mask |= (rows[None, :] >= lens[:, None])[:, :, None] & (keys == 0)  # padding rows see one key
        ctx.extend_mask = mask[:, None]
    out = F.scaled_dot_product_attention(qb, k, v, attn_mask=ctx.extend_mask, enable_gqa=True).transpose(1, 2)
    if ctx.unpad_index is None:
        return out.reshape(-1, heads, dim)
    return out.reshape(b * t, heads, dim)[ctx.unpad_index]


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext
) -> torch.Tensor:
    """One query per sequence against its cached context. q: [B, H, D] -> [B, H, D]."""
    assert ctx.block_tables is not None and ctx.context_lens is not None
    if ctx.use_triton:
        return paged_attention.paged_decode(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens)
    return gather_decode(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, ctx.max_context_len)


def gather_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
) -> torch.Tensor:
    """Reference and CPU path: gather each sequence's blocks into a padded batch and mask the tail."""
    bsz, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    nblocks = -(-max_context_len // block_size)
    table = block_tables[:, :nblocks].long()
    k = k_cache[table].view(bsz, nblocks * block_size, kv_heads, dim).transpose(1, 2)
    v = v_cache[table].view(bsz, nblocks * block_size, kv_heads, dim).transpose(1, 2)
    mask = torch.arange(nblocks * block_size, device=q.device)[None, :] < context_lens[:, None]
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :], enable_gqa=True
    )
    return out[:, :, 0, :]
