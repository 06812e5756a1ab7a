"""Publishing a shard with its rejects: counts add up, reasons kept, the share enforced."""

import pytest

from specbuild.io import read_jsonl
from specbuild.rejects import publish_shard


def _publish(tmp_path, rows, bad, n_in, limit=0.5):
    return publish_shard(
        out=tmp_path / "out.jsonl",
        rows=iter(rows),
        rejected=tmp_path / "out.rejected.jsonl",
        bad=bad,
        n_in=n_in,
        max_rejected_fraction=limit,
        label="test",
    )


def test_rows_and_rejects_are_written_and_counted(tmp_path):
    n = _publish(tmp_path, [{"id": "a"}, {"id": "b"}], [{"id": "c", "reason": "empty"}], 3)
    assert n == 2
    assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")] == ["a", "b"]
    assert list(read_jsonl(tmp_path / "out.rejected.jsonl")) == [{"id": "c", "reason": "empty"}]


def test_a_row_lost_without_a_reason_fails_the_shard(tmp_path):
    with pytest.raises(RuntimeError, match="in=3 but kept 1 \\+ rejected 1"):
        _publish(tmp_path, [{"id": "a"}], [{"id": "c", "reason": "empty"}], 3)


def test_too_many_rejects_fail_after_the_rejects_are_written(tmp_path):
    bad = [{"id": i, "reason": "bad"} for i in "bcd"]
    with pytest.raises(RuntimeError, match="3 of 4 rows rejected .* max_rejected_fraction"):
        _publish(tmp_path, [{"id": "a"}], bad, 4, limit=0.5)
    assert len(list(read_jsonl(tmp_path / "out.rejected.jsonl"))) == 3
