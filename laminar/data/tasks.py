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

from tokenizers import Tokenizer, models, pre_tokenizers

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
    """A word-level tokenizer over digits and the few markers the task uses; no download needed."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


class TaskCodec:
    """Turns rows into prompt ids and responses back into text, with the task's special tokens."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer or build_tokenizer()
        self.bos_id = self.tokenizer.token_to_id(BOS)
        self.eos_id = self.tokenizer.token_to_id(EOS)
        self.pad_id = self.tokenizer.token_to_id(PAD)

    @classmethod
    def from_dir(cls, path: str | Path) -> TaskCodec:
        return cls(Tokenizer.from_file(str(Path(path) / "tokenizer.json")))

    def encode_prompt(self, prompt: str) -> list[int]:
        return [self.bos_id, *self.tokenizer.encode(prompt, add_special_tokens=False).ids]

    def encode_answer(self, answer: str) -> list[int]:
        return [*self.tokenizer.encode(answer, add_special_tokens=False).ids, self.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Text up to (not including) EOS; special tokens dropped."""
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        n = self.vocab_size
        ids = [i for i in ids if 0 <= i < n]  # a random or larger model emits any id
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def save_tokenizer(tokenizer: Tokenizer, out: str | Path) -> None:
    """tokenizer.json plus the small config files HF's AutoTokenizer expects."""
    out = Path(out)
    tokenizer.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps({k: cfg[k] for k in cfg if k != "tokenizer_class"})
    )


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
