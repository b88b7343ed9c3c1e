"""The built-in tools: `python` runs a cell like a REPL, `calculator` evaluates arithmetic and nothing else."""

import pytest

from laminar.tools.builtin import MAX_RESULT_BITS, calculator, python
from laminar.tools.sandbox import SandboxLimits

# wall_s well above what starting the sandboxed interpreter takes on a loaded machine (the tests of the wall
# clock limit give their own)
LIMITS = SandboxLimits(cpu_s=1, wall_s=20, memory_mb=256)


def test_python_prints_the_value_of_a_last_expression_like_a_repl():
    assert python("x = 6\nx * 7", LIMITS).text == "42\n"
    assert python("'text'", LIMITS).text == "'text'\n"
    assert python("a = 1; a + 1  # comment", LIMITS).text == "2\n"


def test_python_prints_nothing_more_for_a_last_print_or_a_statement():
    assert python("print('once')", LIMITS).text == "once\n"  # print returns None: not shown again
    assert python("x = 3", LIMITS).text == ""
    assert python("", LIMITS).ok


def test_python_tracebacks_show_the_cell_only():
    r = python("def f(n):\n    return 10 // n\nf(0)", LIMITS)
    assert r.reason == "exception"
    lines = [line for line in r.text.splitlines() if line.strip(" ~^")]  # the carets vary with the version
    assert lines == [
        "Traceback (most recent call last):",
        '  File "cell.py", line 3, in <module>',
        "    f(0)",
        '  File "cell.py", line 2, in f',
        "    return 10 // n",
        "ZeroDivisionError: integer division or modulo by zero",
    ]


def test_python_reports_a_syntax_error_with_its_line():
    r = python("x = 1\nif x\n    print(x)", LIMITS)
    assert r.reason == "exception" and 'File "cell.py", line 2' in r.text and "SyntaxError" in r.text
    assert "Traceback" not in r.text  # nothing of the driver around it


def test_python_keeps_the_limits_of_the_sandbox():
    # a wall clock far past the CPU limit: on a busy machine the loop gets a fraction of a core
    assert python("while True: pass", SandboxLimits(cpu_s=1, wall_s=30, memory_mb=256)).reason == "cpu_limit"
    assert python("import sys; sys.exit(4)", LIMITS).text == "error: exited with status 4"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 * (3 + 4)", "14"),
        ("-2 ** 2", "-4"),
        ("7 // 2 + 7 % 2", "4"),
        ("1 / 4", "0.25"),
        ("sqrt(16) + abs(-1)", "5"),
        ("round(pi, 3)", "3.142"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("factorial(20)", "2432902008176640000"),
        ("max(1, 5, 3) - min(2, 4)", "3"),
        ("+3", "3"),
    ],
)
def test_the_calculator_evaluates_arithmetic(expression, value):
    r = calculator(expression)
    assert r.ok and r.text == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('true')", "only these functions"),
        ("(1).real", "Attribute is not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "'a' is not a number"),
        ("[1, 2]", "List is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("9 ** 9 ** 9", f"more than {MAX_RESULT_BITS} bits"),
        ("(10 ** 3000) * (10 ** 3000)", f"more than {MAX_RESULT_BITS} bits"),
        ("factorial(100000)", "factorial of more than 1000"),
        ("10.0 ** 400", "too large for a floating-point number"),
        ("1 / 0", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("2 +", "not an arithmetic expression"),
        ("", "empty expression"),
        ("1" * 2000, "at most 1000"),
        ("True + 1", "True is not a number"),
    ],
)
def test_the_calculator_refuses_anything_but_bounded_arithmetic(expression, error):
    r = calculator(expression)
    assert not r.ok and r.text.startswith("error: ") and error in r.text


def test_a_deeply_nested_expression_is_refused_not_crashed():
    assert calculator("-" * 999 + "1").text == "error: the expression is nested too deeply"
    assert "too many nested parentheses" in calculator("(" * 400 + "1" + ")" * 400).text
    assert calculator("(" * 150 + "1" + ")" * 150).text == "1"
