"""Imports within specbuild run one way: no module imports, at any depth and from any function,
one that imports it back. A circle hides which module a piece belongs to and makes import
order matter; it is broken by moving the piece, never by importing it late."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package)} of every module under src/specbuild."""
    found = {}
    for path in sorted((SRC / "specbuild").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """{module: {specbuild module it imports: first line}}, every import statement counted:
    module level, in functions, and under TYPE_CHECKING alike."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, (path, package) in modules.items():
        here = name if package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # `from specbuild.x import y` imports the module y when y is one
                named = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in named:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each holds at least one circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_circle(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """The shortest circle through the component's first module, with each import's line."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in graph[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                steps = zip(path, path[1:] + [start], strict=True)
                return " -> ".join(f"{a}:{graph[a][b]}" for a, b in steps) + f" -> {start}"
            if w in members and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"no circle through {start}")


def test_the_graph_sees_the_imports_inside_functions():
    graph = import_graph()
    assert "specbuild.engines.server" in graph["specbuild.engines.kept_server"]
    assert "specbuild.engines.open" in graph["specbuild.align"]  # inside a function
    circle = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    assert strongly_connected(circle) == [["a", "b", "c"]]
    assert one_circle(circle, ["a", "b", "c"]) == "a:3 -> b:5 -> c:7 -> a"


def test_specbuild_imports_run_one_way():
    graph = import_graph()
    circles = [one_circle(graph, c) for c in strongly_connected(graph)]
    assert not circles, "import circles (module:line -> ...):\n" + "\n".join(circles)
