"""Stage `samples`: three input formats, stable ids, fixed shards, and rejected rows kept."""

import json

import pytest

from specbuild.io import read_json, read_jsonl
from specbuild.samples import (
    SampleError,
    normalize_sample,
    record_digests,
    write_sample_shard,
)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plain_prompt_becomes_one_user_turn():
    assert normalize_sample({"question": "2+2?"}, fmt="prompt", prompt_key="question") == [
        {"role": "user", "content": "2+2?"}
    ]


def test_openai_messages_keep_roles_and_reasoning():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
    ]
    out = normalize_sample({"messages": msgs}, fmt="messages")
    assert [m["role"] for m in out] == ["system", "user", "assistant"]
    assert out[2]["reasoning_content"] == "greet back"


def test_sharegpt_speakers_map_to_openai_roles():
    conv = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]
    out = normalize_sample({"conversations": conv}, fmt="sharegpt")
    assert out == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def test_auto_format_detects_each_row_by_its_fields():
    assert normalize_sample({"prompt": "a"})[0]["content"] == "a"
    assert normalize_sample({"messages": [{"role": "user", "content": "b"}]})[0]["content"] == "b"
    assert (
        normalize_sample({"conversations": [{"from": "human", "value": "c"}]})[0]["content"] == "c"
    )


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role 'robot'"),
        ({"messages": [{"role": "user", "content": "  "}]}, "empty content"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown speaker 'alien'"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "no user turn"),
        ({"text": "x"}, "cannot detect format"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_records_are_rejected_with_a_reason(record, reason):
    with pytest.raises(SampleError, match=reason):
        normalize_sample(record)


def test_shard_digests_of_earlier_shards_survive_appending(tmp_path):
    rows = [{"prompt": f"q{i}"} for i in range(10)]
    raw = _write_jsonl(tmp_path / "raw.jsonl", rows)
    before = record_digests(raw, shard_size=4)
    _write_jsonl(raw, rows + [{"prompt": f"q{i}"} for i in range(10, 15)])
    after = record_digests(raw, shard_size=4)
    assert len(before) == 3 and len(after) == 4
    assert after[:2] == before[:2]  # full shards untouched
    assert after[2] != before[2]  # the partial last shard grew


def _shard(tmp_path, raw, **kw):
    """write_sample_shard into tmp_path; (kept rows, rejects, counts)."""
    out, rej, counts = tmp_path / "s.jsonl", tmp_path / "r.jsonl", tmp_path / "c.json"
    kw = {"dataset": "d", "start": 0, "stop": 100, **kw}
    write_sample_shard(raw=raw, out=out, rejected=rej, counts=counts, **kw)
    return list(read_jsonl(out)), list(read_jsonl(rej)), read_json(counts)


def test_ids_are_stable_record_positions_and_shards_are_slices(tmp_path):
    raw = _write_jsonl(tmp_path / "raw.jsonl", [{"prompt": f"q{i}"} for i in range(7)])
    rows, _, _ = _shard(tmp_path, raw, start=4, stop=8)
    assert [r["id"] for r in rows] == ["d-0000004", "d-0000005", "d-0000006"]
    assert rows[0]["messages"][0]["content"] == "q4"


def test_broken_lines_go_to_the_rejected_file_and_counts_add_up(tmp_path):
    raw = tmp_path / "raw.jsonl"
    good = [json.dumps({"prompt": f"q{i}"}).encode() for i in range(16)]
    broken = [
        b'{"prompt": "unterminated',
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
        json.dumps({"prompt": ""}).encode(),
        b'{"prompt": "caf\xe9"}',  # latin-1 byte, not UTF-8
    ]
    raw.write_bytes(b"\n".join(good[:8] + broken + good[8:]) + b"\n")
    rows, bad, counts = _shard(tmp_path, raw)
    assert (len(rows), len(bad)) == (16, 4)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (20, 16, 4)
    assert [b["line"] for b in bad] == [9, 10, 11, 12]
    reasons = " | ".join(b["reason"] for b in bad)
    for part in ("malformed JSON", "unknown role 'wizard'", "empty content", "not UTF-8"):
        assert part in reasons
    assert all(b["file"] == str(raw) for b in bad)


def test_a_shard_with_every_record_rejected_is_still_written_for_its_check(tmp_path):
    # The share is judged by the check job (rejects.py), not here: the outputs do not depend
    # on the limit, so changing the limit cannot make them stale.
    raw = tmp_path / "raw.jsonl"
    raw.write_text("not json\n{}\n")
    rows, bad, counts = _shard(tmp_path, raw)
    assert rows == [] and len(bad) == 2 and counts["rejected"] == counts["in"] == 2


def test_json_list_input_is_read_like_jsonl(tmp_path):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]))
    assert len(record_digests(raw, shard_size=2)) == 2
    rows, _, _ = _shard(tmp_path, raw, start=2, stop=4)
    assert [r["messages"][0]["content"] for r in rows] == ["c"]
