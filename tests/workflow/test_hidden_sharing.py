"""The hidden jobs of a run share one feature engine (hidden.share_idle_s): the real workflow
on the tiny config loads the target once for two hidden shards, writes the same bytes as a job
per engine, leaves no keeper running once Snakemake is done, and a changed share_idle_s
reruns nothing."""

from __future__ import annotations

import re
import shutil

import pytest
from workflow_helpers import DATASET, make_workdir, snakemake, tiny_config, write_config

from specbuild.engines.keepers import keeper_running
from specbuild.workflow.scheduling import HIDDEN_CLIENT_MB, JOB_FLOOR_MB

pytestmark = pytest.mark.workflow

SHARDS = ("00000", "00001")


def mem_mb_of_hidden_jobs(output: str) -> set[int]:
    """The mem_mb Snakemake gave each hidden job of a run, from its job blocks."""
    blocks = re.findall(r"^(?:local)?rule hidden:\n((?:    .*\n)+)", output, re.M)
    return {int(m) for b in blocks for m in re.findall(r"\bmem_mb=(\d+)", b)}


def test_two_hidden_shards_share_one_engine_which_stops_with_the_run(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config(hidden={"backend": "hf", "device": "cpu", "batch_tokens": 512})
    config["hidden"]["share_idle_s"] = 30
    write_config(wd, config)
    targets = [f"results/hidden/{DATASET}/{s}.safetensors" for s in SHARDS]
    proc = snakemake(wd, *targets, "--cores", "2")
    # the keeper holds the model: a job counts only its own memory
    output = proc.stdout + proc.stderr
    assert mem_mb_of_hidden_jobs(output) == {HIDDEN_CLIENT_MB}, output[-4000:]

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
    proc = snakemake(wd, *targets, "--cores", "2")
    # a job its own engine: the stage's floor, which SmolLM2 on the CPU fits under
    assert mem_mb_of_hidden_jobs(proc.stdout + proc.stderr) == {JOB_FLOOR_MB["hidden"]}
    for shard in SHARDS:
        own = wd / "results" / "hidden" / DATASET / f"{shard}.safetensors"
        assert own.read_bytes() == (shared / f"{shard}.safetensors").read_bytes()
    assert (folder / "keeper.log").read_text() == log  # no keeper was asked


def test_every_hidden_job_runs_before_align_and_training_so_one_engine_serves_them_all(
    tmp_path, target_dir
):
    """`align` may run once each dataset's first shard is done, and `base` train once its own
    shards are, while other shards wait (here the second tiny shard and a variant's dataset).
    Hidden's priority runs those first, on the kept engine, and align's sample then runs on it
    too: on a GPU an engine of align's own, or training, releases the idle engine, and the next
    hidden job would load it again. One core:
    jobs run one at a time in priority order, as the GPU jobs of a one-GPU run do."""
    wd = make_workdir(tmp_path / "wf", target_dir)
    (wd / "raw" / "extra.jsonl").write_text(
        '{"prompt": "Spell cat."}\n{"prompt": "Add 1 and 1."}\n'
    )
    config = tiny_config(
        datasets={"extra": {"path": "raw/extra.jsonl", "format": "prompt", "shard_size": 4}},
        train={"datasets": [DATASET], "variants": {"more": {"datasets": [DATASET, "extra"]}}},
    )
    config["hidden"]["share_idle_s"] = 600
    write_config(wd, config)
    targets = [f"results/train/{v}/best.safetensors" for v in ("base", "more")]
    proc = snakemake(wd, *targets, "--cores", "1")

    started = re.findall(r"^(?:local)?rule (\w+):", proc.stdout + proc.stderr, re.M)
    hidden = [i for i, rule in enumerate(started) if rule == "hidden"]
    assert len(hidden) == 3 and max(hidden) < min(started.index(r) for r in ("align", "train"))
    (folder,) = (wd / ".specbuild" / "keepers").glob("features-*")
    assert (folder / "keeper.log").read_text().count("loaded feature backend hf") == 1
    # align's sample too: its engine (hf, cpu, float32) is the hidden jobs' one
    align = (wd / "logs" / "align" / "align.log").read_text()
    assert "align: sharing the engine kept in" in align and "loaded feature" not in align
