"""Tools resolve by name or `module:function`, and the call that closes a model's text is read in both formats."""

import json

import pytest

from laminar.tools.builtin import calculator, python
from laminar.tools.registry import (
    ToolCall,
    ToolLoadError,
    load_tools,
    parse_tool_call,
    resolve_tool,
    run_tool_call,
)
from laminar.tools.sandbox import SandboxLimits, ToolResult

# wall_s well above what starting the sandboxed interpreter takes on a loaded machine (the tests of the wall
# clock limit give their own)
LIMITS = SandboxLimits(cpu_s=1, wall_s=20, memory_mb=256)


def echo_tool(arguments: str, limits: SandboxLimits) -> ToolResult:
    return ToolResult(f"echo {arguments}", True, "ok", 0.0)


def broken_tool(arguments: str, limits: SandboxLimits) -> ToolResult:
    raise KeyError(arguments)


def test_built_in_names_and_dotted_paths_resolve():
    assert resolve_tool("python") is python and resolve_tool("calculator") is calculator
    assert resolve_tool("laminar.tools.builtin:calculator") is calculator


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("search", "not a built-in tool ['calculator', 'python'] and not a dotted path 'module:function'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("laminar.tools.builtin:nope", "module 'laminar.tools.builtin' has no function 'nope'"),
        ("laminar.tools.builtin:", "expected 'module:function'"),
    ],
)
def test_a_bad_tool_names_what_is_expected(path, error):
    with pytest.raises(ToolLoadError, match="tool ") as e:
        resolve_tool(path)
    assert error in str(e.value)


def test_tools_are_called_by_their_built_in_or_function_name():
    tools = load_tools(["python", "laminar.tools.builtin:calculator"])
    assert tools == {"python": python, "calculator": calculator}
    with pytest.raises(ToolLoadError, match="the name 'calculator' is already taken"):
        load_tools(["calculator", "laminar.tools.builtin:calculator"])


def test_a_fenced_python_block_closing_the_text_is_a_call():
    text = "Let me compute.\n```python\nprint(2 + 2)\n```\n"
    assert parse_tool_call(text) == ToolCall("python", "print(2 + 2)\n", "```python\nprint(2 + 2)\n```")
    assert parse_tool_call("```py\nx = 1\n```").arguments == "x = 1\n"


def test_only_the_last_call_counts_and_only_when_it_ends_the_text():
    two = "```python\nfirst()\n```\nthen\n```python\nsecond()\n```"
    assert parse_tool_call(two).arguments == "second()\n"
    assert parse_tool_call("```python\nx()\n```\nThe answer is 4.") is None
    assert parse_tool_call("```python\nnot closed yet") is None
    assert parse_tool_call("```\nplain fence\n```") is None
    assert parse_tool_call("no call at all") is None


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"code": "print(1)"}, "print(1)"),
        (json.dumps({"code": "print(1)"}), "print(1)"),  # a string holding a JSON object
    ],
)
def test_a_hermes_call_to_python_takes_its_code(arguments, expected):
    text = f"<tool_call>\n{json.dumps({'name': 'python', 'arguments': arguments})}\n</tool_call>"
    call = parse_tool_call("thinking...\n" + text)
    assert call == ToolCall("python", expected, text)


def test_a_hermes_call_to_another_tool_takes_its_one_string_or_the_json():
    call = parse_tool_call(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    )
    assert (call.name, call.arguments, call.error) == ("calculator", "2+2", "")
    call = parse_tool_call('<tool_call>{"name": "search", "arguments": "plain words"}</tool_call>')
    assert call.arguments == "plain words"
    call = parse_tool_call('<tool_call>{"name": "search", "arguments": {"q": "x", "k": 3}}</tool_call>')
    assert json.loads(call.arguments) == {"q": "x", "k": 3}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"name": "python", "arguments": {"code": "x"', "is not valid JSON"),
        ('{"arguments": {"code": "x"}}', "has no tool name"),
        ('["python"]', "has no tool name"),
        (
            '{"name": "python", "arguments": {"source": "x"}}',
            'the python tool takes {"code": "<python source>"}',
        ),
        ('{"name": "calculator", "arguments": [1, 2]}', "the arguments are list"),
    ],
)
def test_a_malformed_hermes_call_comes_back_as_an_error_for_the_model(body, error):
    call = parse_tool_call(f"<tool_call>{body}</tool_call>")
    assert call is not None and call.arguments == "" and error in call.error
    result = run_tool_call(call, load_tools(["python", "calculator"]), LIMITS)
    assert result.reason == "bad_call" and result.text.startswith("error: the ") and error in result.text


def test_run_tool_call_runs_the_named_tool_and_reports_what_cannot_run():
    tools = load_tools(["python", "calculator", f"{__name__}:echo_tool", f"{__name__}:broken_tool"])
    assert run_tool_call(ToolCall("calculator", "6*7", ""), tools, LIMITS).text == "42"
    assert run_tool_call(ToolCall("python", "6*7", ""), tools, LIMITS).text == "42\n"
    assert run_tool_call(ToolCall("echo_tool", "hi", ""), tools, LIMITS).text == "echo hi"
    unknown = run_tool_call(ToolCall("search", "x", ""), tools, LIMITS)
    assert unknown.reason == "bad_call"
    assert (
        unknown.text
        == "error: no tool named 'search'; the tools are broken_tool, calculator, echo_tool, python"
    )
    broken = run_tool_call(ToolCall("broken_tool", "k", ""), tools, LIMITS)
    assert (
        broken.reason == "exception" and broken.text == "error: the tool 'broken_tool' failed: KeyError: 'k'"
    )
