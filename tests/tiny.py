"""The suite's one builder of tiny random Llama models: the shape most tests share, and each test's own
differences passed as `LlamaConfig` fields. The seed is set before the weights are drawn, so a test's model is
the same on every run."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_llama(vocab_size: int, seed: int = 0, eager: bool = False, **fields) -> LlamaForCausalLM:
    """A random Llama of `vocab_size` tokens: `SHAPE`, with `fields` over it. `eager`: plain attention (the
    tests that compare against the engine token by token)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, **{**SHAPE, **fields})
    if eager:
        cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg)
