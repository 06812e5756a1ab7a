"""The package sorted by role keeps its order: infra/ imports nothing outside infra/, and
eagle/ (EAGLE-3 and target facts) nothing but eagle/ and infra/, so a stage's change never
reaches the modules every stage stands on (docs/DESIGN.md, "The package by role")."""

from __future__ import annotations

from tests.unit.test_imports import import_graph

# package -> the packages its modules may import (itself included)
ALLOWED = {
    "specbuild.infra": ("specbuild.infra",),
    "specbuild.eagle": ("specbuild.eagle", "specbuild.infra"),
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def role_breaks(graph: dict[str, dict[str, int]]) -> list[str]:
    """`module:line -> imported` for every import that leaves what its package may import."""
    return [
        f"{module}:{line} -> {target}"
        for package, allowed in ALLOWED.items()
        for module, targets in sorted(graph.items())
        if _within(module, package)
        for target, line in sorted(targets.items())
        if not any(_within(target, a) for a in allowed)
    ]


def test_the_check_sees_infra_importing_a_stage():
    graph = {
        "specbuild.infra.x": {"specbuild.generate": 3, "specbuild.infra.io": 4},
        "specbuild.eagle.y": {"specbuild.infra.io": 2, "specbuild.hidden": 6},
    }
    assert role_breaks(graph) == [
        "specbuild.infra.x:3 -> specbuild.generate",
        "specbuild.eagle.y:6 -> specbuild.hidden",
    ]


def test_infra_and_eagle_import_only_below_themselves():
    graph = import_graph()
    assert any(_within(m, "specbuild.infra") for m in graph)
    assert any(_within(m, "specbuild.eagle") for m in graph)
    found = role_breaks(graph)
    assert not found, (
        "imports against the package's roles (module:line -> imported):\n" + "\n".join(found)
    )
