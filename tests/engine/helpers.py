"""Tiny random models of each supported family, built from transformers configs."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from laminar.engine import Engine, ModelConfig

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=1,
    initializer_range=0.2,
)


def hf_config(family: str, tied: bool = True):
    if family == "llama":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 500000.0,
        }
        return LlamaConfig(**COMMON, tie_word_embeddings=tied, rope_parameters=rope)
    if family == "qwen2":
        return Qwen2Config(**COMMON, tie_word_embeddings=tied)
    if family == "qwen3":
        return Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=tied)
    raise ValueError(family)


def hf_model(family: str, tied: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    cfg = hf_config(family, tied)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random biases and norms too, so a missed bias or norm shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def engine_for(model, **kw) -> Engine:
    kw.setdefault("max_model_len", 256)
    return Engine(ModelConfig.from_hf(model.config), weights=model.state_dict(), **kw)


def drain(engine) -> dict:
    """Step until every request has finished; the finished requests by id."""
    done = {}
    while engine.has_unfinished():
        for f in engine.step().finished:
            done[f.request_id] = f
    return done
