"""Stage `tokenize`: loss_mask covers exactly the assistant tokens of SmolLM2's template."""

import json

import pytest

from specbuild.infra.io import read_json, read_jsonl
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
    assert record["in"] == record["kept"] + record["rejected"] == 3 and record["rows"] == 1
    assert read_json(tmp_path / "t.counts.json")["rejected"] == record["rejected"] == 2
    assert read_json(meta)["tokenizer_fingerprint"] == fp["tokenizer_fingerprint"]


def _shard(tmp_path, target_dir, conversations, **kw):
    """tokenize_shard over a generated shard of `conversations` (id -> messages) on real
    files; (meta record, kept rows, rejects by id)."""
    fp = read_json(target_dir / "fingerprint.json")["fingerprint"]
    gen = tmp_path / "gen.jsonl"
    gen.write_text(
        "".join(
            json.dumps({"id": i, "messages": m, "finish_reason": "stop", "target_fingerprint": fp})
            + "\n"
            for i, m in conversations.items()
        )
    )
    kw = {"max_length": 512, "overlong": "truncate"} | kw
    record = tokenize_shard(
        generated=gen,
        fingerprint=target_dir / "fingerprint.json",
        out=tmp_path / "t.jsonl",
        meta=tmp_path / "t.meta.json",
        rejected=tmp_path / "t.rej.jsonl",
        counts=tmp_path / "t.counts.json",
        **kw,
    )
    rejects = {r["id"]: r["reason"] for r in read_jsonl(tmp_path / "t.rej.jsonl")}
    return record, list(read_jsonl(tmp_path / "t.jsonl")), rejects


def test_a_record_that_cannot_be_rendered_is_rejected_by_id_and_its_shard_kept(
    tmp_path, target_dir
):
    # a ShareGPT dump opening with the bot's greeting: the turn answers nothing, and rendering
    # the empty conversation before it raises inside transformers
    greeting = [{"role": "assistant", "content": "Hello! How can I help?"}] + CHAT[:2]
    good = {f"ok-{i}": CHAT[:2] for i in range(7)}
    record, rows, rejects = _shard(tmp_path, target_dir, {**good, "greet": greeting})
    assert [r["id"] for r in rows] == list(good)
    assert list(rejects) == ["greet"] and "before any user turn" in rejects["greet"]
    assert record["in"] == record["kept"] + record["rejected"] == 8 and record["rejected"] == 1
    counts = read_json(tmp_path / "t.counts.json")
    assert (counts["in"], counts["kept"], counts["rejected"]) == (8, 7, 1)


def test_a_template_error_rejects_only_its_record(tmp_path, target_dir):
    # a turn the template trips on (content not a string: jinja's `+` raises TypeError)
    broken = [CHAT[0], {"role": "assistant", "content": ["not", "text"]}]
    record, rows, rejects = _shard(tmp_path, target_dir, {"a": CHAT[:2], "bad": broken})
    assert [r["id"] for r in rows] == ["a"] and list(rejects) == ["bad"]
    assert "cannot render or tokenize" in rejects["bad"]
    assert record["in"] == record["kept"] + record["rejected"] == 2


