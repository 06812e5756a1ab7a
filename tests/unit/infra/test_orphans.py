"""Outputs an orphaned job finished (specbuild.infra.orphans): kept only when the job's run
has ended, published again only to the same job with every checksum verified, used once."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from specbuild.infra.orphans import job_key, keep_if_orphan, reuse_orphan
from specbuild.infra.run_lock import RUN_ENV, process_start, this_run


@pytest.fixture
def ended_run(monkeypatch) -> None:
    """This job's snakemake was killed: $SPECBUILD_RUN names a process that is gone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(dead.pid)
    dead.wait()
    monkeypatch.setenv(RUN_ENV, f"{socket.gethostname()}:{dead.pid}:{start}")


def _job(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"id": "a"}\n')
    outs = [tmp_path / "gen" / n for n in ("00000.jsonl", "00000.rejected.jsonl", "c.json")]
    outs[0].parent.mkdir()
    for i, out in enumerate(outs):
        out.write_text(f"output {i}\n")
    return outs, job_key({"mode": "regenerate"}, [samples])


def test_an_orphans_outputs_are_published_again_to_the_same_job_once(tmp_path, ended_run):
    outs, key = _job(tmp_path)
    assert keep_if_orphan(outs, key)
    for out in outs:  # what Snakemake does before it reruns the job
        out.unlink()
    assert reuse_orphan(outs, key)
    assert [o.read_text() for o in outs] == ["output 0\n", "output 1\n", "output 2\n"]
    assert [p.name for p in outs[0].parent.iterdir() if p.name.startswith(".")] == []
    assert not reuse_orphan(outs, key)  # used once: a later forced rerun does the work


def test_another_jobs_or_a_changed_output_is_not_published(tmp_path, ended_run):
    outs, key = _job(tmp_path)
    keep_if_orphan(outs, key)
    assert not reuse_orphan(outs, job_key({"mode": "keep"}, []))  # other params
    assert not list(outs[0].parent.glob(".*"))  # removed
    keep_if_orphan(outs, key)
    with open(outs[1], "r+") as fh:  # in place: the stash's link holds these bytes too
        fh.write("changed")
    assert not reuse_orphan(outs, key)


def test_a_job_of_a_live_run_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_ENV, this_run().run_id)
    outs, key = _job(tmp_path)
    assert not keep_if_orphan(outs, key)
    assert not list(outs[0].parent.glob(".*"))
