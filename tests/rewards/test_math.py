"""The math reward finds the final answer where each format puts it and compares values, not strings."""

import threading

import pytest

from laminar.rewards.math import default_score, extract_answer, math_reward


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (
            "First 1/4, then 1/4 more, so \\boxed{1/2}",
            "0.5",
        ),  # the case: a fraction against a decimal
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("so x = 0.5", "\\frac{1}{2}"),
        ("He pays 500 + 500 = 1000 dollars.\n#### 1,000", "1000"),
        ("She has 12 apples and eats 5, so 7 are left.", "7"),  # no box, no ####: the last number
        ("\\boxed{\\$18}", "18"),
        ("The total is \\boxed{18 \\text{ apples}}", "18"),
        ("\\boxed{x = 18}", "18"),
        ("Answer: \\boxed{-3}", "-3"),
        ("\\boxed{72.0}", 72),  # a number as ground truth
    ],
)
def test_right_answers_score_one(response, truth):
    assert math_reward(response, {"ground_truth": truth}) == 1.0


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        ("\\boxed{19}", "18"),
        ("I think it is 17.", "18"),
        ("\\boxed{18} is wrong, it is \\boxed{19}", "18"),  # the last box counts
        ("18 apples, I mean #### 20", "18"),  # #### outranks a stray number
        ("\\boxed{1/3}", "0.5"),
    ],
)
def test_wrong_answers_score_zero(response, truth):
    assert math_reward(response, {"ground_truth": truth}) == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "",
        "no numbers here",
        "\\boxed{",
        "\\boxed{}",
        "}{}{\\frac{",
        "$$$$",
        "\\boxed{" + "(" * 5000 + "}",
        "\x00\ufffd",
    ],
)
def test_garbage_scores_zero_and_does_not_raise(response):
    assert math_reward(response, {"ground_truth": "3"}) == 0.0


def test_the_ground_truth_falls_back_to_answer_and_to_verl_reward_model():
    assert math_reward("\\boxed{4}", {"answer": "2 + 2 = 4\n#### 4"}) == 1.0  # a full GSM8K solution
    assert math_reward("\\boxed{4}", {"reward_model": {"ground_truth": "4"}}) == 1.0
    assert math_reward("\\boxed{5}", {"ground_truth": ["4", "5"]}) == 1.0  # any of several answers
    with pytest.raises(
        ValueError, match=r"expected 'reward_model.ground_truth' \(verl\), 'ground_truth' or 'answer'"
    ):
        math_reward("\\boxed{4}", {"prompt": "2 + 2?"})


def test_the_data_source_picks_where_the_answer_is():
    text = "2 + 2 = 4, so #### 4"
    assert default_score(text, {"data_source": "openai/gsm8k", "ground_truth": "4"}) == 1.0
    # verl's MATH scorer reads only the last box
    assert (
        default_score(text, {"data_source": "DigitalLearningGmbH/MATH-lighteval", "ground_truth": "4"}) == 0.0
    )
    assert default_score("\\boxed{4}", {"data_source": "lighteval/MATH", "ground_truth": "4"}) == 1.0
    # GSM8K's is strict: no #### -> no answer, as in verl
    assert default_score("it is 4", {"data_source": "openai/gsm8k", "ground_truth": "4"}) == 0.0
    assert default_score("Answer: 4", {"data_source": "math_dapo", "ground_truth": "4"}) == 1.0
    assert default_score("Answer: 4", {"data_source": "aime_2024", "ground_truth": "4"}) == 1.0
    # unknown, missing or odd sources: the generic reward
    for source in ("arith", "my-own-set", None, 3):
        assert default_score("it is 4", {"data_source": source, "ground_truth": "4"}) == 1.0
    assert default_score("it is 4", {"ground_truth": "4"}) == 1.0
    with pytest.raises(ValueError, match="code task"):
        default_score("print(4)", {"data_source": "apps", "ground_truth": "4"})


def test_extraction_order_is_box_then_hashes_then_last_number():
    assert extract_answer("1 #### 2 \\boxed{3} 4") == "3"
    assert extract_answer("1 #### 2\n then 4") == "2"
    assert extract_answer("1, 2 and 3,000,") == "3,000"
    assert extract_answer("nothing") is None


def test_it_works_off_the_main_thread():
    """math-verify's own timeout uses SIGALRM, which raises off the main thread; rewards run on helper threads."""
    results = []
    worker = threading.Thread(
        target=lambda: results.append(math_reward("\\boxed{1/2}", {"ground_truth": "0.5"}))
    )
    worker.start()
    worker.join(60)
    assert results == [1.0]


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{47 + 38}",  # what a policy learned on `arith` once math-verify evaluated it
        "\\boxed{47+38}<|im_end|>",
        "The answer is \\boxed{170 / 2 + 0}",
        "\\boxed{\\frac{47+38}{1}}",
        "#### 47 + 38",
    ],
)
def test_an_expression_is_not_the_answer_to_a_numeric_question(response):
    assert math_reward(response, {"ground_truth": "85"}) == 0.0


def test_a_symbolic_truth_still_takes_an_equivalent_expression():
    assert math_reward("\\boxed{1 + x^2}", {"ground_truth": "x^2+1"}) == 1.0
    assert math_reward("\\boxed{\\frac{\\pi}{2}}", {"ground_truth": "\\pi/2"}) == 1.0
