"""What the workflow does with what it cannot trust, through real Snakemake runs: a hidden
shard damaged on disk stops training in a few lines of its job log, without a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from workflow_helpers import copy_workdir, snakemake

pytestmark = pytest.mark.workflow

BEST = "results/train/base/best.safetensors"


def _flip_bits(path: Path) -> None:
    """Change 4 KB of a shard's features in place, its mtime kept, as a bad disk does."""
    stat, raw = path.stat(), bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin = 8 + n + json.loads(raw[8 : 8 + n])["aux"]["data_offsets"][0]
    for i in range(begin, begin + 4096, 2):  # the lowest mantissa bit: every value finite
        raw[i] ^= 1
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_damaged_hidden_shard_stops_training_with_its_message_and_no_traceback(
    built_workflow, tmp_path
):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    (shard, *_) = sorted((wd / "results" / "hidden").rglob("*.safetensors"))
    _flip_bits(shard)
    proc = snakemake(wd, "--cores", "1", BEST, "--forcerun", "train", check=False)
    assert proc.returncode == 1
    log = (wd / "logs" / "train" / "base.log").read_text()
    rel = shard.relative_to(wd)
    assert "CRITICAL job failed: 1 of " in log and "failed verification; training did not" in log
    assert f"{rel}:\n    - aux: checksum mismatch" in log
    assert "Fix: delete each listed shard and rerun snakemake" in log
    for text in (log, proc.stdout, proc.stderr):
        assert "Traceback" not in text
