"""Tools by name, and the tool call at the end of a model's text.

A tool is a built-in (`python`, `calculator`) or user code by dotted path, `package.module:function`, loaded as
reward functions are (`laminar.plugin`). Every tool has the signature `(arguments: str, limits: SandboxLimits)
-> ToolResult`; the model calls it by its built-in name or, for a dotted path, by the function's name.

Two call formats are read, whichever closes the text:
- a fenced block, ```python ... ``` (or ```py), calls `python` with the block as the code;
- Hermes / Qwen style, `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`. `arguments` may be an
  object, a string, or a string holding a JSON object. An object becomes one string: for `python` its `code`;
  for another tool its only value when it has exactly one string value (`{"expression": "2+2"}` -> `2+2`),
  otherwise the object as JSON text for the tool to read.

Only a call that ends the text (whitespace aside) counts: the model generates until it closes a call, so text
after the last call means the turn is an answer, not a call. A call that cannot be read (malformed JSON, no
name, a `python` call without `code`) comes back as a `ToolCall` with `error` set; `run_tool_call` turns it into
an `error: ...` result for the model to read and correct, as it does for an unknown tool name.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from laminar.plugin import load_function
from laminar.tools import builtin
from laminar.tools.sandbox import SandboxLimits, ToolResult

ToolFn = Callable[[str, SandboxLimits], ToolResult]
BUILTIN_TOOLS: dict[str, ToolFn] = {"python": builtin.python, "calculator": builtin.calculator}
FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolLoadError(ValueError):
    """The name is not a built-in tool and the dotted path does not name a callable."""


@dataclass(frozen=True)
class ToolCall:
    """One call read from model text: the tool's name, its arguments as one string, the text of the call, and
    `error` when the call could not be read (then `arguments` is empty and `name` is what could be read)."""

    name: str
    arguments: str
    raw: str
    error: str = ""


def resolve_tool(name_or_path: str) -> ToolFn:
    """A built-in tool by name, or `package.module:function`."""
    if name_or_path in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[name_or_path]
    if ":" not in name_or_path:
        raise ToolLoadError(
            f"tool {name_or_path!r}: not a built-in tool {sorted(BUILTIN_TOOLS)} and not a dotted path "
            f"'module:function' (e.g. 'laminar.tools.builtin:calculator')"
        )
    return load_function(name_or_path, "tool", "laminar.tools.builtin:calculator", ToolLoadError)


def load_tools(names: Iterable[str]) -> dict[str, ToolFn]:
    """The tools the model may call, by the name it calls them: a built-in's name, or a path's function name."""
    tools: dict[str, ToolFn] = {}
    for name in names:
        key = name.rpartition(":")[2]
        if key in tools:
            raise ToolLoadError(f"tool {name!r}: the name {key!r} is already taken by another tool")
        tools[key] = resolve_tool(name)
    return tools


def parse_tool_call(text: str) -> ToolCall | None:
    """The call that closes `text`, or None when the text does not end with one."""
    end = len(text.rstrip())
    fence = _last_match(FENCE, text)
    if fence is not None and fence.end() == end:
        return ToolCall("python", fence.group(1), fence.group(0))
    tagged = _last_match(TOOL_CALL, text)
    if tagged is not None and tagged.end() == end:
        return _read_tagged(tagged.group(1), tagged.group(0))
    return None


def run_tool_call(call: ToolCall, tools: Mapping[str, ToolFn], limits: SandboxLimits) -> ToolResult:
    """Run the call with the tool of its name; a call that cannot run gives an `error: ...` result instead."""
    start = time.monotonic()
    if call.error:
        return ToolResult(f"error: {call.error}", False, "bad_call", 0.0)
    tool = tools.get(call.name)
    if tool is None:
        text = f"error: no tool named {call.name!r}; the tools are {', '.join(sorted(tools)) or 'none'}"
        return ToolResult(text, False, "bad_call", 0.0)
    try:
        result = tool(call.arguments, limits)
    except Exception as e:  # a user tool's bug is the model's next observation, not a crash of the rollout
        return ToolResult(
            f"error: the tool {call.name!r} failed: {type(e).__name__}: {e}",
            False,
            "exception",
            time.monotonic() - start,
        )
    if not isinstance(result, ToolResult):
        text = (
            f"error: the tool {call.name!r} returned {type(result).__name__}; a tool must return a ToolResult"
        )
        return ToolResult(text, False, "exception", time.monotonic() - start)
    return result


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _read_tagged(body: str, raw: str) -> ToolCall:
    expected = 'expected {"name": "<tool>", "arguments": {...}}'
    try:
        call = json.loads(body)
    except ValueError as e:
        return ToolCall("", "", raw, f"the <tool_call> is not valid JSON ({e}); {expected}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return ToolCall("", "", raw, f"the <tool_call> has no tool name; {expected}")
    name, arguments = call["name"], call.get("arguments", "")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            return ToolCall(name, arguments, raw)
        arguments = decoded
    if not isinstance(arguments, dict):
        return ToolCall(name, "", raw, f"the arguments are {type(arguments).__name__}; {expected}")
    if name == "python":
        if not isinstance(arguments.get("code"), str):
            return ToolCall(name, "", raw, 'the python tool takes {"code": "<python source>"}')
        return ToolCall(name, arguments["code"], raw)
    values = list(arguments.values())
    if len(values) == 1 and isinstance(values[0], str):
        return ToolCall(name, values[0], raw)
    return ToolCall(name, json.dumps(arguments), raw)
