"""`laminar model import FILE.gguf --out DIR`: a GGUF file (llama.cpp's format) becomes a plain Hugging Face
model directory that the trainer, the engine and `transformers` all load.

transformers reads a GGUF and dequantizes it, but a model loaded that way keeps its quantization config and
`save_pretrained` refuses it; so the weights are copied into a fresh model built from the same config, and that
one is saved (safetensors), with the tokenizer, its chat template and a generation config beside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

GGUF_MAGIC = b"GGUF"
EXTRA = "pip install 'laminar[gguf]' (the gguf and accelerate packages)"


class GGUFImportError(ValueError):
    """The input cannot be imported; the message says what is wrong and what would be right."""


def check_gguf(path: Path) -> None:
    if path.suffix != ".gguf":
        raise GGUFImportError(
            f"{path}: `laminar model import` takes a .gguf file (llama.cpp's format), got {path.suffix or 'no suffix'!r}"
        )
    if not path.is_file():
        raise GGUFImportError(f"{path} does not exist; give the path of a .gguf file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFImportError(
            f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with b'GGUF'"
        )


def check_extra() -> None:
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ModuleNotFoundError as e:
            raise GGUFImportError(f"importing a GGUF needs the {module!r} package: {EXTRA}") from e


def mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):.1f} MiB"


@contextmanager
def gguf_read_once(say: Callable[[str], None], every_s: float = 3.0) -> Iterator[None]:
    """transformers parses the GGUF's header again for its config, its tokenizer and its weights (about 2 s each
    for SmolLM2's 49,152-token vocabulary on two cores), and builds gguf's tensor-name map again for every module
    of the model (about 400, 6 s); within this block the file is parsed once and each map built once, both
    read-only. Dequantizing is told to `say` every `every_s` seconds: tensors done of all, and the time left."""
    import gguf

    reader, tensor_map, dequantize = gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize
    state = {"done": 0, "total": 0, "t0": 0.0, "said": 0.0}

    @functools.cache
    def read(path: str) -> gguf.GGUFReader:
        parsed = reader(path)
        state["total"] = len(parsed.tensors)
        return parsed

    def counted(data, kind):  # noqa: ANN001 (gguf's own signature)
        now = time.perf_counter()
        if state["done"] == 0:
            state["t0"] = state["said"] = now
        elif now - state["said"] >= every_s:
            done, total = state["done"], state["total"]
            left = (now - state["t0"]) / done * (total - done)
            say(f"dequantized {done}/{total} tensors in {now - state['t0']:.1f} s, about {left:.0f} s left")
            state["said"] = now
        state["done"] += 1
        return dequantize(data, kind)

    gguf.GGUFReader = lambda path, *a, **k: read(str(path)) if not a and not k else reader(path, *a, **k)
    gguf.get_tensor_name_map, gguf.dequantize = functools.cache(tensor_map), counted
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize = reader, tensor_map, dequantize


def import_gguf(
    gguf_file: str | Path, out: str | Path, say: Callable[[str], None] = lambda line: None
) -> Path:
    """Writes the Hugging Face directory `out` (created; must not already hold a model) and returns it; `say`
    is told what it is doing, with sizes and times (a large GGUF takes minutes to dequantize)."""
    src, out = Path(gguf_file), Path(out)
    check_gguf(src)
    if (out / "config.json").exists():
        raise GGUFImportError(
            f"--out {out} already holds a model (config.json); give a new or empty directory"
        )
    check_extra()

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.perf_counter()
    say(f"reading {src} ({mib(src.stat().st_size)}): its tokenizer, then its weights, dequantized to float32")
    with gguf_read_once(say):
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
    n_params = sum(p.numel() for p in loaded.parameters())
    say(
        f"read a {loaded.config.model_type} model of {n_params / 1e6:.1f} M parameters and a tokenizer of "
        f"{len(tokenizer)} tokens in {time.perf_counter() - t0:.1f} s; copying into a fresh model"
    )
    config = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    model_type = config.pop("model_type")
    fresh = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if fresh.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise GGUFImportError(
            f"{src}: the GGUF's tensors do not match a {model_type} model built from its own config "
            f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    fresh.tie_weights()

    out.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    fresh.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=fresh.config.bos_token_id,
        eos_token_id=fresh.config.eos_token_id,
        pad_token_id=fresh.config.pad_token_id,
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out, tokenizer.chat_template, fresh.config.max_position_embeddings)
    weights = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    say(f"wrote {mib(weights)} of safetensors, config and tokenizer in {time.perf_counter() - t1:.1f} s")
    return out


def portable_tokenizer_config(out: Path, chat_template: str | None, max_len: int) -> None:
    """The tokenizer config as every transformers version reads it: the fast tokenizer class by its old name,
    the chat template inline as well as in chat_template.jinja, a real maximum length, no load-time flags."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "backend"):
        cfg.pop(key, None)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_len)
    if chat_template:
        cfg["chat_template"] = chat_template
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="laminar model import",
        description="Convert a .gguf file (llama.cpp's format; only .gguf is accepted) into a Hugging Face "
        "model directory: safetensors, config.json, generation_config.json, tokenizer and chat template.",
    )
    parser.add_argument("gguf_file", help="the .gguf file to import")
    parser.add_argument("--out", required=True, help="the directory to write (new or empty)")
    parser.add_argument(
        "--verbose", action="store_true", help="also transformers' progress bars and warnings"
    )
    args = parser.parse_args(argv)
    from laminar.telemetry.quiet import quiet_libraries

    quiet_libraries(args.verbose, keep_tqdm=True)  # the conversion's bar: tensors done of all, time left
    try:
        out = import_gguf(
            args.gguf_file, args.out, say=lambda line: print(f"laminar model import: {line}", flush=True)
        )
    except GGUFImportError as e:
        print(f"laminar model import: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: load it with model.path={out}")
    return 0
