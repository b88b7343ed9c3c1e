"""The built-in tools. A tool is a function `(arguments: str, limits: SandboxLimits) -> ToolResult`: it gets the
call's arguments as text and returns what the model reads next; it never raises for bad input.

`python` runs the code in the sandbox. `calculator` evaluates arithmetic in this process, without running any
code: the expression is parsed with `ast` and only numbers, operators and a few math functions are evaluated.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable

from laminar.tools.sandbox import DEFAULT_LIMITS, SandboxLimits, ToolResult, run_code

# The program the `python` tool runs: the model's code is written to cell.py (so tracebacks show its lines) and
# run like a REPL cell: when the last statement is an expression whose value is not None, its repr is printed
# (sys.displayhook), so a cell ending in `x * 2` shows the value without a print. Tracebacks start at the cell.
CELL_DRIVER = """\
import ast, sys, traceback
SOURCE = {source!r}
with open("cell.py", "w", encoding="utf-8") as f:
    f.write(SOURCE)


def run():
    tree = ast.parse(SOURCE, "cell.py")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = {{"__name__": "__main__"}}
    exec(compile(tree, "cell.py", "exec"), namespace)
    if last is not None:
        sys.displayhook(eval(compile(ast.Expression(last.value), "cell.py", "eval"), namespace))


try:
    run()
except SystemExit:
    raise
except BaseException as e:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "cell.py":
        tb = tb.tb_next
    if tb is None and not isinstance(e, SyntaxError):
        tb = e.__traceback__  # raised outside the cell's own frames (e.g. inside compile): show everything
    traceback.print_exception(type(e), e, tb)
    sys.exit(1)
"""


def python(arguments: str, limits: SandboxLimits = DEFAULT_LIMITS) -> ToolResult:
    """Run `arguments` (Python source) in the sandbox; what it prints, plus the last expression's value."""
    return run_code(CELL_DRIVER.format(source=arguments), limits)


MAX_EXPRESSION_CHARS = 1000
MAX_RESULT_BITS = 10_000  # about 3,000 decimal digits; bounds every intermediate integer
MAX_FACTORIAL = 1000
OPERATORS: dict[type, Callable] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
FUNCTIONS: dict[str, Callable] = {
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "gcd": math.gcd,
    "factorial": math.factorial,
}
CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value would be too large."""


def calculator(arguments: str, limits: SandboxLimits | None = None) -> ToolResult:
    """Evaluate an arithmetic expression: numbers, + - * / // % **, unary + and -, parentheses, the functions in
    `FUNCTIONS` and the constants pi, e, tau. Anything else, and any result over `MAX_RESULT_BITS`, comes back
    as an `error: ...` text. `limits` is unused (nothing runs in the sandbox); it keeps the tool signature."""
    start = time.monotonic()
    try:
        value = evaluate(arguments)
        text, ok, reason = _format(value), True, "ok"
    except OverflowError:
        text, ok, reason = "error: the result is too large for a floating-point number", False, "exception"
    except (CalculatorError, ArithmeticError, ValueError, TypeError) as e:
        text, ok, reason = f"error: {e or type(e).__name__}", False, "exception"
    return ToolResult(text, ok, reason, time.monotonic() - start)


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises CalculatorError naming what is not allowed."""
    expression = expression.strip()
    if not expression:
        raise CalculatorError("empty expression; expected arithmetic such as 2 * (3 + 4)")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"the expression is {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {e.msg}") from None
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"{node.value!r} is not a number")
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}; the constants are {sorted(CONSTANTS)}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_RESULT_BITS + 1:
                raise CalculatorError(f"the result would have more than {MAX_RESULT_BITS} bits")
        return _bounded(OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in FUNCTIONS or node.keywords:
            raise CalculatorError(
                f"only these functions, with positional arguments, are allowed: {sorted(FUNCTIONS)}"
            )
        args = [_eval(arg) for arg in node.args]
        if name == "factorial" and args and isinstance(args[0], int) and args[0] > MAX_FACTORIAL:
            raise CalculatorError(f"factorial of more than {MAX_FACTORIAL} is not computed")
        return _bounded(FUNCTIONS[name](*args))
    raise CalculatorError(
        f"{type(node).__name__} is not allowed; only numbers, + - * / // % **, parentheses, "
        f"{sorted(CONSTANTS)} and the functions {sorted(FUNCTIONS)}"
    )


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power whose integer result would pass MAX_RESULT_BITS before computing it (9**9**9)."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1:
        if exponent > 0 and (abs(base).bit_length() - 1) * exponent > MAX_RESULT_BITS:
            raise CalculatorError(f"{base}**{exponent} would have more than {MAX_RESULT_BITS} bits")


def _bounded(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"the result {value!r:.50} is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError(f"the result would have more than {MAX_RESULT_BITS} bits")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)
