"""Paged decode attention in Triton: each program walks one sequence's KV blocks in place for one KV head.

All query heads of a GQA group share the program, so each key/value row is read once from memory; no padded
copy of the cache is ever made. Imported lazily: CPU machines need no Triton.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only install
    triton = None


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        table_ptr,
        lens_ptr,
        out_ptr,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_tb,
        stride_ob,
        stride_oh,
        scale_log2,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        ctx_len = tl.load(lens_ptr + b)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)
        gmask = offs_g < GROUP
        heads = kvh * GROUP + offs_g
        q = tl.load(
            q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=gmask[:, None],
            other=0.0,
        )
        m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        denom = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
        for start in range(0, ctx_len, BLOCK_N):
            tok = start + offs_n
            nmask = tok < ctx_len
            blk = tl.load(table_ptr + b * stride_tb + tok // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
            row = blk * stride_kb + (tok % BLOCK_SIZE) * stride_kt + kvh * stride_kh
            k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=nmask[:, None], other=0.0)
            # the values' load is issued with the keys', so its latency runs under the scores' math
            v = tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(nmask[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            denom = denom * alpha + tl.sum(p, 1)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        out = acc / denom[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=gmask[:, None],
        )


DECODE_BLOCK_N = 128  # context tokens a program reads per iteration (results/engine-step: 128 and 8 warps)
DECODE_WARPS = 8
DECODE_STAGES = 2


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """q: [B, H, D]; caches [num_blocks, block_size, KV, D]; block_tables [B, W] int32; context_lens [B] int32."""
    if triton is None:
        raise RuntimeError(
            "paged_decode needs Triton (installed with CUDA builds of torch); use the CPU gather path"
        )
    bsz, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and q.stride(-1) == 1
    _paged_decode_kernel[(bsz, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        (dim**-0.5) * 1.4426950408889634,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n or DECODE_BLOCK_N,
        IEEE=q.dtype == torch.float32,
        num_warps=num_warps or DECODE_WARPS,
        num_stages=num_stages or DECODE_STAGES,
    )
    return out


if triton is not None:

    @triton.jit
    def _rope_store_kernel(
        qkv_ptr,
        cos_sin_ptr,
        slot_ptr,
        q_out_ptr,
        k_out_ptr,
        k_cache_ptr,
        v_cache_ptr,
        stride_qkv,
        stride_cs,
        HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        HALF: tl.constexpr,
    ):
        """One token, one head: rotate a query head into q_out, or a key head into k_out and the key cache, and
        copy its value head into the value cache. The rotation is `fused.rope`'s, in float32."""
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        dim = 2 * HALF
        offs = tl.arange(0, HALF)
        cos = tl.load(cos_sin_ptr + n * stride_cs + offs)
        sin = tl.load(cos_sin_ptr + n * stride_cs + HALF + offs)
        row = qkv_ptr + n * stride_qkv + h * dim
        x1 = tl.load(row + offs).to(tl.float32)
        x2 = tl.load(row + HALF + offs).to(tl.float32)
        dtype = q_out_ptr.dtype.element_ty
        r1 = (x1 * cos - x2 * sin).to(dtype)
        r2 = (x2 * cos + x1 * sin).to(dtype)
        if h < HEADS:
            out = q_out_ptr + (n * HEADS + h) * dim
            tl.store(out + offs, r1)
            tl.store(out + HALF + offs, r2)
        else:
            kvh = h - HEADS
            out = k_out_ptr + (n * KV_HEADS + kvh) * dim
            tl.store(out + offs, r1)
            tl.store(out + HALF + offs, r2)
            slot = tl.load(slot_ptr + n)
            cache = (slot * KV_HEADS + kvh) * dim
            tl.store(k_cache_ptr + cache + offs, r1)
            tl.store(k_cache_ptr + cache + HALF + offs, r2)
            v = row + KV_HEADS * dim  # this head's value, KV_HEADS heads further along the row
            tl.store(v_cache_ptr + cache + offs, tl.load(v + offs))
            tl.store(v_cache_ptr + cache + HALF + offs, tl.load(v + HALF + offs))


def rope_store_supported(head_dim: int) -> bool:
    """The fused rotation-and-store kernel needs Triton and a power-of-two head dimension."""
    return triton is not None and head_dim >= 2 and head_dim & (head_dim - 1) == 0


def rope_store(
    qkv: torch.Tensor,
    cos_sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused.split_rope` and `attention.store_kv` in one kernel (four kernels a layer before): q and k rotated,
    k and v written into their cache slots. qkv [N, (heads + 2 kv_heads) * D]; cos_sin [N, D] float32; caches
    [num_blocks, block_size, kv_heads, D], contiguous. Returns q [N, heads, D], k [N, kv_heads, D] (rotated)
    and v (a view of qkv)."""
    n, dim = qkv.shape[0], cos_sin.shape[-1]
    assert qkv.stride(-1) == 1 and cos_sin.stride(-1) == 1 and cos_sin.dtype == torch.float32
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[-2:] == (kv_heads, dim)
    q = torch.empty(n, heads, dim, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(n, kv_heads, dim, device=qkv.device, dtype=qkv.dtype)
    if n:
        _rope_store_kernel[(n, heads + kv_heads)](
            qkv,
            cos_sin,
            slot_mapping,
            q,
            k,
            k_cache,
            v_cache,
            qkv.stride(0),
            cos_sin.stride(0),
            HEADS=heads,
            KV_HEADS=kv_heads,
            HALF=dim // 2,
            num_warps=1,
        )
    v = qkv[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim)
    return q, k, v
