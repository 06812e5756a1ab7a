"""The package sorted by role keeps its order: infra/ imports nothing outside infra/, and
eagle/ (EAGLE-3 and target facts) nothing but eagle/ and infra/, so a stage's change never
reaches the modules every stage stands on (docs/DESIGN.md, "The package by role"). A few
packages beside one another stay apart: backends/ (generation engines) never imports drafter/
(training), so a generate job never loads the training code."""

from __future__ import annotations

from tests.unit.test_imports import import_graph

# package -> the packages its modules may import (itself included)
ALLOWED = {
    "specbuild.infra": ("specbuild.infra",),
    "specbuild.eagle": ("specbuild.eagle", "specbuild.infra"),
}
# package -> the packages its modules must not import
FORBIDDEN = {
    "specbuild.backends": ("specbuild.drafter",),
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def role_breaks(graph: dict[str, dict[str, int]]) -> list[str]:
    """`module:line -> imported` for every import that leaves what its package may import, or
    reaches what it must not."""
    outside = [
        f"{module}:{line} -> {target}"
        for package, allowed in ALLOWED.items()
        for module, targets in sorted(graph.items())
        if _within(module, package)
        for target, line in sorted(targets.items())
        if not any(_within(target, a) for a in allowed)
    ]
    forbidden = [
        f"{module}:{line} -> {target}"
        for package, banned in FORBIDDEN.items()
        for module, targets in sorted(graph.items())
        if _within(module, package)
        for target, line in sorted(targets.items())
        if any(_within(target, b) for b in banned)
    ]
    return outside + forbidden


def test_the_check_sees_infra_importing_a_stage():
    graph = {
        "specbuild.infra.x": {"specbuild.generate": 3, "specbuild.infra.io": 4},
        "specbuild.eagle.y": {"specbuild.infra.io": 2, "specbuild.hidden": 6},
        "specbuild.backends.z": {"specbuild.drafter.config": 12, "specbuild.infra.devices": 13},
    }
    assert role_breaks(graph) == [
        "specbuild.infra.x:3 -> specbuild.generate",
        "specbuild.eagle.y:6 -> specbuild.hidden",
        "specbuild.backends.z:12 -> specbuild.drafter.config",
    ]


def test_each_package_imports_only_what_its_role_allows():
    graph = import_graph()
    for package in (*ALLOWED, *FORBIDDEN):
        assert any(_within(m, package) for m in graph), package
    found = role_breaks(graph)
    assert not found, (
        "imports against the package's roles (module:line -> imported):\n" + "\n".join(found)
    )
