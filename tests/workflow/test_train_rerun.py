"""`--forcerun train` on a finished workflow trains again from step 0, after verifying every
hidden shard the real `hidden` jobs wrote (checksums included); outputs get the user's mode."""

from __future__ import annotations

import os
import stat

import pytest
from workflow_helpers import copy_workdir, snakemake

pytestmark = pytest.mark.workflow


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
