"""Verifiable math rewards: find the response's final answer, compare it with the row's ground truth by value.
1.0 right, 0.0 otherwise (verl's DAPO scorer gives 1 and -1; Laminar keeps 1 and 0 for every source).

`default_score` picks the answer format per row by `data_source`, as verl's default scorer does: GSM8K's
`#### N`, MATH's last `\\boxed{}`, DAPO's `Answer: X` (`math_dapo`, `aime*`; without one, a boxed answer,
which verl scores wrong), and for any other source (the built-in `arith` task included) a boxed answer, else
`#### N`, else the last number. Where a response gives several answers in its format (two boxes, two
`Answer:` lines), the last one counts, as in verl.

A numeric ground truth takes one plain number, compared exactly (`\\boxed{1/2}` is right for 0.5, `1,000` for
1000, `x = 18` and `18 \\text{ apples}` for 18), never an expression that evaluates to it (`47 + 38`, `170/2`,
`8500\\%` for 85: a policy learns to restate the question) nor a hedge (`5 or 6`, `5\\text{, maybe 6}`). Any
other ground truth is compared by value with `math-verify` (`\\frac{\\pi}{2}` is right for `\\pi/2`).

math-verify bounds its own parsing with SIGALRM, whose handler is Python code and cannot stop a computation in C
(`9^{9^{9}}` against a symbolic truth: 9**387420489), so that timeout is off here; `RewardScorer` runs the call
in a worker process and kills it at `task.reward_timeout_s`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from math import gcd
from typing import Any

MAX_ANSWER_CHARS = 256  # a longer "answer" is not one; sympy can take minutes on such input
NUMBER = re.compile(r"[-\u2212]?\d[\d,]*(?:\.\d+)?")
HASHES = re.compile(r"####\s*([^\n]+)")
ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")  # verl's DAPO pattern
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


def unboxed(text: str) -> str:
    """`text` with each `\\boxed{X}` written as X, nested ones too, in one pass; unchanged if a box is not
    closed (a cut-off answer is none)."""
    out, opened, pos = [], [], 0  # opened: for each open brace, whether it opened a box
    while pos < len(text):
        box = BOXED.match(text, pos)
        if box:
            opened.append(True)
            pos = box.end()
            continue
        char = text[pos]
        pos += 1
        if char == "{":
            opened.append(False)
        elif char == "}" and opened and opened.pop():
            continue
        out.append(char)
    return text if any(opened) else "".join(out)


def after_hashes(text: str) -> str | None:
    """GSM8K's format: the answer follows the last `####`."""
    found = HASHES.findall(text)
    return found[-1] if found else None


MATH_DELIMITERS = re.compile(r"(?<!\\)\$|\\[()\[\]]")  # $..$, \(..\), \[..\]; not the currency sign \$
EMPHASIS = re.compile(r"\*\*|__|^\*|\*$")  # markdown bold and italics
GLOSS = re.compile(r"\s\(([^()]*)\)\s*\.?$")  # "5 (five)"
HEDGES = frozenset(
    "or and maybe perhaps possibly probably either about approximately approx roughly around nearly almost "
    "least most more less than not".split()
)


def is_hedge(words: str) -> bool:
    return bool(HEDGES & set(re.findall(r"[a-z]+", words.lower())))


def answer_line(text: str) -> str | None:
    """DAPO's format: the last `Answer: X` line, read as verl's `math_dapo` scorer reads it (its box and `$`
    removed). Where this differs from verl: `\\(5\\)`, `**5**` and a gloss in words (`5 (five)`), which verl's
    string comparison scores wrong, count here, while a gloss with a number or a hedge (`5 (or 6)`) stays and
    makes the answer wrong; values are compared as `answers` does (`0.5` is right for `\\frac{1}{2}`, `5.` for
    5), where verl compares normalised strings; `$5$ or $6$` is a hedge here, where verl keeps the first `$..$`;
    the whole response is read, not its last 300 characters; and a wrong answer scores 0, not -1."""
    found = ANSWER_LINE.findall(text)
    if not found:
        return None
    line = EMPHASIS.sub("", MATH_DELIMITERS.sub("", unboxed(found[-1]))).strip()
    gloss = GLOSS.search(line)
    if gloss and not re.search(r"\d", gloss[1]) and not is_hedge(gloss[1]):
        line = line[: gloss.start()].strip()
    return line


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

    answer = answer.replace("\u2212", "-").strip().rstrip(".").strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return []
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse(f"${answer}$", extraction_config=configs, parsing_timeout=None)


