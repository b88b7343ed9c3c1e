"""The built-in demo task: reverse a digit sequence whose length is drawn from a long-tailed distribution.

It stands in for reasoning: the answer is verifiable by a rule, and the number of tokens a correct answer needs
grows with the problem, so response lengths are long-tailed (lognormal problem sizes give p99 >= 5x median).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from laminar.data.codec import TaskCodec

PAD, BOS, EOS, SEP = "<pad>", "<bos>", "<eos>", "="
DIGITS = [str(d) for d in range(10)]
VOCAB = [PAD, BOS, EOS, SEP, *DIGITS]


@dataclass
class ReverseTask:
    """Problem sizes are lognormal(log(median_len), sigma) clipped to [min_len, max_len]."""

    median_len: float = 5.0
    sigma: float = 0.8
    min_len: int = 1
    max_len: int = 40
    seed: int = 0

    def sample_length(self, rng: random.Random) -> int:
        k = round(math.exp(rng.gauss(math.log(self.median_len), self.sigma)))
        return max(self.min_len, min(self.max_len, k))

    def make_row(self, rng: random.Random) -> dict[str, str]:
        digits = [rng.choice(DIGITS) for _ in range(self.sample_length(rng))]
        return {"prompt": " ".join(digits) + f" {SEP}", "answer": " ".join(reversed(digits))}

    def rows(self, count: int, seed: int | None = None) -> list[dict[str, str]]:
        rng = random.Random(self.seed if seed is None else seed)
        return [self.make_row(rng) for _ in range(count)]

    def max_response_tokens(self) -> int:
        """Enough for the longest problem's answer plus EOS."""
        return self.max_len + 1


def build_tokenizer() -> Tokenizer:
    """A word-level tokenizer over digits and the few markers the task uses; no download needed. Its
    post-processor puts BOS before every encoded text, as Llama's does, so a prompt is `BOS + tokens`."""
    vocab = {w: i for i, w in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return tok


def demo_tokenizer() -> PreTrainedTokenizerFast:
    """The demo's tokenizer as the same Hugging Face object `AutoTokenizer` loads from a model directory."""
    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


def save_tokenizer(tokenizer: Tokenizer | PreTrainedTokenizerFast, out: str | Path) -> None:
    """tokenizer.json plus the small config files HF's AutoTokenizer expects."""
    out = Path(out)
    getattr(tokenizer, "backend_tokenizer", tokenizer).save(str(out / "tokenizer.json"))
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    if isinstance(tokenizer, PreTrainedTokenizerFast):  # its own special tokens (another task's tokenizer)
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        specials = {k: getattr(tokenizer, k) for k in names if getattr(tokenizer, k, None) is not None}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):  # text must decode exactly as written
        cfg["clean_up_tokenization_spaces"] = False
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(specials))


def save_model_dir(model, codec: TaskCodec, out: str | Path) -> Path:
    """A loadable Hugging Face directory: the model, a sampling generation config and the task's tokenizer."""
    from transformers import GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerationConfig(
        bos_token_id=codec.bos_id,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
        do_sample=True,
        temperature=1.0,
    ).save_pretrained(out)
    save_tokenizer(codec.tokenizer, out)
    return out
