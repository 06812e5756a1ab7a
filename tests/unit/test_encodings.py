"""Users' files as they come: a UTF-8 BOM, UTF-16/32, gzip; every record counted once, at the
line a text editor shows it on."""

import codecs
import gzip
import json
import re

import pytest

from specbuild.bench.sets import read_bench_prompts
from specbuild.infra.io import detect_encoding, iter_utf8_lines, read_jsonl, read_text_any
from specbuild.rejects import ShardFiles
from specbuild.samples import SampleSettings, record_digests, write_sample_shard

# Six records and a blank line; the fifth is broken, so line numbers can be checked.
LINES = [
    '{"prompt": "café 1"}',
    '{"prompt": "q2"}',
    "",
    '{"prompt": "q3"}',
    '{"prompt": "q4"}',
    '{"prompt": "unterminated',
    '{"prompt": "q6 ✓"}',
]
TEXT = "\r\n".join(LINES) + "\r\n"  # Windows line ends, as its editors save


def _shard(tmp_path, raw):
    out, rej, counts = tmp_path / "s.jsonl", tmp_path / "r.jsonl", tmp_path / "c.json"
    write_sample_shard(
        raw=raw,
        files=ShardFiles(out=out, rejected=rej, counts=counts),
        dataset="d",
        start=0,
        stop=100,
        settings=SampleSettings(max_prompt_tokens=None),
    )
    return list(read_jsonl(out)), list(read_jsonl(rej)), json.loads(counts.read_text())


ENCODED = {
    "utf-8-bom": codecs.BOM_UTF8 + TEXT.encode("utf-8"),
    "utf-16": TEXT.encode("utf-16"),  # BOM + the machine's byte order
    "utf-16-be": codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"),
    "utf-16-le no BOM": TEXT.encode("utf-16-le"),
    "utf-32": TEXT.encode("utf-32"),
}


@pytest.mark.parametrize("name", ENCODED)
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_every_encoding_keeps_each_record_at_its_line(tmp_path, name, gz):
    data = ENCODED[name]
    raw = tmp_path / ("raw.jsonl.gz" if gz else "raw.jsonl")
    raw.write_bytes(gzip.compress(data) if gz else data)
    assert len(record_digests(raw, shard_size=4)) == 2  # 6 records: the DAG sees two shards
    rows, bad, counts = _shard(tmp_path, raw)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (6, 5, 1)
    assert [r["messages"][0]["content"] for r in rows] == ["café 1", "q2", "q3", "q4", "q6 ✓"]
    assert [r["source"]["line"] for r in rows] == [1, 2, 4, 5, 7]
    assert [(b["line"], b["reason"]) for b in bad] == [
        (6, "malformed JSON: Unterminated string starting at, column 12")
    ]


def test_a_bom_file_shards_exactly_as_its_plain_utf8_twin(tmp_path):
    plain, bom = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plain.write_bytes(TEXT.encode())
    bom.write_bytes(ENCODED["utf-8-bom"])
    assert record_digests(bom, shard_size=4) == record_digests(plain, shard_size=4)


def test_a_gzipped_json_list_is_read_like_the_plain_one(tmp_path):
    items = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]
    raw = tmp_path / "raw.json.gz"
    raw.write_bytes(gzip.compress(json.dumps(items).encode("utf-16")))
    rows, bad, counts = _shard(tmp_path, raw)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (3, 3, 0) and bad == []
    assert [r["messages"][0]["content"] for r in rows] == ["a", "b", "c"]


def test_a_gz_name_on_a_file_that_is_not_gzip_fails_naming_it(tmp_path):
    raw = tmp_path / "raw.jsonl.gz"
    raw.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=r"raw\.jsonl\.gz: not a readable gzip file .* drop the"):
        record_digests(raw, shard_size=2)


def corrupt_gzip(data: bytes) -> bytes:
    """`data` gzipped, then bytes 200-260 flipped: the gzip header stays valid, its deflate
    stream does not (zlib, not gzip, raises on it)."""
    packed = bytearray(gzip.compress(data))
    packed[200:260] = bytes(b ^ 0xFF for b in packed[200:260])
    return bytes(packed)


