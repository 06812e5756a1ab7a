"""A benchmark set is a config entry only: adding one reruns the bench jobs (every engine's job
holds every set) and the report tables, with no code change (dry-run of the real workflow)."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import make_workdir, planned_jobs, snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow


def test_a_set_added_by_config_alone_gets_bench_jobs_and_reaches_the_tables(tmp_path, target_dir):
    workdir = make_workdir(tmp_path / "wf", target_dir)
    (workdir / "my_prompts.jsonl").write_text(
        "".join(json.dumps({"q": q, "id": i}) + "\n" for i, q in enumerate(["Hi?", "2+2?"]))
    )
    config = tiny_config()
    config["bench"]["sets"]["my_prompts"] = {
        "path": "my_prompts.jsonl",
        "format": "prompt",
        "key": "q",
        "id_key": "id",
    }
    config["bench"]["engines"] = ["hf", "sglang"]
    write_config(workdir, config)
    jobs = planned_jobs(workdir, "report")
    for engine in ("hf", "sglang"):
        for chain in ["baseline", *config["bench"]["chains"]]:
            drafter = "none" if chain == "baseline" else "base"
            assert ("bench", f"engine={engine}, drafter={drafter}, chain={chain}") in jobs
    assert ("report_bench", "") in jobs
    proc = snakemake(workdir, "--dry-run", "--cores", "1", "--printshellcmds", "report")
    assert "my_prompts.jsonl" in proc.stdout  # the set's file is an input of every bench job
