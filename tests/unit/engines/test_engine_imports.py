"""The engine room imports no stage: stages import engines, engines import infrastructure.
An engine module that needs a stage's code names it in engines.registry's table (a string,
imported only when chosen), so a stage's change never reaches into how engines are held."""

from __future__ import annotations

from tests.unit.test_imports import import_graph

# what stands above the engine room: the stages (rules/<stage>.smk) with the packages that
# serve only them, and the workflow and config that plan them; nothing under engines/ imports one
ABOVE = (
    "specbuild.align",
    "specbuild.backends",
    "specbuild.bench",
    "specbuild.drafter",
    "specbuild.export",
    "specbuild.generate",
    "specbuild.hidden",
    "specbuild.report",
    "specbuild.rejects",
    "specbuild.samples",
    "specbuild.seed",
    "specbuild.serve",
    "specbuild.synthesize",
    "specbuild.target",
    "specbuild.tokenization",
    "specbuild.tuning",
    "specbuild.variants",
    "specbuild.vocab",
    "specbuild.workflow",
    "specbuild.config",
)


def _is_stage(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in ABOVE)


def stage_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """`engine module:line -> stage module` for every import of a stage under engines/."""
    return [
        f"{module}:{line} -> {target}"
        for module, targets in sorted(graph.items())
        if module == "specbuild.engines" or module.startswith("specbuild.engines.")
        for target, line in sorted(targets.items())
        if _is_stage(target)
    ]


def test_the_check_sees_an_engine_importing_a_stage():
    graph = {"specbuild.engines.x": {"specbuild.hidden.core": 4, "specbuild.infra.io": 5}}
    assert stage_imports(graph) == ["specbuild.engines.x:4 -> specbuild.hidden.core"]


def test_nothing_under_engines_imports_a_stage():
    graph = import_graph()
    assert any(m.startswith("specbuild.engines.") for m in graph)
    found = stage_imports(graph)
    assert not found, "engines/ imports stage modules (module:line -> stage):\n" + "\n".join(found)
