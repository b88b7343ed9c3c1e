"""A random-initialised Hugging Face model directory of a named shape (`SHAPES`), with the
task tokenizer, so `laminar train` and `laminar bench schedules` can run a full-size model on a machine with no
internet. Its outputs are noise: only for speed (the `lengths` workload ignores what the model says).

    python -m laminar.engine.random_model --shape qwen2.5-0.5b --out runs/models/qwen0.5b-random
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

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


def write_random_model(shape: str, out: str | Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Saves config, safetensors, generation config and the task tokenizer; returns the directory."""
    from transformers import AutoModelForCausalLM

    from laminar.data.tasks import TaskCodec, save_model_dir

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    codec = TaskCodec()
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = shape_config(shape, bos_token_id=codec.bos_id, eos_token_id=codec.eos_id, pad_token_id=codec.pad_id)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    out = save_model_dir(model, codec, out)
    info = {
        "shape": shape,
        "random_init": True,
        "seed": seed,
        "dtype": dtype,
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "random_model.json").write_text(json.dumps(info, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m laminar.engine.random_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args(argv)
    path = write_random_model(args.shape, args.out, args.seed, args.dtype)
    print(json.loads((path / "random_model.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