def test_truncation_drops_the_oldest_whole_turns_and_keeps_the_last_answer(
    tmp_path, target_dir, tokenizer
):
    system = {"role": "system", "content": "You are terse."}
    turns = []
    for i in range(30):  # 60 turns, far over 128 tokens
        turns += [
            {"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
            {"role": "assistant", "content": f"It is {2 * i}."},
        ]
    record, (row,), _ = _shard(tmp_path, target_dir, {"long": [system, *turns]}, max_length=128)
    assert row["seq_len"] <= 128 and record["truncated"] == 1
    text = tokenizer.decode(row["input_ids"])
    assert text.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    # whole exchanges went, oldest first: the row starts at a user turn and ends with the last
    # answer, complete
    kept = text.count("<|im_start|>user")
    assert record["turns_dropped"] == 60 - 2 * kept and kept >= 1
    assert f"Question number {30 - kept}:" in text and f"Question number {29 - kept}:" not in text
    masked = _masked_text(tokenizer, row)
    assert masked.endswith("It is 58.<|im_end|>")
    assert masked == "".join(f"It is {2 * i}.<|im_end|>" for i in range(30 - kept, 30))
    assert record["in"] == record["kept"] + record["rejected"] == 1


# A Qwen3-style template: an assistant turn's reasoning shows only after the last user turn,
# so earlier turns lose it once a later user turn follows.
QWEN3_STYLE = (
    "{%- set ns = namespace(last=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + m.reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture
def qwen3_style(target_dir):
    from specbuild.eagle.target_info import load_tokenizer

    tok = load_tokenizer(target_dir)  # its own copy: the session tokenizer stays SmolLM2's
    tok.chat_template = QWEN3_STYLE
    return tok


def test_a_template_dropping_earlier_reasoning_trains_every_turn_as_served(qwen3_style):
    tok = qwen3_style
    chat = [
        CHAT[0],
        {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "First add."},
        CHAT[2],
        {"role": "assistant", "content": "It is 6.", "reasoning_content": "Then double."},
    ]
    t = tokenize_conversation(
        tok, chat, row_id="x", finish_reason="length", max_length=512, overlong="truncate"
    )
    assert t.per_turn and [r["id"] for r in t.rows] == ["x#1", "x#2"]
    one, two = t.rows
    assert all(tuple(r) == ROW_KEYS and r["has_reasoning"] for r in t.rows)
    assert _masked_text(tok, one) == "<think>\nFirst add.\n</think>\n\n2+2 = 4.<|im_end|>"
    assert _masked_text(tok, two) == "<think>\nThen double.\n</think>\n\nIt is 6.<|im_end|>"
    # turn 2 sees turn 1 as the template serves it: without its reasoning, untrained
    mask = zip(two["input_ids"], two["loss_mask"], strict=True)
    prompt_two = tok.decode([i for i, m in mask if not m])
    assert "2+2 = 4." in prompt_two and "First add." not in prompt_two
    assert [r["finish_reason"] for r in t.rows] == ["stop", "length"]  # the last is the row's
    n_reasoning = sum(len(tok(s, add_special_tokens=False)["input_ids"]) for s in
                      ("First add.", "Then double."))  # fmt: skip
    assert t.reasoning_tokens == n_reasoning > 0


def test_rows_per_turn_count_a_message_dropped_only_when_no_row_holds_it(qwen3_style):
    # 12 exchanges with reasoning over 96 tokens: each turn's row drops old exchanges to fit,
    # and a message a later row drops is still held by its own turn's row
    chat = []
    for i in range(12):
        chat += [
            {"role": "user", "content": f"Question {i}: what is {i} times three?"},
            {"role": "assistant", "content": f"It is {3 * i}.", "reasoning_content": "Multiply."},
        ]
    t = tokenize_conversation(
        qwen3_style, chat, row_id="x", finish_reason="stop", max_length=96, overlong="truncate"
    )
    assert t.per_turn and len(t.rows) == 12 and t.truncated > 1
    text = [qwen3_style.decode(r["input_ids"]) for r in t.rows]
    held = {i for i in range(12) if any(f"Question {i}:" in x for x in text)}
    assert held == set(range(12))  # every exchange opens at least its own row
    assert t.turns_dropped == 0


def test_without_reasoning_the_same_template_keeps_one_row(qwen3_style):
    t = tokenize_conversation(
        qwen3_style, CHAT, row_id="x", finish_reason="stop", max_length=512, overlong="truncate"
    )
    assert not t.per_turn and t.reasoning_tokens == 0
    assert _masked_text(qwen3_style, t.row) == "2+2 = 4.<|im_end|>It is 6.<|im_end|>"


def test_inline_reasoning_counts_its_tokens(tokenizer):
    msgs = [CHAT[0], {"role": "assistant", "content": "4", "reasoning_content": "add them"}]
    t = tokenize_conversation(
        tokenizer, msgs, row_id="x", finish_reason="stop", max_length=512, overlong="truncate"
    )
    assert t.reasoning_tokens == len(tokenizer("add them", add_special_tokens=False)["input_ids"])


# A template that renders an assistant turn's tool calls (as Qwen's and Llama 3.1's do)
TOOLS_STYLE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>' + c.function.name + '(' + "
    "c.function.arguments + ')</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CALL = {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
WEATHER = {"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
]}  # fmt: skip


def _kept_through_keep(tmp_path, target_dir) -> list[dict]:
    """WEATHER through `samples` and `generate` (mode keep, no model): the generated rows."""
    from specbuild.backends import SamplingParams
    from specbuild.generate import GenerateSettings, generate_shard
    from specbuild.rejects import ShardFiles
    from specbuild.samples import SampleSettings, write_sample_shard

    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(WEATHER) + "\n")
    samples = tmp_path / "s.jsonl"
    write_sample_shard(
        raw=raw,
        files=ShardFiles(samples, tmp_path / "s.rej.jsonl", tmp_path / "s.counts.json"),
        dataset="d",
        start=0,
        stop=10,
        settings=SampleSettings(max_prompt_tokens=None),
        target_dir=target_dir,
    )

    def no_model():
        raise AssertionError("keep mode loads no model for a finished conversation")

    generate_shard(
        samples=samples,
        fingerprint=target_dir / "fingerprint.json",
        files=ShardFiles(tmp_path / "g.jsonl", tmp_path / "g.rej.jsonl", tmp_path / "g.c.json"),
        backend=no_model,
        settings=GenerateSettings(mode="keep", sampling=SamplingParams(), batch_size=4),
    )
    return list(read_jsonl(tmp_path / "g.jsonl"))


def test_under_keep_a_tool_call_the_template_cannot_render_rejects_the_row_naming_the_turn(
    tmp_path, target_dir
):
    (row,) = _kept_through_keep(tmp_path, target_dir)
    assert row["messages"][-1]["tool_calls"] == [CALL]  # carried, not dropped
    record, rows, bad = _shard(tmp_path, target_dir, {row["id"]: row["messages"]})
    assert rows == [] and record["rejected"] == 1
    assert bad[row["id"]].startswith(
        "assistant message 1 holds tool_calls the chat template does not render"
    )


def test_under_keep_a_tool_call_the_template_renders_is_trained_on(tmp_path, target_dir):
    from specbuild.eagle.target_info import load_tokenizer

    (row,) = _kept_through_keep(tmp_path, target_dir)
    tok = load_tokenizer(target_dir)
    tok.chat_template = TOOLS_STYLE
    t = tokenize_conversation(
        tok, row["messages"], row_id="x", finish_reason="stop", max_length=512, overlong="drop"
    )
    assert _masked_text(tok, t.row) == (
        'Let me check.<tool_call>weather({"city": "Paris"})</tool_call><|im_end|>'
    )
