"""Stage `vocab`: the draft vocabulary keeps the most frequent assistant tokens, and d2t/t2d
map draft ids to target ids the way SGLang's EAGLE-3 path reads them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from specbuild.eagle.target_info import read_target_info
from specbuild.hidden.tokens import TokenizedShardError
from specbuild.infra.io import read_json, write_json, write_jsonl
from specbuild.vocab import (
    VocabError,
    build_vocab,
    build_vocab_map,
    check_vocab_map,
    count_masked_tokens,
)


def _row(i: int, ids: list[int], mask: list[int]) -> dict:
    n_prompt = mask.index(1) if 1 in mask else len(mask)
    return {
        "id": f"r{i}",
        "input_ids": ids,
        "loss_mask": mask,
        "seq_len": len(ids),
        "n_prompt_tokens": n_prompt,
        "n_response_tokens": len(ids) - n_prompt,
        "has_reasoning": False,
        "finish_reason": "stop",
    }


def test_d2t_maps_each_draft_id_back_to_its_target_id():
    vmap = build_vocab_map(Counter({5: 3, 2: 3, 9: 1}), draft_size=2, target_size=10)
    assert [i + int(vmap.d2t[i]) for i in range(2)] == [2, 5]  # ties break by token id


def test_most_frequent_tokens_win_and_draft_ids_are_sorted_by_target_id():
    counts = Counter({7: 10, 3: 1, 8: 5, 1: 5, 4: 2})
    vmap = build_vocab_map(counts, draft_size=3, target_size=10)
    assert vmap.draft_ids.tolist() == [1, 7, 8]  # 7 (10), then 1 and 8 (5 each); 4 and 3 out
    assert vmap.d2t.tolist() == [1, 6, 6]
    assert vmap.t2d.nonzero().flatten().tolist() == [1, 7, 8]
    assert vmap.filler == 0


def test_ties_at_the_cut_break_by_smaller_token_id_deterministically():
    counts = Counter({9: 2, 4: 2, 6: 2, 0: 3})
    a = build_vocab_map(counts, draft_size=3, target_size=10)
    b = build_vocab_map(Counter(dict(reversed(list(counts.items())))), draft_size=3, target_size=10)
    assert a.draft_ids.tolist() == [0, 4, 6] == b.draft_ids.tolist()


def test_too_few_distinct_tokens_are_filled_with_the_smallest_unused_ids():
    vmap = build_vocab_map(Counter({2: 4, 5: 1}), draft_size=5, target_size=10)
    assert vmap.draft_ids.tolist() == [0, 1, 2, 3, 5]
    assert vmap.filler == 3


def test_draft_size_is_capped_at_the_target_vocabulary():
    vmap = build_vocab_map(Counter({1: 1}), draft_size=32000, target_size=6)
    assert vmap.d2t.tolist() == [0] * 6 and bool(vmap.t2d.all())


def test_built_maps_hold_every_invariant_on_random_counts():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (2000,), generator=g).tolist()
    vmap = build_vocab_map(Counter(ids), draft_size=100, target_size=500)
    check_vocab_map(vmap.d2t, vmap.t2d)
    d2t, t2d = vmap.d2t, vmap.t2d
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert bool((d2t[1:] >= d2t[:-1]).all())  # non-decreasing
    targets = torch.arange(100) + d2t
    assert bool(t2d[targets].all()) and int(t2d.sum()) == 100
    assert len(set(targets.tolist())) == 100


@pytest.mark.parametrize(
    ("d2t", "t2d", "fault"),
    [
        ([0, 2, 1], [1, 0, 1, 1, 0, 0], "d2t decreases"),
        ([0, -1], [1, 1, 0], "negative offsets"),
        ([0, 5], [1, 0, 0], "past the target vocabulary"),
        ([0, 1], [1, 1, 0, 0], "t2d is False"),
        ([0, 0], [1, 1, 1], "t2d marks 3 target ids, d2t has 2"),
    ],
)
def test_broken_maps_are_rejected_with_the_broken_invariant(d2t, t2d, fault):
    with pytest.raises(VocabError, match=fault):
        check_vocab_map(torch.tensor(d2t), torch.tensor(t2d, dtype=torch.bool))


def test_only_loss_masked_tokens_are_counted_across_shards(tmp_path):
    a, b = tmp_path / "00000.jsonl", tmp_path / "00001.jsonl"
    write_jsonl(a, [_row(0, [1, 2, 3, 4], [0, 0, 1, 1]), _row(1, [4, 4], [0, 1])])
    write_jsonl(b, [_row(2, [9, 3, 3], [1, 1, 0])])
    assert count_masked_tokens([a, b], vocab_size=10) == Counter({3: 2, 4: 2, 9: 1})


def _meta(tmp_path, target_dir, **override):
    info = read_target_info(target_dir / "fingerprint.json")
    meta = {
        "target_fingerprint": info.fingerprint,
        "tokenizer_fingerprint": info.tokenizer_fingerprint,
        "chat_template_sha256": info.chat_template_sha256,
        "rows": 2,
        "rejected": 0,
    }
    path = tmp_path / "00000.meta.json"
    write_json(path, {**meta, **override})
    return path


def test_build_vocab_writes_the_map_and_coverage_stats(tmp_path, target_dir):
    shard = tmp_path / "00000.jsonl"
    write_jsonl(shard, [_row(0, [10, 11, 12, 12, 13], [0, 1, 1, 1, 1]), _row(1, [13], [1])])
    out, stats_out = tmp_path / "vocab.safetensors", tmp_path / "vocab_stats.json"
    stats = build_vocab(
        tokens=[shard],
        metas=[_meta(tmp_path, target_dir)],
        fingerprint=target_dir / "fingerprint.json",
        out=out,
        stats_out=stats_out,
        draft_size=2,
    )
    tensors = load_file(out)
    assert set(tensors) == {"d2t", "t2d"} and tensors["t2d"].shape == (49152,)
    assert (torch.arange(2) + tensors["d2t"]).tolist() == [12, 13]  # 12 and 13 twice; 11 once
    assert stats == read_json(stats_out)
    assert stats["masked_tokens"] == 5 and stats["distinct_tokens"] == 3
    assert stats["coverage"] == pytest.approx(4 / 5) and stats["filler_ids"] == 0


def test_shards_without_any_assistant_token_fail_the_vocab(tmp_path, target_dir):
    shard = tmp_path / "00000.jsonl"
    write_jsonl(shard, [_row(0, [1, 2], [0, 0])])
    with pytest.raises(VocabError, match="no token with loss_mask 1"):
        build_vocab(
            tokens=[shard],
            metas=[_meta(tmp_path, target_dir)],
            fingerprint=target_dir / "fingerprint.json",
            out=tmp_path / "v.safetensors",
            stats_out=tmp_path / "s.json",
        )


def test_rows_from_another_tokenizer_stop_the_vocab(tmp_path, target_dir):
    shard = tmp_path / "00000.jsonl"
    write_jsonl(shard, [_row(0, [1, 2], [0, 1])])
    meta = _meta(tmp_path, target_dir, tokenizer_fingerprint="cd" * 32)
    with pytest.raises(TokenizedShardError, match="(?s)00000.meta.json.*tokenizer cdcdcdcd"):
        build_vocab(
            tokens=[shard],
            metas=[meta],
            fingerprint=target_dir / "fingerprint.json",
            out=tmp_path / "v.safetensors",
            stats_out=tmp_path / "s.json",
        )
    assert not (tmp_path / "v.safetensors").exists()


def test_two_writes_of_the_vocab_are_byte_identical(tmp_path, target_dir):
    # safetensors alone writes the metadata in a hash map's order, which changes per write
    shard = tmp_path / "00000.jsonl"
    write_jsonl(shard, [_row(0, [10, 11, 12, 12, 13], [0, 1, 1, 1, 1]), _row(1, [13], [1])])
    written = set()
    for i in range(8):
        out = tmp_path / f"{i}" / "vocab.safetensors"
        build_vocab(
            tokens=[shard],
            metas=[_meta(tmp_path, target_dir)],
            fingerprint=target_dir / "fingerprint.json",
            out=out,
            stats_out=out.with_name("vocab_stats.json"),
            draft_size=2,
        )
        written.add(out.read_bytes())
    assert len(written) == 1
