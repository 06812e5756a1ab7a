"""The hidden jobs of a run share one feature engine (hidden.share_idle_s): the real workflow
on the tiny config loads the target once for two hidden shards, writes the same bytes as a job
per engine, leaves no keeper running once Snakemake is done, and a changed share_idle_s
reruns nothing."""

from __future__ import annotations

import shutil

import pytest
from workflow_helpers import DATASET, make_workdir, snakemake, tiny_config, write_config

from specbuild.keepers import keeper_running

pytestmark = pytest.mark.workflow

SHARDS = ("00000", "00001")


def test_two_hidden_shards_share_one_engine_which_stops_with_the_run(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config(hidden={"backend": "hf", "device": "cpu", "batch_tokens": 512})
    config["hidden"]["share_idle_s"] = 30
    write_config(wd, config)
    targets = [f"results/hidden/{DATASET}/{s}.safetensors" for s in SHARDS]
    snakemake(wd, *targets, "--cores", "2")

    (folder,) = (wd / ".specbuild" / "keepers").glob("features-*")
    log = (folder / "keeper.log").read_text()
    assert log.count("loaded feature backend hf") == 1, log[-3000:]
    for shard in SHARDS:
        job_log = (wd / "logs" / "hidden" / DATASET / f"{shard}.log").read_text()
        assert str(folder) in job_log and "keeper: " in job_log
    assert not keeper_running(folder)  # the run's end stopped it
    assert "the run ended" in (folder / "stop").read_text()
    assert not list((wd / "results" / "hidden" / DATASET).glob(".*"))  # no part left

    config["hidden"]["share_idle_s"] = 0  # an engine a job from now on: no output changes
    write_config(wd, config)
    proc = snakemake(wd, *targets, "--cores", "2", "--dry-run")
    assert "Nothing to be done" in proc.stdout + proc.stderr

    shared = tmp_path / "shared"
    shutil.move(wd / "results" / "hidden" / DATASET, shared)
    snakemake(wd, *targets, "--cores", "2")
    for shard in SHARDS:
        own = wd / "results" / "hidden" / DATASET / f"{shard}.safetensors"
        assert own.read_bytes() == (shared / f"{shard}.safetensors").read_bytes()
    assert (folder / "keeper.log").read_text() == log  # no keeper was asked
