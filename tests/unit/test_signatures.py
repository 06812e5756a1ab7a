"""No public function of specbuild takes more than MAX_PARAMS parameters: past that a call site
cannot be read at a glance, and settings that travel together belong in a dataclass built once
(in the script, from the rule's params)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "specbuild"
MAX_PARAMS = 8


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> int:
    """Parameters a caller may pass: self/cls of a method and *args left out, **kwargs one."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(a.kwonlyargs) + (a.kwarg is not None)


def public_signatures(path: Path) -> list[tuple[str, int, int]]:
    """(name, line, parameters) of each public function of `path`: module-level functions and
    the methods (with `__init__`) of its public classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not node.name.startswith("_"):
                out.append((node.name, node.lineno, _count(node, method=False)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for fn in node.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if not fn.name.startswith("_") or fn.name == "__init__":
                    name = f"{node.name}.{fn.name}"
                    out.append((name, fn.lineno, _count(fn, method=True)))
    return out


def test_the_count_leaves_out_self_and_star_args_and_counts_keyword_bags_once(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "def f(a, /, b, *args, c, **kw): ...\n"
        "def _private(a, b, c, d, e, f, g, h, i): ...\n"
        "class C:\n"
        "    def __init__(self, a, *, b): ...\n"
        "    def _helper(self, a, b, c, d, e, f, g, h, i): ...\n"
    )
    assert public_signatures(path) == [("f", 1, 4), ("C.__init__", 4, 2)]


def test_no_public_function_takes_more_than_eight_parameters():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        over += [
            f"src/specbuild/{rel}:{line} {name}: {n} parameters"
            for name, line, n in public_signatures(path)
            if n > MAX_PARAMS
        ]
    assert not over, (
        f"over {MAX_PARAMS} parameters (bundle settings that travel together in a dataclass):\n"
        + "\n".join(over)
    )
