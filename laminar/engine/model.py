"""The Llama-family network (Llama, Qwen2, Qwen3) over flat token batches and a paged KV cache.

Module and parameter names are Hugging Face's, so `state_dict()` of a transformers model (or of the trainer)
loads here by name with no mapping table. Under tensor parallelism (`tensor_parallel.py`) the network is built
with one rank's shape (its heads and MLP columns) and `tp` set: o_proj and down_proj then sum over the ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from laminar.engine import gate_up
from laminar.engine.attention import (
    AttentionContext,
    decode_attention,
    extend_attention,
    prefill_attention,
    store_kv,
)
from laminar.engine.config import ModelConfig
from laminar.engine.fused import Fused
from laminar.engine.paged_attention import rope_store, rope_store_supported

if TYPE_CHECKING:
    from laminar.engine.tensor_parallel import TPGroup


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, fused: Fused):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.fused = eps, fused

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """rms_norm(x), or with a residual: (rms_norm(x + residual), x + residual)."""
        if residual is None:
            return self.fused.rms_norm(x, self.weight, self.eps)
        return self.fused.add_rms_norm(x, residual, self.weight, self.eps)


def fuse(module: nn.Module, name: str, *linears: nn.Linear) -> None:
    """Stack the rows of `linears` into one weight (and bias), `module.<name>_weight`, and make their parameters
    views of it: a Hugging Face tensor loaded into `q_proj.weight` lands in the fused weight, names stay
    Hugging Face's, and one matrix product replaces several (a small model's decode step is bound by its
    kernel count)."""
    for part in ("weight", "bias"):
        tensors = [getattr(lin, part) for lin in linears]
        if any(t is None for t in tensors):
            module.register_buffer(f"{name}_{part}", None, persistent=False)
            continue
        stacked = torch.cat([t.detach() for t in tensors])
        module.register_buffer(f"{name}_{part}", stacked, persistent=False)
        for lin, view in zip(linears, stacked.split([t.shape[0] for t in tensors])):
            setattr(lin, part, nn.Parameter(view, requires_grad=False))


def row_parallel(linear: nn.Linear, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Megatron's row-parallel product: this rank's input columns times its weight columns, summed over the
    ranks; the bias (whole on every rank) added once, after the sum."""
    y = tp.all_reduce(F.linear(x, linear.weight))
    return y if linear.bias is None else y + linear.bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: Fused, tp: TPGroup | None = None):
        super().__init__()
        self.fused, self.tp = fused, tp
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        fuse(self, "qkv", self.q_proj, self.k_proj, self.v_proj)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, fused)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, fused)
        self.qk_norm = cfg.qk_norm
        self.rope_store = rope_store_supported(cfg.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        if self.qk_norm:  # Qwen3: each head normalised before its rotation
            q, k, v = qkv.split([self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2], dim=-1)
            q = self.q_norm(q.reshape(n, self.heads, self.head_dim))
            k = self.k_norm(k.reshape(n, self.kv_heads, self.head_dim))
            q, k, v = (
                self.fused.rope(q, cos_sin),
                self.fused.rope(k, cos_sin),
                v.reshape(n, self.kv_heads, -1),
            )
            store_kv(k, v, k_cache, v_cache, ctx)
        elif self.rope_store and qkv.is_cuda:  # rotation and the cache store in one kernel
            q, k, v = rope_store(qkv, cos_sin, ctx.slot_mapping, k_cache, v_cache, self.heads, self.kv_heads)
        else:
            q, k, v = self.fused.split_rope(qkv, cos_sin, self.heads, self.kv_heads)
            store_kv(k, v, k_cache, v_cache, ctx)
        if ctx.is_prefill and ctx.context_starts is not None:
            out = extend_attention(q, k_cache, v_cache, ctx)
        elif ctx.is_prefill:
            out = prefill_attention(q, k, v, ctx)
        else:
            out = decode_attention(q, k_cache, v_cache, ctx)
        out = out.reshape(n, -1)
        return self.o_proj(out) if self.tp is None else row_parallel(self.o_proj, out, self.tp)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: Fused, tp: TPGroup | None = None):
        super().__init__()
        self.fused, self.tp = fused, tp
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        fuse(self, "gate_up", self.gate_proj, self.up_proj)
        self.gate_up_kernel = gate_up.supported(cfg.hidden_size, cfg.intermediate_size) and not cfg.mlp_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_kernel and gate_up.ENABLED and x.is_cuda and x.shape[0] <= gate_up.MAX_ROWS:
            h = gate_up.gate_up_silu(x, self.gate_up_weight)  # one kernel, no [N, 2I]
        else:
            h = self.fused.silu_mul(F.linear(x, self.gate_up_weight, self.gate_up_bias))
        return self.down_proj(h) if self.tp is None else row_parallel(self.down_proj, h, self.tp)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: Fused, tp: TPGroup | None = None):
        super().__init__()
        self.self_attn = Attention(cfg, fused, tp)
        self.mlp = MLP(cfg, fused, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)

    def forward(self, x, residual, cos_sin, k_cache, v_cache, ctx: AttentionContext):
        """Returns (mlp output, residual stream before it); the next norm adds the two (one fused pass)."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(
            self.self_attn(h, cos_sin, k_cache, v_cache, ctx), residual
        )
        return self.mlp(h), residual


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: Fused, tp: TPGroup | None = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, fused, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)


class CausalLM(nn.Module):
    """`model.*` and `lm_head.weight` as in transformers; `lm_head` shares the embedding when tied. `cfg` is one
    rank's shape (`tensor_parallel.local_config`) when `tp` is set."""

    def __init__(self, cfg: ModelConfig, fused: Fused | None = None, tp: TPGroup | None = None):
        super().__init__()
        self.config = cfg
        self.fused = fused or Fused(compile=False)
        self.model = Backbone(cfg, self.fused, tp)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        cos_sin: torch.Tensor,
        k_caches: torch.Tensor,
        v_caches: torch.Tensor,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        """input_ids [N], cos_sin [N, head_dim] (rows for each token's position) -> final hidden states [N, H]."""
        x, residual = self.model.embed_tokens(input_ids), None
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, cos_sin, k_caches[i], v_caches[i], ctx)
        return self.model.norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
