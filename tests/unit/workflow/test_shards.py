import json

import pytest

from specbuild.workflow.shards import DatasetFaults, ShardIndex
from tests.unit.test_encodings import CORRUPT, corrupt_gzip


def _file_config(path, shard_size=2, limit=None):
    dataset = {"path": str(path), "shard_size": shard_size, "limit": limit, "id_key": None}
    return {"datasets": {"d": {**dataset, "format": "prompt", "prompt_key": "prompt"}}}


def _write(path, n):
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(n)))


def test_shard_ids_are_zero_padded_and_expand_in_config_order():
    index = ShardIndex({"b": ["x", "y"], "a": ["z"]})
    assert index.ids("b") == ["00000", "00001"]
    assert index.expand("{dataset}/{shard}") == ["b/00000", "b/00001", "a/00000"]
    assert index.expand("{dataset}/{shard}", ["a"]) == ["a/00000"]


def test_appending_records_keeps_the_digests_of_full_shards(tmp_path):
    raw = tmp_path / "raw.jsonl"
    _write(raw, 4)
    before = ShardIndex.read(_file_config(raw)).digests["d"]
    _write(raw, 5)
    after = ShardIndex.read(_file_config(raw)).digests["d"]
    assert after[:2] == before and len(after) == 3


def test_a_synthetic_dataset_has_one_shard_per_slice_of_its_count():
    cfg = {"datasets": {"s": {"synthesize": {"count": 5}, "shard_size": 2, "limit": None}}}
    index = ShardIndex.read(cfg)
    assert index.digests["s"] == ["synthetic 0-2", "synthetic 2-4", "synthetic 4-5"]
    assert index.digest("s", "00002") == "synthetic 4-5"


def test_a_missing_or_empty_file_is_a_fault_naming_its_dataset_key(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    cfg = _file_config(tmp_path / "missing.jsonl")
    cfg["datasets"]["e"] = {**_file_config(tmp_path / "empty.jsonl")["datasets"]["d"]}
    with pytest.raises(DatasetFaults) as err:
        ShardIndex.read(cfg)
    assert [f.split(":")[0] for f in err.value.faults] == ["datasets.d.path", "datasets.e.path"]
    assert err.value.faults[1].endswith("holds no records")


def test_a_corrupt_gzip_dataset_is_a_fault_naming_its_key_and_file(tmp_path):
    raw = tmp_path / "raw.jsonl.gz"
    raw.write_bytes(corrupt_gzip(CORRUPT["raw.jsonl.gz"]))
    with pytest.raises(DatasetFaults) as err:
        ShardIndex.read(_file_config(raw))
    (fault,) = err.value.faults
    # zlib's own words after "Error -3" (a corrupt stream) vary with its version
    assert fault.startswith(f"datasets.d.path: {raw}: not a readable gzip file (Error -3 ")
    assert fault.endswith("or drop the .gz from the name")


def test_thousands_of_shards_get_one_line_of_advice_naming_the_key_and_a_size():
    from specbuild.workflow.shards import MANY_SHARDS, shard_advice

    cfg = {"datasets": {"big": {"shard_size": 64}, "small": {"shard_size": 64}}}
    index = ShardIndex({"big": ["x"] * 7813, "small": ["x"] * MANY_SHARDS})
    assert shard_advice(cfg, index) == [
        "datasets.big: 7,813 shards (shard_size 64): Snakemake plans several jobs a shard, so "
        "planning alone takes minutes and gigabytes; raise datasets.big.shard_size (e.g. to "
        "501: 999 shards). A new shard_size cuts the records anew: every shard of the dataset "
        "is rebuilt once"
    ]


def test_only_a_shard_whose_records_hold_tool_calls_changes_digest_with_their_rows(tmp_path):
    import hashlib

    from specbuild.samples import record_digests

    plain = b'{"prompt": "a"}\n{"prompt": "b"}\n'
    tools = (
        b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",'
        b' "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}\n'
    )
    path = tmp_path / "d.jsonl"
    path.write_bytes(plain + tools + plain)
    first, second, third = record_digests(path, shard_size=2)
    # a shard of plain records keeps the digest it had before rows kept tool calls: no rerun
    assert first == hashlib.sha256(plain).hexdigest()
    assert third == hashlib.sha256(plain[16:]).hexdigest()
    # the shard holding a tool call does not: it is built again, its calls kept this time
    assert second != hashlib.sha256(tools + plain[:16]).hexdigest()
