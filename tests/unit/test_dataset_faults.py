"""A dataset file the workflow cannot read is a config fault, printed like the schema's (the
message alone, no Snakemake frame); a file of hostile records is no fault at all: the workflow
parses and each record is rejected by its own shard (infra/test_records.py)."""

import os

import pytest
import yaml
from config_cases import default_config, faults

from tests.unit.config.test_config import MAX_ERROR_LINES, run_snakemake, scratch_dir
from tests.unit.infra.test_records import HOSTILE


def test_a_fifo_dataset_is_named_a_fifo_not_a_missing_file(tmp_path):
    os.mkfifo(tmp_path / "chats.jsonl")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    cfg = default_config()
    cfg["datasets"]["gsm8k"]["path"] = "chats.jsonl"
    cfg["datasets"]["other"] = {**cfg["datasets"]["gsm8k"], "path": "gone.jsonl"}
    assert [f for f in faults(cfg, workdir=tmp_path) if f.startswith("datasets.")] == [
        f"datasets.gsm8k.path: 'chats.jsonl' is a FIFO (named pipe), not a regular file "
        f"(in {tmp_path.resolve()})",
        f"datasets.other.path: 'gone.jsonl' is a symlink to nothing (in {tmp_path.resolve()})",
    ]


def _run_with_dataset(tmp_path, name: str, content: bytes, **settings):
    work = scratch_dir(tmp_path)
    (work / name).write_bytes(content)
    cfg = default_config()
    cfg["datasets"]["gsm8k"].update(path=name, **settings)
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "--configfile", str(tmp_path / "my.yaml"))
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow  # starts Snakemake
def test_a_dataset_file_fault_prints_alone_like_a_schema_fault(tmp_path):
    proc, output = _run_with_dataset(
        tmp_path, "chats.json", b'[{"question": "a"},\n {"question": "b"}\n {"question": "c"}]'
    )
    assert proc.returncode != 0
    assert "datasets.gsm8k.path: chats.json:3: not valid JSON (Expecting ',' delimiter" in output
    assert "common.smk" not in output and "Traceback" not in output, output[-3000:]
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


@pytest.mark.slow  # starts Snakemake
def test_hostile_records_with_id_key_leave_the_workflow_parsing(tmp_path):
    lines = [b'{"question": "ok", "qid": 1}'] + [
        raw.replace(b'"prompt"', b'"question"') for raw, _ in HOSTILE
    ]
    proc, output = _run_with_dataset(
        tmp_path, "chats.jsonl", b"\n".join(lines) + b"\n", id_key="qid", limit=None
    )
    assert proc.returncode == 0, output[-3000:]
    assert "samples" in output  # the shard is planned; its job rejects the hostile lines
