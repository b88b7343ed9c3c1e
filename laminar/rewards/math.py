"""Verifiable math rewards: find the response's final answer, compare it with the row's ground truth by value
(`math-verify`: `\\boxed{1/2}` is right for 0.5, `1,000` for 1000, `x = 18` for 18). 1.0 right, 0.0 otherwise.

`default_score` picks the answer format per row by `data_source`, as verl's default scorer does: GSM8K's
`#### N`, MATH's last `\\boxed{}`, DAPO's `Answer: X`, and for any other source (the built-in `arith` task
included) a boxed answer, else `#### N`, else the last number in the text.

math-verify bounds its own parsing with SIGALRM, which only works on a process's main thread; rewards run on
helper threads, so that timeout is off here and `RewardScorer`'s `task.reward_timeout_s` bounds the call.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

MAX_ANSWER_CHARS = 256  # a longer "answer" is not one; sympy can take minutes on such input
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
HASHES = re.compile(r"####\s*([^\n]+)")
ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")


class _TimeoutIsOurs(logging.Filter):
    """math-verify warns, once per process, that its timeout is off and the caller must bound the call: ours
    does (task.reward_timeout_s), so the warning would only alarm."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutIsOurs())


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if there is none or
    it is not closed."""
    starts = [m.end() for m in BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def after_hashes(text: str) -> str | None:
    """GSM8K's format: the answer follows the last `####`."""
    found = HASHES.findall(text)
    return found[-1] if found else None


def answer_line(text: str) -> str | None:
    """DAPO's format: the last `Answer: X`."""
    found = ANSWER_LINE.findall(text)
    return found[-1] if found else None


def last_number(text: str) -> str | None:
    found = [n.rstrip(",") for n in NUMBER.findall(text)]
    return found[-1] if found else None


Extractor = Callable[[str], str | None]
GENERIC: tuple[Extractor, ...] = (last_boxed, after_hashes, last_number)


def extract_answer(text: str, extractors: Sequence[Extractor] = GENERIC) -> str | None:
    """The first answer any extractor finds, in their order."""
    for extract in extractors:
        found = extract(text)
        if found is not None and found.strip():
            return found.strip()
    return None


def _parse(answer: str) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    answer = answer.strip().rstrip(".").strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return []
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse(f"${answer}$", extraction_config=configs, parsing_timeout=None)


def same_value(answer: str, truth: str) -> bool:
    from math_verify import verify

    gold, pred = _parse(truth), _parse(answer)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))


# What may surround a number without making it an expression: units, currency, percent, LaTeX spacing.
DECORATION = re.compile(r"\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\[$%,!;]|\\?\$|%|\\left|\\right")
LITERAL = re.compile(r"[+-]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)")
FRACTION = re.compile(r"[+-]?(?:\d+/\d+|\\[dt]?frac\{\d+\}\{\d+\}|\\[dt]?frac\d\d)")
NAMED = re.compile(r"^[A-Za-z]\w*\s*=\s*")  # "x = 18"


def is_number(text: str) -> bool:
    """A plain number: an integer or decimal (thousands commas allowed), or a fraction of two integers, with
    at most a unit, a currency or percent sign, and a `name =` before it. `47 + 38` is not one."""
    s = DECORATION.sub("", str(text)).strip().rstrip(".").strip()
    s = NAMED.sub("", s).replace(" ", "")
    return bool(LITERAL.fullmatch(s) or FRACTION.fullmatch(s))


def answers(answer: str, truth: str) -> bool:
    """`answer` is right for `truth`. A numeric truth takes a number, never an expression that evaluates to
    it: math-verify would score `\\boxed{47 + 38}` right for 85, and a policy learns to restate the question."""
    if is_number(truth) and not is_number(answer):
        return False
    return same_value(answer, truth)


def ground_truths(row: dict[str, Any]) -> list[str]:
    """The accepted answers of a row: `ground_truth`, else `answer`, else verl's `reward_model.ground_truth`;
    one value or a list. A full GSM8K solution counts by its `#### N`, a MATH solution by its last box."""
    truth = row.get("ground_truth")
    if truth is None:
        truth = row.get("answer")
    if truth is None and isinstance(row.get("reward_model"), dict):
        truth = row["reward_model"].get("ground_truth")
    if truth is None:
        raise ValueError(
            f"row has no ground truth: expected a 'ground_truth' or 'answer' field (has {sorted(row)})"
        )
    out = []
    for t in truth if isinstance(truth, list | tuple) else [truth]:
        t = str(t)
        out.append(after_hashes(t) or last_boxed(t) or t)
    return out


def score_with(response: str, row: dict[str, Any], extractors: Sequence[Extractor] = GENERIC) -> float:
    """1.0 when the answer the extractors find equals one of the row's ground truths by value."""
    truths = ground_truths(row)
    answer = extract_answer(response if isinstance(response, str) else "", extractors)
    if answer is None:
        return 0.0
    return 1.0 if any(answers(answer, t) for t in truths) else 0.0


def math_reward(response: str, row: dict[str, Any]) -> float:
    """The generic math reward: a boxed answer, else `#### N`, else the last number."""
    return score_with(response, row, GENERIC)


# data_source -> where the answer is, following verl's `default_compute_score`
EXTRACTORS_BY_SOURCE: dict[str, tuple[Extractor, ...]] = {
    "openai/gsm8k": (after_hashes,),
    "gsm8k": (after_hashes,),
    "lighteval/MATH": (last_boxed,),
    "DigitalLearningGmbH/MATH-lighteval": (last_boxed,),
    "math_dapo": (answer_line, last_boxed),
    "hiyouga/geometry3k": (last_boxed,),
    **{
        f"numina_{name}": (last_boxed,)
        for name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads")
    },
}


def extractors_for(data_source: Any) -> tuple[Extractor, ...]:
    source = data_source if isinstance(data_source, str) else ""
    if source in CODE_SOURCES:
        raise ValueError(
            f"data_source {source!r} is a code task: Laminar has no built-in code reward; set "
            "task.reward=module:function to one that runs the tests"
        )
    if source.startswith("aime"):
        return EXTRACTORS_BY_SOURCE["math_dapo"]
    return EXTRACTORS_BY_SOURCE.get(source, GENERIC)


def default_score(response: str, row: dict[str, Any]) -> float:
    """The reward chosen per row by its `data_source` (unknown or missing: the generic math reward)."""
    return score_with(response, row, extractors_for(row.get("data_source")))
