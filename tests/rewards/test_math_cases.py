"""Reward cases both ways, per data source: what a right answer may look like, and what restating, hedging or
answering elsewhere must not earn. `math_dapo` and `aime*` rows read the last `Answer:` line (verl's DAPO
format); other rows a boxed answer, else `#### N`, else the last number. Where a response gives two answers in
its format, the last counts."""

import pytest

from laminar.rewards.math import default_score

DAPO, AIME, GENERIC = "math_dapo", "aime_2024", None

THE_FIVE_FORMS = [  # scored 0 on DAPO rows once, 1 on generic ones
    "Answer: \\boxed{5}",
    "Answer: $\\boxed{5}$",
    "Answer: \\(5\\)",
    "Answer: **5**",
    "Answer: 5 (five)",
]

CASES = [
    # the `Answer:` forms, on every kind of row
    *[(source, f"2 + 3 = 5.\n{form}", "5", 1.0) for form in THE_FIVE_FORMS for source in (DAPO, AIME)],
    *[(source, form, "5", 1.0) for form in THE_FIVE_FORMS for source in (GENERIC, "aime25")],
    (DAPO, "Answer: 5", "5", 1.0),
    (DAPO, "**Answer:** 5", "5", 1.0),
    (DAPO, "Answer: 5.", "5", 1.0),  # verl's string comparison scores a trailing period wrong
    (DAPO, "Answer: \\boxed{5}.", "5", 1.0),
    (AIME, "Answer: \\text{5}", "5", 1.0),
    (DAPO, "Answer: x = 5", "5", 1.0),
    (DAPO, "Answer: 2 + 3 = 5", "5", 1.0),  # the result after the last `=`, as verl reads it
    (DAPO, "Answer: $\\frac{\\pi}{2}$", "\\pi/2", 1.0),  # a symbolic truth: compared by value
    (DAPO, "The answer is \\boxed{5}.", "5", 1.0),  # no `Answer:` line: the last box (verl: wrong)
    # negative numbers
    (DAPO, "Answer: -5", "-5", 1.0),
    (AIME, "Answer: $-5$", "-5", 1.0),
    (DAPO, "Answer: \u22125", "-5", 1.0),  # a Unicode minus
    (GENERIC, "\\boxed{\u22125}", "-5", 1.0),
    (DAPO, "Answer: 5", "-5", 0.0),
    (DAPO, "Answer: -5", "5", 0.0),
    (GENERIC, "\\boxed{-5}", "5", 0.0),
    # fractions and decimals: by value, a fraction in lowest terms
    (DAPO, "Answer: \\frac{1}{2}", "0.5", 1.0),
    (DAPO, "Answer: 0.5", "\\frac{1}{2}", 1.0),  # verl's string comparison: wrong
    (AIME, "Answer: 1/2", "0.5", 1.0),
    (GENERIC, "\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    (GENERIC, "so x = 0.5", "\\frac{1}{2}", 1.0),
    (DAPO, "Answer: \\frac{1}{3}", "0.5", 0.0),
    (DAPO, "Answer: 2/4", "0.5", 0.0),  # a division still to do
    (GENERIC, "\\boxed{\\frac{2}{4}}", "0.5", 0.0),
    # thousands commas
    (DAPO, "Answer: 1,000", "1000", 1.0),
    (AIME, "Answer: 1000", "1,000", 1.0),
    (GENERIC, "\\boxed{1{,}000}", "1000", 1.0),
    (GENERIC, "500 + 500 = 1000 dollars.\n#### 1,000", "1000", 1.0),
    (DAPO, "Answer: 1,000", "1", 0.0),  # a thousands comma, not a decimal one
    # units, currency, percent and degrees around the number
    (DAPO, "Answer: 5 \\text{ apples}", "5", 1.0),
    (DAPO, "Answer: $5$ apples", "5", 1.0),
    (DAPO, "Answer: 18 dollars", "18", 1.0),
    (DAPO, "Answer: \\$18", "18", 1.0),
    (DAPO, "Answer: 30^\\circ", "30", 1.0),
    (DAPO, "Answer: 50\\%", "50", 1.0),
    (GENERIC, "The total is \\boxed{18 \\text{ apples}}", "18", 1.0),
    (GENERIC, "\\boxed{12 \\text{ cm}^2}", "12", 1.0),
    (DAPO, "Answer: 5 \\text{ apples}", "6", 0.0),
    (DAPO, "Answer: five", "5", 0.0),
    # a practitioner's cases: a box's text and font are read, not dropped
    (GENERIC, "\\boxed{\\text{5}}", "5", 1.0),
    (GENERIC, "\\boxed{\\mathbf{5}}", "5", 1.0),
    # restating the question (what is 47 + 38? what is 170 / 2?) is not answering it
    (GENERIC, "\\boxed{170/2}", "85", 0.0),
    (GENERIC, "\\boxed{\\frac{170}{2}}", "85", 0.0),
    (GENERIC, "\\boxed{8500\\%}", "85", 0.0),  # the number as written: 8500
    (GENERIC, "\\boxed{47 + 38}", "85", 0.0),
    (DAPO, "Answer: 47 + 38", "85", 0.0),
    (DAPO, "Answer: 85 = 47 + 38", "85", 0.0),
    (AIME, "Answer: $\\frac{170}{2}$", "85", 0.0),
    (DAPO, "Answer: 8500\\%", "85", 0.0),
    (DAPO, "Answer: 47 + 38 = 85", "85", 1.0),
    # hedging: two answers are none, whichever is right
    (GENERIC, "\\boxed{5\\text{, maybe 6}}", "5", 0.0),
    (GENERIC, "\\boxed{5 \\text{(or 6, or 7)}}", "5", 0.0),
    (GENERIC, "\\boxed{5 \\text{ or } 6}", "6", 0.0),
    (DAPO, "Answer: 5 or 6", "5", 0.0),
    (DAPO, "Answer: 5 or 6", "6", 0.0),
    (DAPO, "Answer: $5$ or $6$", "5", 0.0),  # verl keeps the first `$..$` and scores it right
    (AIME, "Answer: \\boxed{5} or \\boxed{6}", "5", 0.0),
    (AIME, "Answer: \\boxed{5} or \\boxed{6}", "6", 0.0),
    (DAPO, "Answer: 5 (or 6)", "5", 0.0),
    (DAPO, "Answer: 5, maybe 6", "5", 0.0),
    (DAPO, "Answer: 5 (approximately)", "5", 0.0),
    (DAPO, "Answer: 5 or more", "5", 0.0),
    # two answers in the row's format: the last counts
    (GENERIC, "\\boxed{5} is wrong, it is \\boxed{6}", "5", 0.0),
    (GENERIC, "\\boxed{5} is wrong, it is \\boxed{6}", "6", 1.0),
    (DAPO, "Answer: 5\nNo, recounting:\nAnswer: 6", "5", 0.0),
    (DAPO, "Answer: 5\nNo, recounting:\nAnswer: 6", "6", 1.0),
    # an `Answer:` line outranks a box on DAPO rows; a box outranks everything on generic ones
    (DAPO, "Answer: 6\nActually it is \\boxed{5}", "5", 0.0),
    (AIME, "\\boxed{5}\nAnswer: 6", "5", 0.0),
    (GENERIC, "Answer: 6\nActually it is \\boxed{5}", "5", 1.0),
    # the right number only in the reasoning, not in the final answer
    (DAPO, "2 + 3 = 5, so 5 apples; one is eaten.\nAnswer: 4", "5", 0.0),
    (DAPO, "2 + 3 = 5, so there are 5 apples in all.", "5", 0.0),  # no `Answer:` line, no box
    (AIME, "2 + 3 = 5, so there are 5 apples in all.", "5", 0.0),
    (GENERIC, "2 + 3 = 5, and one more makes 6.", "5", 0.0),  # the last number
    (GENERIC, "18 apples, I mean #### 20", "18", 0.0),
]


@pytest.mark.parametrize(("data_source", "response", "truth", "expected"), CASES)
def test_reward_cases(data_source, response, truth, expected):
    assert default_score(response, {"data_source": data_source, "ground_truth": truth}) == expected
