"""Real models' shapes (`SHAPES`, Hugging Face config fields), for throughput runs with random weights: the
benches build engines and trainers of these shapes, and `laminar.bench.random_model` writes one as a model
directory."""

from __future__ import annotations

from typing import Any

from laminar.engine.config import ModelConfig

# Real models' shapes (Hugging Face config fields), for throughput runs with random weights.
SHAPES = {
    "smollm2-135m": dict(  # Llama architecture
        architecture="llama",
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-14b": dict(
        hidden_size=5120,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=13824,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-32b": dict(
        hidden_size=5120,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=27648,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
        vocab_size=8192,
        tie_word_embeddings=True,
    ),
}


def shape_config(shape: str, **extra: Any) -> Any:
    """The Hugging Face config of a named shape (Qwen2 unless the shape says otherwise)."""
    from transformers import LlamaConfig, Qwen2Config

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    fields = dict(SHAPES[shape])
    kind = LlamaConfig if fields.pop("architecture", "qwen2") == "llama" else Qwen2Config
    return kind(**fields, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6, **extra)


def model_config(shape: str) -> ModelConfig:
    """The engine's config of a named shape, without transformers (a GPU machine may have only torch): the same
    fields `shape_config` gives Hugging Face, read by `ModelConfig.from_hf`."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    fields = dict(SHAPES[shape])
    kind = fields.pop("architecture", "qwen2")
    return ModelConfig.from_hf(
        {
            **fields,
            "model_type": kind,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
        }
    )
