"""Elementwise pieces of a decoder layer, each fused into one kernel by torch.compile on CUDA.

In a decode step the matrix products are few and large; what else costs time is the count of tiny kernels
(RMSNorm alone is eight in eager mode). Even inside a CUDA graph each costs a few microseconds, about 3 ms per
step for 24 layers, so on CUDA these run compiled. CPU keeps eager mode (no compiler needed there); if compiling
fails, the eager versions are used and a warning says so.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # HF's order: normalise in float32, cast back, then scale in the model dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add and the next norm in one pass."""
    s = x + residual
    return rms_norm(s, weight, eps), s


def rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, head_dim]; cos_sin: [N, head_dim] float32. Same math as HF's rotate_half form."""
    half = x.shape[-1] // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def split_rope(
    qkv: torch.Tensor, cos_sin: torch.Tensor, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection's output [N, (heads + 2 kv_heads) * head_dim] -> q, k (both rotated) and v, as
    [N, heads or kv_heads, head_dim]. On CUDA the engine uses `paged_attention.rope_store` instead, which also
    writes the cache; this is the CPU path and the reference that kernel is checked against."""
    n, dim = qkv.shape[0], cos_sin.shape[-1]
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return (
        rope(q.view(n, heads, dim), cos_sin),
        rope(k.view(n, kv_heads, dim), cos_sin),
        v.view(n, kv_heads, dim),
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: the fused gate/up projection's halves, silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


EAGER = {f.__name__: f for f in (rms_norm, add_rms_norm, rope, split_rope, silu_mul)}


class Fused:
    """The functions above, compiled or eager; one instance per model runner."""

    def __init__(self, compile: bool):
        self._use(EAGER)
        if compile:
            try:
                self._use(
                    {name: torch.compile(fn, dynamic=True, fullgraph=True) for name, fn in EAGER.items()}
                )
            except Exception as e:  # noqa: BLE001 - any compiler failure means: run eager
                warnings.warn(
                    f"torch.compile unavailable ({e}); decode runs eager elementwise kernels", stacklevel=2
                )
                self._use(EAGER)

    def _use(self, fns: dict) -> None:
        for name, fn in fns.items():
            setattr(self, name, fn)

    def warm_up(
        self, device: torch.device, dtype: torch.dtype, hidden: int, heads: int, kv_heads: int, head_dim: int
    ) -> None:
        """Compile now, with shapes that differ from any graph batch, so capture sees finished kernels.

        If the compiler fails here, fall back to eager for good.
        """
        try:
            for n in (3, 5):
                x = torch.randn(n, hidden, device=device, dtype=dtype)
                w = torch.ones(hidden, device=device, dtype=dtype)
                cos_sin = torch.randn(n, head_dim, device=device)
                self.rms_norm(x, w, 1e-6)
                self.add_rms_norm(x, x, w, 1e-6)
                self.rms_norm(torch.randn(n, heads, head_dim, device=device, dtype=dtype), w[:head_dim], 1e-6)
                self.rope(torch.randn(n, heads, head_dim, device=device, dtype=dtype), cos_sin)
                qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, device=device, dtype=dtype)
                self.split_rope(qkv, cos_sin, heads, kv_heads)
                self.silu_mul(torch.cat([x, x], dim=-1))
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"torch.compile failed ({type(e).__name__}: {e}); decode runs eager", stacklevel=2)
            self._use(EAGER)
