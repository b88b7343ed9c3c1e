"""`reverse`, the demo: reverse a digit sequence whose length is drawn from a long-tailed distribution, scored by
exact match with partial credit (`laminar.rewards.reverse`). Its warm start is the demo's tiny Llama over the
digits tokenizer, and the starting model of every run of a task without a tiny warm start of its own.

It stands in for reasoning: the answer is verifiable by a rule, and the number of tokens a correct answer needs
grows with the problem, so response lengths are long-tailed (lognormal problem sizes give p99 >= 5x median).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laminar.tasks.task import HELD_OUT_SEED, Example, Row, Task, WarmStart

if TYPE_CHECKING:
    from tokenizers import Tokenizer
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


# ---- the tokenizer ---------------------------------------------------------------------------------------------
def build_tokenizer() -> Tokenizer:
    """A word-level tokenizer over digits and the few markers the task uses; no download needed. Its
    post-processor puts BOS before every encoded text, as Llama's does, so a prompt is `BOS + tokens`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return tok


def demo_tokenizer() -> PreTrainedTokenizerFast:
    """The demo's tokenizer as the same Hugging Face object `AutoTokenizer` loads from a model directory."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


def demo_codec() -> TaskCodec:
    """The demo's digits tokenizer as a codec: the tiny Llama's, and that of the random test models."""
    from laminar.data.codec import TaskCodec

    return TaskCodec(demo_tokenizer(), source="the demo tokenizer")


# ---- the task --------------------------------------------------------------------------------------------------
def rows(cfg: Any) -> list[Row]:
    return ReverseTask(seed=cfg.task.seed).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    return ReverseTask(seed=cfg.task.seed + HELD_OUT_SEED).rows(cfg.eval.num_prompts)


def examples(codec: Any, cfg: Any) -> Callable[[random.Random], Example]:
    """The prompt, then the reversed digits and the end token."""
    reverse = ReverseTask()

    def example(rng: random.Random) -> Example:
        row = reverse.make_row(rng)
        prompt, answer = codec.encode_prompt(row["prompt"]), codec.encode_answer(row["answer"])
        return prompt + answer, [0] * len(prompt) + [1] * len(answer)

    return example


TASK = Task(
    name="reverse",
    about="the demo",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.reverse:reverse_reward",
    warm_start=WarmStart(examples, codec=demo_codec),
)
