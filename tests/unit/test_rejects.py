"""Rejected rows: published with counts that add up, and judged against the limit by checks
that keep the rejects where the message says."""

import pytest

from specbuild.infra.io import read_json, read_jsonl
from specbuild.rejects import ShardFiles, check_reject_table, check_rejected_share, publish_shard


def _publish(folder, rows, bad, n_in):
    folder.mkdir(parents=True, exist_ok=True)
    n = publish_shard(
        ShardFiles(
            out=folder / "00000.jsonl",
            rejected=folder / "00000.rejected.jsonl",
            counts=folder / "00000.counts.json",
        ),
        rows=iter(rows),
        bad=bad,
        n_in=n_in,
        label="test",
    )
    return n, folder / "00000.counts.json"


def test_rows_rejects_and_counts_are_written(tmp_path):
    n, counts = _publish(tmp_path, [{"id": "a"}, {"id": "b"}], [{"id": "c", "reason": "empty"}], 3)
    assert n == 2
    assert [r["id"] for r in read_jsonl(tmp_path / "00000.jsonl")] == ["a", "b"]
    assert list(read_jsonl(tmp_path / "00000.rejected.jsonl")) == [{"id": "c", "reason": "empty"}]
    assert {k: read_json(counts)[k] for k in ("in", "kept", "rejected")} == {
        "in": 3,
        "kept": 2,
        "rejected": 1,
    }


def test_many_rejects_log_the_first_ones_then_a_count_by_reason(tmp_path, caplog):
    # a self-written shard rejected 1,821 of 10,240 prompts for one reason: one line each
    # buried the job's log; every row is in the rejects file anyway
    bad = [{"id": f"chat-{i}", "reason": "prompt not finished"} for i in range(24)]
    bad.append({"id": "chat-24", "reason": "empty"})
    with caplog.at_level("WARNING", logger="specbuild"):
        _publish(tmp_path, [], bad, len(bad))
    lines = caplog.text.splitlines()
    assert len(lines) == 11 and "rejected chat-9: prompt not finished" in lines[9]
    assert "rejected 25 rows in all, each in " in lines[10]
    assert lines[10].endswith("most often: 24 x prompt not finished; 1 x empty")
    assert len(list(read_jsonl(tmp_path / "00000.rejected.jsonl"))) == 25


def test_a_row_lost_without_a_reason_fails_the_shard(tmp_path):
    with pytest.raises(RuntimeError, match="in=3 but kept 1 \\+ rejected 1"):
        _publish(tmp_path, [{"id": "a"}], [{"id": "c", "reason": "empty"}], 3)


def test_publishing_never_judges_the_share(tmp_path):
    # Every row rejected: the shard is still written; only its check may fail.
    n, counts = _publish(tmp_path, [], [{"id": i, "reason": "bad"} for i in "abcd"], 4)
    assert n == 0 and read_json(counts)["rejected"] == 4


def test_a_share_within_the_limit_passes_and_records_the_verdict(tmp_path):
    _, counts = _publish(tmp_path / "s", [{"id": "a"}], [{"id": "b", "reason": "bad"}], 2)
    verdict = check_rejected_share(
        counts=counts, out=tmp_path / "ok.json", limit=0.5, setting="samples.max_rejected_fraction"
    )
    assert verdict["ok"] and read_json(tmp_path / "ok.json")["share"] == 0.5


def test_a_share_over_the_limit_fails_and_keeps_a_copy_of_the_rejects_beside_the_log(tmp_path):
    bad = [{"id": i, "reason": "bad"} for i in "bcd"]
    _, counts = _publish(tmp_path / "s", [{"id": "a"}], bad, 4)
    log = tmp_path / "logs" / "00000.log"
    copy = tmp_path / "logs" / "00000.rejected.jsonl"
    with pytest.raises(RuntimeError) as err:
        check_rejected_share(
            counts=counts,
            out=tmp_path / "ok.json",
            limit=0.5,
            setting="generate.max_rejected_fraction",
            log_path=log,
        )
    message = str(err.value)
    assert "3 of 4 rows rejected (75.0% > generate.max_rejected_fraction 50.0%)" in message
    assert str(tmp_path / "s" / "00000.rejected.jsonl") in message and str(copy) in message
    assert list(read_jsonl(copy)) == bad
    assert "FAILED" in log.read_text() and not (tmp_path / "ok.json").exists()


def test_the_reject_table_lists_every_shard_over_its_limit_at_once(tmp_path):
    one = [{"id": "a"}]
    _publish(tmp_path / "samples" / "d", one, [], 1)
    _publish(tmp_path / "generated" / "d", one, [{"id": "b", "reason": "x"}], 2)
    _publish(tmp_path / "tokenized" / "d", [], [{"id": "a", "reason": "y"}], 1)
    counts = sorted(tmp_path.rglob("*.counts.json"))
    limits = {
        f"{s}/d": {"limit": 0.4, "setting": f"{s}.max_rejected_fraction"}
        for s in ("samples", "generated", "tokenized")
    }
    csv_path, md_path = tmp_path / "t.csv", tmp_path / "t.md"
    with pytest.raises(RuntimeError, match="2 shard\\(s\\) over") as err:
        check_reject_table(counts=counts, limits=limits, csv_path=csv_path, md_path=md_path)
    assert "generated.max_rejected_fraction" in str(err.value)
    assert "tokenized.max_rejected_fraction" in str(err.value)
    limits = {k: {**v, "limit": 1.0} for k, v in limits.items()}
    rows = check_reject_table(counts=counts, limits=limits, csv_path=csv_path, md_path=md_path)
    assert [(r["stage"], r["shard"], r["share"], r["ok"]) for r in rows] == [
        ("generated", "00000", 0.5, True),
        ("samples", "00000", 0.0, True),
        ("tokenized", "00000", 1.0, True),
    ]
    assert csv_path.read_text().splitlines()[0].startswith("stage,dataset,shard,in,kept")