RECORDS = [{"id": f"q{i}", "prompt": "x"} for i in range(2000)]
CORRUPT = {
    "raw.jsonl.gz": b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS),
    "raw.json.gz": json.dumps(RECORDS).encode(),
}


@pytest.mark.parametrize("name", CORRUPT)
def test_a_corrupt_gzip_fails_naming_the_file_like_a_truncated_one(tmp_path, name):
    raw = tmp_path / name
    raw.write_bytes(corrupt_gzip(CORRUPT[name]))
    readable = re.escape(f"{raw}: not a readable gzip file (Error -3 while decompressing")
    with pytest.raises(ValueError, match=readable):
        record_digests(raw, shard_size=4)
    raw.write_bytes(gzip.compress(CORRUPT[name])[:300])  # cut short: the same message
    with pytest.raises(ValueError, match=re.escape(f"{raw}: not a readable gzip file (")):
        record_digests(raw, shard_size=4)


def test_a_corrupt_gzipped_bench_set_fails_naming_the_file(tmp_path):
    path = tmp_path / "set.jsonl.gz"
    path.write_bytes(corrupt_gzip(CORRUPT["raw.jsonl.gz"]))
    with pytest.raises(ValueError, match=r"set\.jsonl\.gz: not a readable gzip file \(Error -3"):
        read_bench_prompts(path, format="prompt")


def test_an_unknown_name_suggests_gz_after_the_format(tmp_path):
    raw = tmp_path / "raw.txt.gz"
    raw.write_bytes(gzip.compress(b'{"prompt": "a"}\n'))
    with pytest.raises(ValueError, match=r"cannot tell .* with \.gz after it"):
        record_digests(raw, shard_size=2)


