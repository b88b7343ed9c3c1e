"""The import graph: no cycle between the packages (a cycle means two packages are one, or a shared definition
sits in the wrong one), and the relays, which move bytes, never import torch. Read from the source with `ast`,
two ways: the imports a module runs when it is imported (its top level, `if` and `try` blocks, class bodies), and
every import it names anywhere, inside functions and under `if TYPE_CHECKING:` included (a lazy import is still a
dependency, only a later one)."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import laminar

ROOT = Path(laminar.__file__).parent
HEAVY = ("torch", "transformers", "peft", "triton", "safetensors.torch")  # what loads torch
# the relay modules a relay's process runs; `publisher.py` is the trainer's side of the publish (it writes
# tensors), `pull.py` the rollout's
RELAY_SIDE = ("laminar.relay.relay", "laminar.relay.chain", "laminar.relay.wire", "laminar.relay.forward")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.cache
def imports_at_load(module: str) -> tuple[str, ...]:
    """The absolute module names `module` imports when it is loaded (`from pkg import name` is `pkg.name` when
    that is a module of ours, else `pkg`)."""
    out: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the package
                    package = module.split(".")
                    package = package[: len(package) - node.level + (MODULES[module].name == "__init__.py")]
                    base = ".".join(package + ([node.module] if node.module else []))
                named = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
                out.extend(named or [base])
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.With | ast.ClassDef):
                visit(node.body)

    visit(ast.parse(MODULES[module].read_text(), filename=str(MODULES[module])).body)
    return tuple(out)


@functools.cache
def imports_anywhere(module: str) -> tuple[str, ...]:
    """The absolute module names `module` imports anywhere: at load, inside functions, under `TYPE_CHECKING`."""
    out: list[str] = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                package = package[: len(package) - node.level + (MODULES[module].name == "__init__.py")]
                base = ".".join(package + ([node.module] if node.module else []))
            named = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            out.extend(named or [base])
    return tuple(out)


def package_of(module: str) -> str:
    """The top-level package (`laminar.data`) or module (`laminar.config`) a module belongs to."""
    return ".".join(module.split(".")[:2])


def package_graph(
    imports: Callable[[str], tuple[str, ...]] = imports_at_load,
) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Each edge between two packages, with the (importing module, imported module) pairs that make it."""
    edges: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for module in MODULES:
        for target in imports(module):
            if target.split(".")[0] != "laminar" or target == "laminar":
                continue
            a, b = package_of(module), package_of(target)
            if a != b:
                edges[(a, b)].append((module, target))
    return edges


def find_cycle(edges: dict[tuple[str, str], list[tuple[str, str]]]) -> list[str] | None:
    """One cycle of packages (its first node repeated at the end), or None."""
    after: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(edges):
        after[a].append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in after[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(after):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _assert_no_cycle(edges: dict[tuple[str, str], list[tuple[str, str]]]) -> None:
    cycle = find_cycle(edges)
    if cycle is not None:
        lines = []
        for a, b in zip(cycle, cycle[1:]):
            made_by = ", ".join(f"{m} imports {t}" for m, t in edges[(a, b)])
            lines.append(f"  {a} -> {b}: {made_by}")
        raise AssertionError(
            "the packages import each other in a cycle (move the shared definition to the lower one):\n"
            + "\n".join(lines)
        )


def test_the_packages_import_each_other_without_a_cycle():
    _assert_no_cycle(package_graph())


def test_no_cycle_either_with_lazy_and_type_checking_imports():
    """Every import counts, those inside functions and under `TYPE_CHECKING` too: a package that imports another
    lazily still needs it, and one that names another's type still depends on its definition."""
    _assert_no_cycle(package_graph(imports_anywhere))


def test_the_graph_sees_a_cycle_and_names_its_modules():
    """The checker itself, on a graph with a cycle."""
    edges = {
        ("laminar.a", "laminar.b"): [("laminar.a.x", "laminar.b.y")],
        ("laminar.b", "laminar.a"): [("laminar.b.z", "laminar.a")],
        ("laminar.b", "laminar.c"): [("laminar.b.z", "laminar.c")],
    }
    assert find_cycle(edges) == ["laminar.a", "laminar.b", "laminar.a"]
    assert find_cycle({k: v for k, v in edges.items() if k[1] != "laminar.a"}) is None
    # what the real graph is made of: an import only type checkers read is not an edge
    assert "laminar.config" not in imports_at_load("laminar.schedules.schedule")
    assert "laminar.schedules.dispatch" in imports_at_load("laminar.schedules.schedule")
    # ... but is one of every import's
    assert "laminar.config" in imports_anywhere("laminar.schedules.schedule")
    assert "laminar.data.codec" in imports_anywhere("laminar.tasks.reverse")  # inside a function
    assert "laminar.data.codec" not in imports_at_load("laminar.tasks.reverse")


def test_a_relay_imports_no_torch():
    """A relay's process only moves bytes and reads layouts (`laminar.engine.layout`, plain data): what its
    modules import when they load reaches none of torch, transformers or peft."""
    for start in RELAY_SIDE:
        seen, todo, came_from = {start}, [start], {start: ""}
        while todo:
            module = todo.pop()
            for target in imports_at_load(module):
                heavy = next((h for h in HEAVY if target == h or target.startswith(h + ".")), None)
                if heavy:
                    chain = [module]
                    while came_from[chain[-1]]:
                        chain.append(came_from[chain[-1]])
                    raise AssertionError(f"{start} imports {heavy}: " + " <- ".join([target] + chain))
                parts = target.split(".")
                for i in range(2, len(parts) + 1):  # a module and the packages that hold it
                    name = ".".join(parts[:i])
                    if name in MODULES and name not in seen:
                        seen.add(name)
                        came_from[name] = module
                        todo.append(name)


def test_a_relay_reads_a_versions_layout_without_loading_torch():
    """The same, run: a relay's modules loaded and a weights layout decoded off the wire, in a fresh process."""
    code = (
        "import sys\n"
        "import laminar.relay.relay\n"
        "from laminar.engine.layout import WeightLayout\n"
        "from laminar.relay import wire\n"
        "layout = WeightLayout.of_specs([('w', (3, 4), 'bfloat16'), ('b', (4,), 'float32')])\n"
        "assert wire.decode_layout(wire.encode_layout(layout), layout.total_bytes) == layout\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_config_schema_imports_nothing_else_of_laminar():
    """The schema is the leaf every package may import: its modules import nothing of Laminar but each other, inside
    functions and under `TYPE_CHECKING` included (the names registries own are checked by `laminar.configure`)."""
    schema = (
        "laminar.config.schema",
        "laminar.config.checks",
        "laminar.config.task",
        "laminar.config.rollout",
    )
    schema += ("laminar.config.trainer",)
    for module in schema:
        tree = ast.parse(MODULES[module].read_text())
        ours = [
            (module, node.lineno, ast.unparse(node))
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            if name.startswith("laminar") and name not in schema
        ]
        assert ours == [], ours