def same_value(answer: str, truth: str) -> bool:
    from math_verify import verify

    gold, pred = _parse(truth), _parse(answer)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))


# Font and text commands, read for their content: `\text{5}` is 5, `\text{ apples}` a unit.
TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|bm|boldsymbol)\s*\{([^{}]*)\}")
# What may surround a number without changing it: LaTeX spacing, currency, percent, degrees.
DECORATION = re.compile(r"\\[$%,!;:]|\\?\$|%|\\left|\\right|\\displaystyle|\^\s*\{?\\circ\}?|\\circ")
PLAIN_NUMBER = re.compile(
    r"(?P<sign>[+-]?)\s*(?:"
    r"(?P<decimal>\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)"
    r"|(?P<num>\d+)\s*/\s*(?P<den>\d+)"
    r"|\\[dt]?frac\s*(?:\{\s*(?P<fnum>\d+)\s*\}\s*\{\s*(?P<fden>\d+)\s*\}|(?P<snum>\d)(?P<sden>\d))"
    r")(?:\s+(?P<unit>[A-Za-z]+(?:\s+[A-Za-z]+)*))?(?:\s*\^\s*\{?[23]\}?)?"
)


def stated_number(text: str) -> Fraction | None:
    """The one plain number `text` states, or None: an integer or decimal (thousands commas allowed), or a
    fraction of two integers in lowest terms, with at most a sign (a Unicode minus too), a unit in words, a
    currency, percent or degree sign, and something `=` before it (`x = 18`; `47 + 38 = 85` states 85, as
    verl reads it). The number as written: `50\\%` is 50. `170/2`, `47 + 38` and `5 or 6` state none."""
    s = str(text).replace("\u2212", "-").split("=")[-1]
    s = DECORATION.sub("", TEXT.sub(r" \1 ", s).replace("\\ ", " ").replace("{,}", ","))
    m = PLAIN_NUMBER.fullmatch(s.strip().rstrip(".").strip())
    if m is None or (m["unit"] and is_hedge(m["unit"])):
        return None
    if m["decimal"]:
        value = Fraction(m["decimal"].replace(",", ""))
    else:
        num = int(m["num"] or m["fnum"] or m["snum"])
        den = int(m["den"] or m["fden"] or m["sden"])
        if den < 2 or gcd(num, den) != 1:  # a division still to do
            return None
        value = Fraction(num, den)
    return -value if m["sign"] == "-" else value


def answers(answer: str, truth: str) -> bool:
    """`answer` is right for `truth`. A numeric truth takes a plain number equal to it, never an expression
    that evaluates to it: math-verify would score `\\boxed{47 + 38}` right for 85, and a policy learns to
    restate the question."""
    number = stated_number(truth)
    if number is None:
        return same_value(answer, truth)
    return stated_number(answer) == number


def ground_truths(row: dict[str, Any]) -> list[str]:
    """The accepted answers of a row: `ground_truth`, else `answer`, else verl's `reward_model.ground_truth`;
    one value or a list. A full GSM8K solution counts by its `#### N`, a MATH solution by its last box."""
    truth = row.get("ground_truth")
    if truth is None:
        truth = row.get("answer")
    if truth is None and isinstance(row.get("reward_model"), dict):
        truth = row["reward_model"].get("ground_truth")
    if truth is None:
        has = sorted(k for k, v in row.items() if v is not None)  # a normalised row holds ground_truth: None
        raise ValueError(
            "row has no ground truth: expected 'reward_model.ground_truth' (verl), 'ground_truth' or 'answer' "
            f"(its fields: {has})"
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
