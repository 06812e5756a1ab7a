"""README's quick start, built as written: its data file, `cp config/config.yaml my.yaml` with
the `datasets:` section replaced by README's, then the whole workflow on it (what `make run
CONFIG=my.yaml` runs), with the real Snakemake and SmolLM2."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow_helpers import REPO, make_workdir, snakemake

pytestmark = pytest.mark.workflow

README = REPO / "README.md"


def quick_start_blocks() -> tuple[str, dict]:
    """(the shell block that writes the data and my.yaml, README's `datasets:` section)."""
    from tests.unit.test_docs import blocks

    text = README.read_text(encoding="utf-8")
    start = text.index("## Quick start")
    section = text[start : text.index("\n## ", start + 1)]
    shells = [body for lang, body, _ in blocks(section) if lang == "sh"]
    (writes,) = [body for body in shells if "my.yaml" in body and "cat >" in body]
    (datasets,) = [yaml.safe_load(body) for lang, body, _ in blocks(section) if lang == "yaml"]
    assert set(datasets) == {"datasets"}, "README's quick start replaces `datasets:` only"
    return writes, datasets


def test_the_readme_quick_start_builds_end_to_end(tmp_path: Path, target_dir: Path):
    workdir = make_workdir(tmp_path / "wf", target_dir)
    shutil.copyfile(REPO / "config" / "config.yaml", workdir / "config" / "config.yaml")
    writes, datasets = quick_start_blocks()
    subprocess.run(["bash", "-euc", writes], cwd=workdir, check=True)
    mine = yaml.safe_load((workdir / "my.yaml").read_text())
    mine["datasets"] = datasets["datasets"]  # "replace the datasets: section with yours"
    (workdir / "my.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))

    # the Makefile's `run` with CONFIG=my.yaml
    snakemake(workdir, "--configfile", "my.yaml", "--cores", "2", "--rerun-incomplete", "all")

    (dataset,) = datasets["datasets"]
    records = (workdir / "data" / "chats.jsonl").read_text().splitlines()
    kept = (workdir / "results" / "samples" / dataset / "00000.jsonl").read_text().splitlines()
    ids = [json.loads(r)["id"] for r in records]
    assert [json.loads(r)["id"] for r in kept] == [f"{dataset}-{i}" for i in ids]  # yours, kept
    drafters = list((workdir / "results" / "drafter").glob("*/model.safetensors"))
    assert drafters, "no drafter exported"
    rows = (workdir / "results" / "tables" / "bench.csv").read_text().splitlines()
    assert len(rows) > 1 and "3-1-4" in "\n".join(rows)
    train_logs = "".join(p.read_text() for p in (workdir / "logs" / "train").rglob("*.log"))
    assert "holding out the one lowest-hashing sample" in train_logs
