"""`laminar export RUN_DIR --out DIR`: the run's last checkpoint as a plain Hugging Face model directory
(config, safetensors weights, tokenizer, chat template, generation config), without the optimizer and run
state; loadable by `transformers`, vLLM or `laminar train model.path=DIR`. A checkpoint written by several
trainer ranks is joined here into whole tensors; `--dtype bfloat16` halves the size."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """The run or checkpoint to export is not there or not whole; the message says what is expected."""


def find_checkpoint(path: Path) -> Path:
    """A run folder (its `checkpoint/`) or a checkpoint directory itself."""
    for candidate in (path / "checkpoint", path):
        if (candidate / "config.json").is_file() and (candidate / "trainer_state.json").is_file():
            return candidate
    raise ExportError(
        f"{path}: neither a run folder of `laminar train` with a checkpoint/ nor a checkpoint directory "
        "(expected config.json and trainer_state.json; a run writes one every trainer.checkpoint_every steps)"
    )


def export(path: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from laminar.data.codec import copy_tokenizer_files
    from laminar.trainer.state_files import read_json

    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    ckpt = find_checkpoint(Path(path))
    out = Path(out)
    if out.resolve() == ckpt.resolve():
        raise ExportError(f"--out {out} is the checkpoint itself; choose another directory")
    version = read_json(ckpt / "trainer_state.json", "trainer step")["version"]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype), use_safetensors=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    copy_tokenizer_files(ckpt, out)
    print(f"exported {ckpt} (version {version}, {dtype}) to {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar export", description=__doc__)
    ap.add_argument("run", help="a run folder (RUN_DIR) or a checkpoint directory")
    ap.add_argument("--out", required=True, help="the Hugging Face model directory to write")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    args = ap.parse_args(argv)
    try:
        export(args.run, args.out, args.dtype)
    except ExportError as e:
        print(f"laminar export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
