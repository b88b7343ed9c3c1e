"""Sequences packed without padding: a micro-batch is one row of all its sequences back to back, each with its
own positions, and attention stays inside each sequence (variable-length attention over cumulative lengths,
through the model's attention interface). A row of padding costs the same as a row of tokens, and with the long
tails of RL responses (p99 ten times the median) padding is about half of a padded micro-batch.

On CUDA the attention is PyTorch's variable-length flash attention (`torch.nn.attention.varlen`); elsewhere,
or where that is missing, each sequence's causal attention is computed on its own (the same numbers, slower).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION = "laminar_packed"


def _varlen() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _flash(q, k, v, cu, max_len, scale):  # noqa: ANN001 - tensors
    """Causal variable-length flash attention, whichever way this PyTorch spells causal and scale."""
    fn = _varlen()
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    if "is_causal" in params:
        kw["is_causal"] = True
    else:
        kw["window_size"] = (-1, 0)
    if "scale" in params:
        kw["scale"] = scale
    return fn(q, k, v, cu, cu, max_len, max_len, **kw)


def _per_sequence(q, k, v, cu, scale):  # noqa: ANN001 - tensors
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        out[s:e] = F.scaled_dot_product_attention(
            q[s:e].transpose(0, 1),
            k[s:e].transpose(0, 1),
            v[s:e].transpose(0, 1),
            is_causal=True,
            scale=scale,
        ).transpose(0, 1)
    return out


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ANN001
    """The attention interface's signature: query [1, Hq, T, D], key and value [1, Hkv, T, D]; returns
    ([1, T, Hq, D], None). `cu_seq_lens_q` and `max_length_q` come from the forward call's keyword arguments."""
    cu, max_len = kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"])
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, H, D]
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if q.is_cuda and torch.is_autocast_enabled("cuda"):  # RoPE in fp32 leaves q and k fp32 under autocast
        low = torch.get_autocast_dtype("cuda")
        q, k, v = q.to(low), k.to(low), v.to(low)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(q.shape[-1])
    flash = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _varlen() is not None
    if flash and "scale" not in inspect.signature(_varlen()).parameters:
        flash = math.isclose(scale, 1.0 / math.sqrt(q.shape[-1]))
    out = _flash(q, k, v, cu, max_len, scale) if flash else _per_sequence(q, k, v, cu, scale)
    return out[None], None


def register() -> None:
    """Make `ATTENTION` a name Hugging Face models accept (idempotent). It has no mask function on purpose: the
    model then builds no [T, T] mask, and the attention reads the cumulative lengths instead."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention)


def supports_packing(model: Any) -> bool:
    """Models written against the attention interface (Llama, Qwen2, Mistral, Gemma, ...) can be packed."""
    return bool(getattr(model, "_supports_attention_backend", False))


def use_packed_attention(model: Any) -> None:
    register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
    else:
        model.config._attn_implementation = ATTENTION
