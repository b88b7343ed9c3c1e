"""Rotary position embedding tables as the config says (default, linear, llama3, yarn); applied in fused.py."""

from __future__ import annotations

import math
from typing import Any

import torch


def inv_freq_and_scale(
    params: dict[str, Any], head_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale, following transformers' `modeling_rope_utils`."""
    kind = params.get("rope_type", "default")
    base = float(params.get("rope_theta", 10000.0))
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if dim != head_dim:
        raise ValueError(
            f"partial_rotary_factor={params['partial_rotary_factor']} is not supported; expected 1.0"
        )
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "llama3":
        factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) * ~(wavelen > old_len / lo)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(params, base, dim, max_position_embeddings)
    raise ValueError(
        f"rope_type={kind!r} is not supported; the engine implements 'default', 'linear', 'llama3' and 'yarn'"
    )


def _yarn(params: dict[str, Any], base: float, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    orig = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor") or max_pos / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = params.get("attention_factor")
    if attn is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def corr(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = corr(fast), corr(slow)
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, float(attn)


def cos_sin_table(
    params: dict[str, Any], head_dim: int, max_position_embeddings: int, length: int
) -> torch.Tensor:
    """[length, head_dim] float32: cos in the first half, sin in the second (each half-width, HF's layout)."""
    inv_freq, scale = inv_freq_and_scale(params, head_dim, max_position_embeddings)
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)
