"""Paths the docs, the Makefile and the code name exist in the repo: a reader following one
never lands on nothing (docs/DESIGN.md, config examples, benchmarks, scripts)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# repo-relative paths of files we ship, as they appear in prose and comments
_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|config|tools|benchmarks|scripts|rules|envs|profiles)/[\w./-]+\.\w+)"
)


# a user's own file in examples of messages and commands, not one of ours
ILLUSTRATIVE = {"config/my.yaml"}


def _mentions() -> dict[str, set[str]]:
    texts = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "Makefile", REPO / "Snakefile"]
    texts += sorted((REPO / "docs").glob("*.md"))
    texts += sorted((REPO / "src").rglob("*.py")) + sorted((REPO / "config").rglob("*.yaml"))
    texts += sorted((REPO / "benchmarks").rglob("*.py"))
    found: dict[str, set[str]] = {}
    for path in texts:
        for m in _PATH.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(m.group(1).rstrip("."), set()).add(path.name)
    return found


def test_every_repo_path_the_docs_makefile_and_code_name_exists():
    missing = {
        p: sorted(w)
        for p, w in _mentions().items()
        if "<" not in p and p not in ILLUSTRATIVE and not (REPO / p).exists()
    }
    assert missing == {}


def test_the_design_notes_the_code_cites_are_in_the_repo():
    assert "docs/DESIGN.md" in _mentions() and (REPO / "docs" / "DESIGN.md").is_file()
