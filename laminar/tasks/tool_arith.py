"""`tool_arith`: add or multiply numbers too large to do in one's head, with a calculator.

The prompt is the bare arithmetic (`4821*937=`). The way to the answer is a tool call in the Hermes format the
replica's parser reads, `<tool_call>{"name": "calculator", "arguments": "4821*937"}</tool_call>`; the replica
runs the `calculator` tool and appends its output as context (`\\n<tool_output>\\n4517277\\n</tool_output>\\n`,
never trained on), and the model then writes the answer and its end token. The reward (`laminar.rewards.
tool_arith`) checks only what the model wrote after the last tool output, so copying the tool's output is what
earns it, never the output itself.

The task has its own small tokenizer, since the demo's (digits and `=`) cannot write a call: one token per
printable ASCII character, plus the call syntax's fixed parts as single tokens (as a BPE tokenizer's merges
would make them), so a call costs a dozen tokens. It loads through `AutoTokenizer` like any model directory's.
Its warm start is a tiny Llama over that tokenizer that answers some problems with a calculator call and guesses
the rest (`WarmupConfig.tool_share` of its demonstrations call the tool), so RL has to find that the tool pays.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laminar.tasks.task import HELD_OUT_SEED, Example, Row, Task, WarmStart

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from laminar.data.codec import TaskCodec

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
TOOL = "calculator"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
OUTPUT_OPEN, OUTPUT_CLOSE = "<tool_output>", "</tool_output>"  # what TaskCodec.render_tool_output writes
ARGS_OPEN, ARGS_CLOSE = f'{{"name": "{TOOL}", "arguments": "', '"}'
PIECES = [CALL_OPEN, CALL_CLOSE, OUTPUT_OPEN, OUTPUT_CLOSE, ARGS_OPEN, ARGS_CLOSE]
CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # digits, letters, punctuation, space, \t, \n
OPERATORS = ("+", "*")


def call_text(expression: str) -> str:
    """The model's call of the calculator on `expression`, as the replica's parser reads it."""
    return f"{CALL_OPEN}{ARGS_OPEN}{expression}{ARGS_CLOSE}{CALL_CLOSE}"


@dataclass
class ToolArithTask:
    """`a + b` with two `add_digits`-digit numbers, or `a * b` with `mul_digits` = (digits of a, digits of b);
    the operator is drawn with equal odds."""

    add_digits: int = 5
    mul_digits: tuple[int, int] = (4, 3)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.add_digits < 1 or min(self.mul_digits) < 1:
            raise ValueError(
                f"tool_arith: add_digits={self.add_digits}, mul_digits={self.mul_digits}: every number needs "
                "at least one digit"
            )

    def make_row(self, rng: random.Random) -> dict[str, Any]:
        op = rng.choice(OPERATORS)
        if op == "+":
            a, b = _number(rng, self.add_digits), _number(rng, self.add_digits)
            value = a + b
        else:
            a, b = _number(rng, self.mul_digits[0]), _number(rng, self.mul_digits[1])
            value = a * b
        expression = f"{a}{op}{b}"
        return {"prompt": f"{expression}=", "answer": str(value), "extra_info": {"expression": expression}}

    def rows(self, count: int, seed: int | None = None) -> list[dict[str, Any]]:
        rng = random.Random(self.seed if seed is None else seed)
        return [self.make_row(rng) for _ in range(count)]


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


# ---- the tokenizer ---------------------------------------------------------------------------------------------
def build_tool_tokenizer() -> Tokenizer:
    """One token per character, the call syntax's fixed parts as added tokens (matched before the characters),
    decoded by joining tokens with nothing between them, so text round-trips exactly. BOS goes before every
    encoded text, as the demo's and Llama's tokenizers put it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens([AddedToken(p, normalized=False) for p in PIECES])
    return tok


def tool_tokenizer() -> PreTrainedTokenizerFast:
    """The task's tokenizer as the Hugging Face object `AutoTokenizer` loads from a model directory."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tool_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def check_tokenizer(codec: TaskCodec) -> None:
    """A model for this task must write the call and read the tool's output exactly; says what it lacks."""
    for text in (call_text("4821*937"), f"\n{OUTPUT_OPEN}\n4517277\n{OUTPUT_CLOSE}\n4517277"):
        ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
        back = codec.decode(ids)
        if back != text:
            raise ValueError(
                f"task.name=tool_arith: {codec.source}'s tokenizer does not round-trip the task's call syntax "
                f"({text!r} decodes back as {back!r}); use the task's own warm start (leave model.path empty) "
                "or a model whose tokenizer writes <tool_call> JSON and <tool_output> text exactly"
            )


# ---- demonstrations for the warm start --------------------------------------------------------------------------
def demonstration(
    codec: TaskCodec, row: dict[str, Any], use_tool: bool, tool_output: str
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one supervised example: the prompt, then either the call, the tool's output
    (`tool_output`, rendered as the replica renders it; mask 0) and the answer, or the answer alone. The mask is
    1 on what the model writes, the same tokens RL trains."""
    prompt = codec.encode_prompt(row["prompt"])
    ids, mask = list(prompt), [0] * len(prompt)
    if use_tool:
        call = codec.tokenizer(call_text(row["extra_info"]["expression"]), add_special_tokens=False)
        ids += call["input_ids"]
        mask += [1] * len(call["input_ids"])
        context = codec.render_tool_output(tool_output)
        ids += context
        mask += [0] * len(context)
    answer = codec.encode_answer(row["answer"])
    return ids + answer, mask + [1] * len(answer)


# ---- the task -------------------------------------------------------------------------------------------------
# the warm start's run: long enough that the model writes calls and often copies the tool's output right, short
# enough that it still guesses most answers without the tool (about 1 in 3 of its samples call it)
WARM_START_STEPS = 1200


def rows(cfg: Any) -> list[Row]:
    return ToolArithTask(seed=cfg.task.seed).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    return ToolArithTask(seed=cfg.task.seed + HELD_OUT_SEED).rows(cfg.eval.num_prompts)


def check(cfg: Any) -> None:
    tools = cfg.task.tools
    if "calculator" not in tools:
        raise ValueError(
            f"task.tools={tools!r} is invalid: a list that holds calculator when task.name=tool_arith (its model "
            "calls the calculator tool), e.g. task.tools=[calculator]"
        )


def examples(codec: Any, cfg: Any) -> Callable[[random.Random], Example]:
    """The prompt, then (`cfg.tool_share` of the time) the call and the calculator's output as the replica
    renders it, then the answer."""
    from laminar.tools.builtin import calculator

    arith = ToolArithTask()

    def example(rng: random.Random) -> Example:
        row = arith.make_row(rng)
        use_tool = rng.random() < cfg.tool_share
        output = calculator(row["extra_info"]["expression"]).text if use_tool else ""
        return demonstration(codec, row, use_tool, output)

    return example


def tiny_codec() -> TaskCodec:
    from laminar.data.codec import TaskCodec

    return TaskCodec(tool_tokenizer(), source="the tool_arith tokenizer")


TASK = Task(
    name="tool_arith",
    about="arithmetic with a calculator tool",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.tool_arith:tool_arith_reward",
    warm_start=WarmStart(examples, codec=tiny_codec, steps=WARM_START_STEPS, reads=("tool_share",)),
    check=check,
    check_codec=check_tokenizer,
)
