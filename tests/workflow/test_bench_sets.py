"""A benchmark set is a config entry only: adding one schedules its bench jobs and feeds its rows
to the tables, with no code change (dry-run of the real workflow)."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import make_workdir, planned_jobs, tiny_config, write_config

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
    write_config(workdir, config)
    jobs = planned_jobs(workdir, "report")
    chains = ["baseline", *config["bench"]["chains"]]
    for chain in chains:
        assert ("bench", f"set=my_prompts, chain={chain}") in jobs
        assert ("bench", f"set=gsm8k, chain={chain}") in jobs
    assert ("bench_tables", "") in jobs
    assert ("bench_plots", "") in jobs
