"""SwiGLU's first half in one kernel for decode batches: silu(x @ gate^T) * (x @ up^T) with no [M, 2I] product
written in between.

A decode step's MLP was a matrix product into [M, 2 x intermediate], then an elementwise kernel reading it back;
here each program streams its rows of the gate and up weights, multiplies them with the batch's activations,
and writes only the gated result. The rounding follows the unfused path: the two products rounded to the model
dtype, silu rounded, then the product. Triton is optional: CPU machines need none.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only install
    triton = None

# (block_n, block_k, warps, stages, swap_ab): the tile each program streams, from the sweep in
# results/engine-step/gate-up (H100, one CUDA graph of every layer): a wide intermediate (Qwen2.5-7B, 18,944)
# has programs enough with 32 columns each; a narrow one (Qwen2.5-0.5B, 4,864) takes 64 with 8 warps
WIDE = (32, 128, 4, 4, False)
NARROW = (64, 64, 8, 4, True)
WIDE_FROM = 8192  # intermediate sizes from this one on take WIDE
MAX_ROWS = 128  # batches up to this many rows use the kernel (measured up to 128; at 256 rows the product and
# a separate SiLU were faster); larger ones, prefill among them, use the product
MAX_BLOCK_M = 128  # batch rows a program takes (larger batches: more programs, each weight tile read again)
ENABLED = True  # off: the product and a separate SiLU (how results/engine-step/gate-up measures both)


def supported(hidden: int, intermediate: int) -> bool:
    return triton is not None and hidden % 64 == 0 and intermediate % 16 == 0


if triton is not None:

    @triton.jit
    def _gate_up_silu_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        rows,
        stride_x,
        stride_w,
        stride_o,
        INTER: tl.constexpr,
        K: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SWAP_AB: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """One program: BLOCK_N columns of the output for BLOCK_M rows of the batch. The gate's weight rows are
        0..INTER-1 of `w`, the up's INTER..2 INTER-1 (the fused layout of `model.fuse`). With SWAP_AB the weights
        are the products' left operand (weight rows fill the tensor cores' long side, the few batch rows the
        short one)."""
        pid = tl.program_id(0)
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < rows
        nmask = offs_n < INTER
        x_ptrs = x_ptr + offs_m[:, None] * stride_x + offs_k[None, :]
        g_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :]
        u_ptrs = g_ptrs + INTER * stride_w
        if SWAP_AB:
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        else:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for _ in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
            g = tl.load(g_ptrs, mask=nmask[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=nmask[:, None], other=0.0)
            if SWAP_AB:
                if IEEE:
                    acc_g = tl.dot(g, tl.trans(x), acc_g, input_precision="ieee")
                    acc_u = tl.dot(u, tl.trans(x), acc_u, input_precision="ieee")
                else:
                    acc_g = tl.dot(g, tl.trans(x), acc_g)
                    acc_u = tl.dot(u, tl.trans(x), acc_u)
            else:
                if IEEE:
                    acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision="ieee")
                    acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision="ieee")
                else:
                    acc_g = tl.dot(x, tl.trans(g), acc_g)
                    acc_u = tl.dot(x, tl.trans(u), acc_u)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        dtype = out_ptr.dtype.element_ty
        gate = acc_g.to(dtype).to(tl.float32)
        up = acc_u.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        out = (act * up).to(dtype)
        if SWAP_AB:
            ptrs = out_ptr + offs_m[None, :] * stride_o + offs_n[:, None]
            tl.store(ptrs, out, mask=mmask[None, :] & nmask[:, None])
        else:
            ptrs = out_ptr + offs_m[:, None] * stride_o + offs_n[None, :]
            tl.store(ptrs, out, mask=mmask[:, None] & nmask[None, :])


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """x [M, K]; weight [2 I, K], the gate's rows then the up's -> silu(x gate^T) * (x up^T), [M, I]."""
    if triton is None:
        raise RuntimeError("gate_up_silu needs Triton (installed with CUDA builds of torch)")
    rows, k = x.shape
    inter = weight.shape[0] // 2
    block_n, block_k, warps, stages, swap = config or (WIDE if inter >= WIDE_FROM else NARROW)
    block_k //= x.element_size() // 2  # float32 tiles: as many bytes as bf16's, within shared memory
    while k % block_k:
        block_k //= 2
    assert x.stride(-1) == 1 and weight.stride(-1) == 1 and weight.shape[1] == k
    out = torch.empty(rows, inter, device=x.device, dtype=x.dtype)
    if rows:
        block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
        _gate_up_silu_kernel[(triton.cdiv(inter, block_n), triton.cdiv(rows, block_m))](
            x,
            weight,
            out,
            rows,
            x.stride(0),
            weight.stride(0),
            out.stride(0),
            INTER=inter,
            K=k,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            SWAP_AB=swap,
            IEEE=x.dtype == torch.float32,
            num_warps=warps,
            num_stages=stages,
        )
    return out
