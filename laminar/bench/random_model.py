"""A random-initialised Hugging Face model directory of a named shape (`laminar.engine.random_model.SHAPES`), with
the task tokenizer, so `laminar train` and `laminar bench schedules` can run a full-size model on a machine with
no internet. Its outputs are noise: only for speed (the `lengths` workload ignores what the model says).

    python -m laminar.bench.random_model --shape qwen2.5-0.5b --out runs/models/qwen0.5b-random
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from laminar.data.codec import save_model_dir
from laminar.engine.random_model import SHAPES, shape_config
from laminar.tasks.reverse import demo_codec


def write_random_model(
    shape: str, out: str | Path, seed: int = 0, dtype: str = "bfloat16", device: str = "auto"
) -> Path:
    """Saves config, safetensors, generation config and the task tokenizer; returns the directory. The weights
    are drawn on `device` ("auto": CUDA when there is one): drawing a 14B model's on the CPU took 495 s of
    a 64-core host."""
    from transformers import AutoModelForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {sorted(SHAPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    codec = demo_codec()
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = shape_config(shape, bos_token_id=codec.bos_id, eos_token_id=codec.eos_id, pad_token_id=codec.pad_id)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    out = save_model_dir(model, codec, out)
    info = {
        "shape": shape,
        "random_init": True,
        "seed": seed,
        "dtype": dtype,
        "device": device,
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "random_model.json").write_text(json.dumps(info, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m laminar.bench.random_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--device", default="auto", help="where the weights are drawn: auto (CUDA when there is one)"
    )
    args = ap.parse_args(argv)
    path = write_random_model(args.shape, args.out, args.seed, args.dtype, args.device)
    print(json.loads((path / "random_model.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
