"""The arith task: seeded, answers equal to their expression's value, held-out problems never in training."""

import ast
import operator
import re

import pytest

from laminar.rewards.math import default_score
from laminar.tasks.arith import LEVELS, ArithTask, parse_levels

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> int:
    """+, - and * over integer literals, nothing else."""

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"unexpected {ast.dump(node)} in {expression!r}")

    return walk(ast.parse(expression, mode="eval").body)


ALL = tuple(LEVELS)


def test_rows_are_seeded_chat_prompts_with_the_expressions_value_as_answer():
    rows = ArithTask(levels=ALL, seed=3).rows(240)
    assert rows == ArithTask(levels=ALL, seed=3).rows(240)
    assert rows != ArithTask(levels=ALL, seed=4).rows(240)
    for row in rows:
        [message] = row["prompt"]
        assert message["role"] == "user" and "\\boxed{}" in message["content"]
        assert row["data_source"] == "arith" and row["extra_info"]["level"] in LEVELS
        answer = evaluate(row["extra_info"]["expression"])
        assert row["ground_truth"] == str(answer) and answer >= 0
        # every number of the expression is in the problem's text
        for number in re.findall(r"\d+", row["extra_info"]["expression"]):
            assert re.search(rf"\b{number}\b", message["content"])
        assert default_score(f"So the answer is \\boxed{{{answer}}}.", row) == 1.0
        assert default_score(f"So the answer is \\boxed{{{answer + 1}}}.", row) == 0.0
    assert {r["extra_info"]["level"] for r in rows} == set(ALL)  # levels in turn


def test_the_held_out_split_shares_no_problem_with_training_and_repeats_none():
    for levels in [(1,), (3,), ALL]:
        task = ArithTask(levels=levels, seed=0)
        train = task.rows(4000)
        held = task.held_out_rows(100)
        assert held == ArithTask(levels=levels, seed=0).held_out_rows(100)
        held_expressions = {r["extra_info"]["expression"] for r in held}
        assert not held_expressions & {r["extra_info"]["expression"] for r in train}
        texts = [r["prompt"][0]["content"] for r in held]
        assert len(set(texts)) == len(texts)
        # another seed draws other held-out problems, still never a training one of any seed
        other = ArithTask(levels=levels, seed=1)
        assert not {r["extra_info"]["expression"] for r in other.held_out_rows(100)} & {
            r["extra_info"]["expression"] for r in train
        }


def test_levels_are_checked_by_name():
    assert parse_levels("1,2") == (1, 2) and parse_levels(3) == (3,)
    for bad in ("", "0", "1,x", "9"):
        with pytest.raises(
            ValueError, match=r"task.arith_levels=.*expected comma-separated levels from \[1, 2"
        ):
            parse_levels(bad)
