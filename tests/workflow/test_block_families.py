"""Adding a block family (DFlash, DSpark) to a built workflow: only its own training, export and
bench run, from the shards and vocabulary already built; its export passes the exact-key check
SGLang's loaders lack, and the PyTorch engine benches it at the one chain its blocks were
trained for, token for token the baseline's output."""

from __future__ import annotations

import json

import pytest
import yaml
from workflow_helpers import copy_workdir, planned_jobs, snakemake

from specbuild.export import export_faults
from specbuild.infra.io import read_jsonl

pytestmark = pytest.mark.workflow

# a variant's own jobs, and the tables that list every variant
FAMILY_JOBS = {"bench", "export", "report_bench", "train", "variants"}
BLOCK = {"block_drafts": 2, "block_layers": 1, "block_anchors": 8, "epochs": 1}


def test_adding_block_families_runs_only_their_jobs_and_they_decode_losslessly(
    built_workflow, tmp_path
):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    path = wd / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["train"]["variants"] = {
        "flash": {"family": "dflash", **BLOCK},
        "spark": {"family": "dspark", "markov_rank": 8, **BLOCK},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = planned_jobs(wd)
    assert {rule for rule, _ in jobs} == FAMILY_JOBS, jobs
    trained = sorted(w for rule, w in jobs if rule == "train")
    assert trained == ["variant=flash", "variant=spark"], trained  # base is not retrained
    snakemake(wd, "--cores", "2")
    for name, arch in (("flash", "DFlashDraftModel"), ("spark", "DSparkDraftModel")):
        folder = wd / "results" / "drafter" / name
        assert json.loads((folder / "config.json").read_text())["architectures"] == [arch]
        assert export_faults(folder) == []
        rows = list(read_jsonl(wd / "results" / "bench" / "hf" / name / "2-1-3.jsonl"))
        assert rows and all(r["verify_steps"] for r in rows)
    base = {r["prompt_id"]: r for r in read_jsonl(wd / "results/bench/hf/none/baseline.jsonl")}
    for name in ("flash", "spark"):
        for r in read_jsonl(wd / "results" / "bench" / "hf" / name / "2-1-3.jsonl"):
            assert r["completion_tokens"] == base[r["prompt_id"]]["completion_tokens"]
