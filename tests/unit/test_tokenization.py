"""Stage `tokenize`: loss_mask covers exactly the assistant tokens of SmolLM2's template."""

import json

import pytest

from specbuild.io import read_json, read_jsonl
from specbuild.tokenization import ROW_KEYS, RowRejected, tokenize_conversation, tokenize_shard

CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 = 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "It is 6."},
]


def _tok(tokenizer, messages, **kw):
    kw = {"row_id": "x", "finish_reason": "stop", "max_length": 512, "overlong": "truncate"} | kw
    return tokenize_conversation(tokenizer, messages, **kw).row


def _masked_text(tokenizer, row):
    return tokenizer.decode(
        [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    )


def test_golden_mask_on_smollm2_template(tokenizer):
    row = _tok(tokenizer, CHAT[:2])
    ids, mask = row["input_ids"], row["loss_mask"]
    # The trained tokens: the answer and <|im_end|>; never "assistant\n" nor the final "\n".
    assert _masked_text(tokenizer, row) == "2+2 = 4.<|im_end|>"
    first = mask.index(1)
    assert tokenizer.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(ids[len(ids) - 1 :]) == "\n" and mask[-1] == 0
    assert tokenizer.convert_ids_to_tokens(ids[first + sum(mask) - 1]) == "<|im_end|>"


def test_every_assistant_turn_is_masked_and_counts_add_up(tokenizer):
    row = _tok(tokenizer, CHAT)
    assert tuple(row) == ROW_KEYS
    assert row["seq_len"] == len(row["input_ids"]) == len(row["loss_mask"])
    assert row["seq_len"] == row["n_prompt_tokens"] + row["n_response_tokens"]
    assert _masked_text(tokenizer, row) == "2+2 = 4.<|im_end|>It is 6.<|im_end|>"


def test_reasoning_is_rendered_inline_and_flagged(tokenizer):
    msgs = [CHAT[0], {"role": "assistant", "content": "4", "reasoning_content": "add them"}]
    row = _tok(tokenizer, msgs)
    assert row["has_reasoning"] is True
    assert _masked_text(tokenizer, row) == "<think>\nadd them\n</think>\n\n4<|im_end|>"


def test_overlong_rows_are_truncated_or_dropped_by_policy(tokenizer):
    long = [CHAT[0], {"role": "assistant", "content": "word " * 200}]
    row = _tok(tokenizer, long, max_length=64)
    assert row["seq_len"] == 64 and row["n_response_tokens"] > 0
    with pytest.raises(RowRejected, match="overlong"):
        _tok(tokenizer, long, max_length=64, overlong="drop")
    with pytest.raises(RowRejected, match="no response token"):
        _tok(tokenizer, long, max_length=20)


def test_tokenize_shard_writes_rows_meta_and_rejects(tmp_path, target_dir, tokenizer):
    fp = read_json(target_dir / "fingerprint.json")
    gen = tmp_path / "gen.jsonl"
    rows = [
        {
            "id": "a",
            "messages": CHAT[:2],
            "finish_reason": "stop",
            "target_fingerprint": fp["fingerprint"],
        },
        {"id": "b", "messages": CHAT[:2], "finish_reason": "length", "target_fingerprint": "other"},
        {
            "id": "c",
            "messages": CHAT[:1],
            "finish_reason": "stop",
            "target_fingerprint": fp["fingerprint"],
        },
    ]
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, meta, rej = tmp_path / "t.jsonl", tmp_path / "t.meta.json", tmp_path / "t.rej.jsonl"
    record = tokenize_shard(
        generated=gen,
        fingerprint=target_dir / "fingerprint.json",
        out=out,
        meta=meta,
        rejected=rej,
        counts=tmp_path / "t.counts.json",
        max_length=512,
        overlong="truncate",
    )
    assert [r["id"] for r in read_jsonl(out)] == ["a"]
    reasons = {r["id"]: r["reason"] for r in read_jsonl(rej)}
    assert "another target fingerprint" in reasons["b"] and "no assistant turn" in reasons["c"]
    assert record["in"] == record["rows"] + record["rejected"] == 3
    assert read_json(tmp_path / "t.counts.json")["rejected"] == record["rejected"] == 2
    assert read_json(meta)["tokenizer_fingerprint"] == fp["tokenizer_fingerprint"]
