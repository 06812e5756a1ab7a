"""`--forcerun train` on a finished workflow trains again from step 0, after verifying every
hidden shard the real `hidden` jobs wrote (checksums included); outputs get the user's mode.
How often training logs and checkpoints (train.log_interval, train.save_interval) reruns no
job; a change of the recipe (train.lr) reruns the training and the jobs that read its drafter."""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from workflow_helpers import copy_workdir, planned_jobs, snakemake

pytestmark = pytest.mark.workflow

# the jobs a change of the training recipe reruns: the training and what reads its drafter
RETRAINED = ["bench", "export", "report_bench", "report_pipeline", "serve", "train", "variants"]


def _trained_tokens(log: str) -> int:
    (line,) = [x for x in log.splitlines() if " trained " in x]
    return int(line.split(" trained ")[1].split()[0])


def test_forcerun_train_trains_from_scratch_after_verifying_every_shard(built_workflow, tmp_path):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")  # mtimes kept: the same job
    first = (wd / "logs" / "train" / "base.log").read_text()
    snakemake(wd, "--cores", "1", "results/train/base/best.safetensors", "--forcerun", "train")
    again = (wd / "logs" / "train" / "base.log").read_text()
    assert "starting fresh" in again and "a finished run of this job" in again
    assert "resuming" not in again
    assert _trained_tokens(again) == _trained_tokens(first) > 0
    shards = sorted((wd / "results" / "hidden").rglob("*.safetensors"))
    assert f"verified {len(shards)} hidden-state shard(s)" in again
    assert "carry no checksums" not in again
    umask = os.umask(0)
    os.umask(umask)
    for path in [*shards, wd / "results" / "train" / "base" / "best.safetensors"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def _set_train_keys(wd, **keys) -> None:
    path = wd / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["train"].update(keys)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def test_a_logging_or_checkpoint_cadence_change_reruns_nothing_a_recipe_change_does(
    built_workflow, tmp_path
):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    train = yaml.safe_load((wd / "config" / "config.yaml").read_text())["train"]
    _set_train_keys(wd, log_interval=train["log_interval"] + 7, save_interval=3)
    assert planned_jobs(wd) == []
    _set_train_keys(wd, lr=train.get("lr", 1e-4) * 2)  # the control: a key that changes weights
    rules = sorted({rule for rule, _ in planned_jobs(wd)})
    assert rules == RETRAINED, rules
