"""Hostile dataset records (specbuild.infra.records): each is one reject with file, line and reason;
the shard keeps every good record and its counts add up, at workflow parse time too."""

import json

import pytest

from specbuild.infra.io import read_json, read_jsonl, write_jsonl
from specbuild.infra.records import MAX_DEPTH, RecordError, parse_record
from specbuild.rejects import ShardFiles
from specbuild.samples import SampleSettings, iter_raw_records, record_digests, write_sample_shard

DEEP = b'{"prompt": "a", "x": ' + b"[" * 1500 + b"]" * 1500 + b"}"

# (raw line, reason): every way the JSON decoder fails, raises or silently changes a record
HOSTILE = [
    (DEEP, f"nested deeper than {MAX_DEPTH} levels"),
    (b'{"prompt": "a", "x": ' + b"[" * 80 + b"]" * 80 + b"}", "nested deeper than"),
    (b'{"prompt": "real", "prompt": "forged"}', "duplicate key 'prompt'"),
    (b'{"prompt": "a", "score": NaN}', "NaN is not a JSON number"),
    (b'{"prompt": "a", "score": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"prompt": "a", "score": 1e999}', "number '1e999' is out of range"),
    (b'{"prompt": "a", "n": ' + b"9" * 5000 + b"}", "unreadable number (Exceeds the limit"),
    (b'{"prompt": "a \\ud800 b"}', "lone surrogate (\\ud800)"),
    (b'{"\\udfff": 1, "prompt": "a"}', "lone surrogate (\\udfff)"),
    (b'{"prompt": "caf\xe9"}', "not UTF-8 (byte 15"),
    (b'{"prompt": "a"', "malformed JSON: Expecting ',' delimiter"),
]


def test_records_ending_at_a_carriage_return_are_told_so_and_other_extra_data_is_not():
    with pytest.raises(RecordError) as err:
        parse_record(b'{"prompt": "a"}\r{"prompt": "b"}\r')
    assert str(err.value).startswith(
        "malformed JSON: Extra data, column 17 (records end at \\r here; lines end at \\n only"
    )
    with pytest.raises(RecordError) as err:
        parse_record(b'{"prompt": "a"} {"prompt": "b"}')
    assert str(err.value) == "malformed JSON: Extra data, column 17"


@pytest.mark.parametrize(("raw", "reason"), HOSTILE, ids=range(len(HOSTILE)))
def test_every_decoder_failure_is_a_record_error_with_its_reason(raw, reason):
    with pytest.raises(RecordError) as err:
        parse_record(raw)
    assert reason in str(err.value)


def test_a_record_as_deep_as_the_limit_and_an_astral_character_are_read():
    assert parse_record("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    assert parse_record('{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


def _shard(tmp_path, raw, **kw):
    out, rej, counts = tmp_path / "s.jsonl", tmp_path / "r.jsonl", tmp_path / "c.json"
    files = ShardFiles(out=out, rejected=rej, counts=counts)
    fields = {k: kw.pop(k) for k in ("fmt", "prompt_key", "id_key") if k in kw}
    fields["max_prompt_tokens"] = kw.pop("max_prompt_tokens", None)
    write_sample_shard(raw=raw, files=files, dataset="d", settings=SampleSettings(**fields), **kw)
    return list(read_jsonl(out)), list(read_jsonl(rej)), read_json(counts)


def _hostile_jsonl(tmp_path, id_key=None):
    """A good record, then each hostile line after its own good record."""
    lines = []
    for i, (raw, _) in enumerate(HOSTILE):
        good = {"prompt": f"good {i}"} | ({id_key: f"g{i}"} if id_key else {})
        lines += [json.dumps(good).encode(), raw]
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("id_key", [None, "id"])
def test_a_shard_of_hostile_records_rejects_each_with_its_line_and_keeps_the_good(tmp_path, id_key):
    raw = _hostile_jsonl(tmp_path, id_key)
    # with id_key the workflow reads every record's id at parse time: no record may stop it
    assert len(record_digests(raw, shard_size=100, id_key=id_key)) == 1
    rows, bad, counts = _shard(tmp_path, raw, start=0, stop=100, id_key=id_key)
    n = len(HOSTILE)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (2 * n, n, n)
    assert [r["messages"][0]["content"] for r in rows] == [f"good {i}" for i in range(n)]
    assert [b["line"] for b in bad] == [2 * i + 2 for i in range(n)]
    assert all(b["file"] == str(raw) for b in bad)
    for b, (_, reason) in zip(bad, HOSTILE, strict=True):
        assert reason in b["reason"]


def test_a_json_list_rejects_its_hostile_items_one_by_one(tmp_path):
    items = [b'{"prompt": "first"}'] + [raw for raw, _ in HOSTILE[:-2]] + [b'{"prompt": "last"}']
    raw = tmp_path / "raw.json"
    raw.write_bytes(b"[\n" + b",\n".join(items) + b"\n]\n")
    assert [r.line for r in iter_raw_records(raw)] == list(range(1, len(items) + 1))
    assert len(record_digests(raw, shard_size=4, id_key="id")) == 3
    rows, bad, counts = _shard(tmp_path, raw, start=0, stop=100)
    assert [r["messages"][0]["content"] for r in rows] == ["first", "last"]
    assert (counts["in"], counts["kept"], counts["rejected"]) == (len(items), 2, len(items) - 2)
    for b, (_, reason) in zip(bad, HOSTILE[:-2], strict=True):
        assert reason in b["reason"]


def test_a_json_list_with_a_broken_item_fails_as_a_whole_naming_its_line(tmp_path):
    raw = tmp_path / "raw.json"
    raw.write_text('[{"prompt": "a"},\n {"prompt": "b"}\n {"prompt": "c"}]')
    with pytest.raises(ValueError, match=r"raw\.json:3: not valid JSON \(Expecting ','"):
        record_digests(raw, shard_size=2)


def test_reformatting_a_json_list_changes_no_digest(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('[{"prompt": "x", "id": 1}, {"prompt": "y"}]')
    b.write_text('[\n  {"id": 1,\n   "prompt": "x"},\n  {"prompt":"y"}\n]\n')
    assert record_digests(a, shard_size=1) == record_digests(b, shard_size=1)


def test_a_bench_set_lists_each_hostile_row_by_line_and_reason(tmp_path):
    from specbuild.bench.sets import read_bench_prompts

    raw = _hostile_jsonl(tmp_path)
    with pytest.raises(ValueError) as err:
        read_bench_prompts(raw, format="prompt")
    msg = str(err.value)
    assert f"{len(HOSTILE)} bad row(s)" in msg
    assert f"raw.jsonl:2: nested deeper than {MAX_DEPTH} levels" in msg
    assert "raw.jsonl:6: duplicate key 'prompt'" in msg


def test_a_project_file_with_a_line_nested_too_deep_fails_naming_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"id": "a"}])
    path.write_bytes(path.read_bytes() + DEEP + b"\n")
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: unreadable JSON \(RecursionError\)"):
        list(read_jsonl(path))