def test_a_latin1_line_in_a_utf8_file_is_one_reject_not_a_failed_file(tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(codecs.BOM_UTF8 + b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n{"prompt": "b"}\n')
    rows, bad, counts = _shard(tmp_path, raw)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (3, 2, 1)
    assert [(b["line"], b["reason"]) for b in bad] == [(2, "not UTF-8 (byte 15: b'\\xe9')")]


def test_a_utf16_file_cut_mid_character_rejects_its_last_line_naming_the_codec(tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(ENCODED["utf-16-be"] + b"\x00")  # one byte of a two-byte unit
    lines = list(iter_utf8_lines(raw))
    assert [n for n, _ in lines] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert lines[7][1].fault == "not UTF-16-BE (byte 0: b'\\x00', truncated data)"


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le"])
def test_a_bad_character_in_a_utf16_or_32_file_rejects_its_line_alone_at_its_number(
    tmp_path, encoding
):
    # a lone high surrogate: what an editor leaves of an emoji cut in half
    bad = '{"prompt": "cut \ud83d here"}'.encode(encoding, "surrogatepass")
    lines = [json.dumps({"prompt": f"q{i}"}).encode(encoding) for i in range(1, 6)]
    newline = "\r\n".encode(encoding)
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(newline.join(lines[:2] + [bad] + lines[2:]) + newline)
    assert len(record_digests(raw, shard_size=4)) == 2  # 6 records: none lost at parse time
    rows, rejected, counts = _shard(tmp_path, raw)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (6, 5, 1)
    assert [r["messages"][0]["content"] for r in rows] == ["q1", "q2", "q3", "q4", "q5"]
    assert [r["source"]["line"] for r in rows] == [1, 2, 4, 5, 6]
    (reject,) = rejected
    assert reject["line"] == 3 and reject["raw"] == '{"prompt": "cut \ufffd here"}'
    unit = 4 if "32" in encoding else 2
    assert reject["reason"].startswith(f"not {encoding.upper()} (byte {16 * unit}: ")


def test_a_bench_set_in_utf16_names_a_bad_line_by_its_number(tmp_path):
    text = '{"prompt": "a"}\n{"prompt": "b \ud800"}\n{"prompt": "c"}\n'
    path = tmp_path / "set.jsonl"
    path.write_bytes(text.encode("utf-16", "surrogatepass"))
    with pytest.raises(ValueError, match=r"(?s)1 bad row.*set\.jsonl:2: not UTF-16-LE \(byte 28: "):
        read_bench_prompts(path, format="prompt")


def test_read_text_any_names_the_encoding_a_bad_byte_breaks(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'["caf\xe9"]')
    with pytest.raises(ValueError, match=r"x\.json: not UTF-8 \(byte 5: b'\\xe9'\)"):
        read_text_any(path)


CJK = '{"prompt": "' + "你好世界" * 40 + '"}'


@pytest.mark.parametrize(
    ("head", "encoding"),
    [
        (b"\xef\xbb\xbf{", ("utf-8", 3)),
        (b"\xff\xfe\x00\x00", ("utf-32-le", 4)),
        (b"\xff\xfe{\x00", ("utf-16-le", 2)),
        (b"{\x00\x00\x00", ("utf-32-le", 0)),
        (b"\x00{", ("utf-16-be", 0)),
        (b"{}", ("utf-8", 0)),
        (b"", ("utf-8", 0)),
        # NULs where UTF-16 would have them, then UTF-8 text: a stray NUL, not UTF-16
        (b'{\x00"id": "x"}\n{"id": "q0", "prompt": "What is 0+0?"}\n', ("utf-8", 0)),
        (b'{\x00\x00\x00"id": "x"}\n{"id": "q0", "prompt": "What is 0+0?"}\n', ("utf-8", 0)),
        # text in another script, UTF-16 without a BOM: JSON's own characters interleave it
        (CJK.encode("utf-16-le")[:256], ("utf-16-le", 0)),
        (CJK.encode("utf-16-be")[:256], ("utf-16-be", 0)),
        (CJK.encode("utf-32-le")[:256], ("utf-32-le", 0)),
    ],
)
def test_detect_encoding_reads_boms_and_nul_patterns(head, encoding):
    assert detect_encoding(head) == encoding


@pytest.mark.parametrize("pad", [False, True], ids=["odd", "even"])
def test_a_nul_in_a_utf8_files_first_line_rejects_that_line_alone(tmp_path, pad):
    good = [json.dumps({"id": f"q{i}", "prompt": f"What is {i}+{i}?"}) for i in range(50)]
    data = b'{\x00"id":"x"}\n' + "\n".join(good).encode() + b"\n"
    data += b" " * (pad and len(data) % 2)  # an even length decodes as UTF-16 without error
    raw = tmp_path / "raw.jsonl"
    raw.write_bytes(data)
    assert len(record_digests(raw, shard_size=16)) == 4  # 51 records
    rows, bad, counts = _shard(tmp_path, raw)
    assert (counts["in"], counts["kept"], counts["rejected"]) == (51, 50, 1)
    assert [r["messages"][0]["content"] for r in rows] == [f"What is {i}+{i}?" for i in range(50)]
    assert [(b["line"], b["raw"]) for b in bad] == [(1, '{\x00"id":"x"}')]
    assert bad[0]["reason"].startswith("malformed JSON")


@pytest.mark.parametrize("name", ["utf-8-bom", "utf-16"])
def test_a_bench_set_in_utf16_or_with_a_bom_gzipped_reads_every_prompt(tmp_path, name):
    text = "\n".join(json.dumps({"prompt": f"p{i}"}) for i in range(4)) + "\n"
    data = codecs.BOM_UTF8 + text.encode() if name == "utf-8-bom" else text.encode("utf-16")
    path = tmp_path / "set.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    prompts = read_bench_prompts(path, format="prompt")
    assert [(p.id, p.turns) for p in prompts] == [(str(i), (f"p{i}",)) for i in range(4)]


def test_a_bench_set_names_a_bad_line_by_its_number(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + b'{"prompt": "a"}\n\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"(?s)1 bad row.*set\.jsonl:3: not UTF-8 \(byte 15: "):
        read_bench_prompts(path, format="prompt")
