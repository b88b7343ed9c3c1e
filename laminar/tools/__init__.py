"""Tools for multi-turn rollouts: the sandbox that runs model-written code (`sandbox.py`), the built-in tools
(`builtin.py`) and the registry that resolves tools by name or `module:function` and parses tool calls out of
model text (`registry.py`)."""
