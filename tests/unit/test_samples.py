"""Stage `samples`: three input formats, stable ids, fixed shards, and rejected rows kept."""

import json
import re

import pytest

from specbuild.infra.io import read_json, read_jsonl
from specbuild.rejects import ShardFiles
from specbuild.samples import (
    SampleError,
    SampleSettings,
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


def test_a_specforge_data_file_keeps_its_ids_system_prompts_and_role_content_turns(tmp_path):
    # SpecForge's documented layout (written here, not copied): `id` and OpenAI-style turns
    # under `conversations`; ShareGPT's from/value turns in the same file, detected per record
    raw = _write_jsonl(
        tmp_path / "raw.jsonl",
        [
            {
                "id": "sf-001",
                "conversations": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": "Paris."},
                ],
            },
            {"id": "sg-002", "conversations": [{"from": "human", "value": "Hi"}]},
        ],
    )
    rows, bad, counts = _shard(tmp_path, raw, id_key="id")
    assert bad == [] and counts["in"] == 2
    assert [r["id"] for r in rows] == ["d-sf-001", "d-sg-002"]
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert rows[1]["messages"] == [{"role": "user", "content": "Hi"}]


def test_tool_turns_pass_through_as_prompt_turns():
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Calling the weather tool."},
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "user", "content": "So?"},
    ]
    assert [m["role"] for m in normalize_sample({"messages": msgs})] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]
    conv = [{"from": "human", "value": "x"}, {"from": "observation", "value": "{}"}]
    assert normalize_sample({"conversations": conv})[1]["role"] == "tool"


def test_an_assistant_turns_tool_calls_stay_with_it_and_a_call_in_another_form_is_refused():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    user = {"role": "user", "content": "Call f."}
    msgs = [user, {"role": "assistant", "content": "Calling f.", "tool_calls": [call]}]
    assert normalize_sample({"messages": msgs})[1] == {
        "role": "assistant",
        "content": "Calling f.",
        "tool_calls": [call],
    }
    only_call = [user, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert normalize_sample({"messages": only_call})[1]["content"] == ""
    faults = {
        "function_call": {"role": "assistant", "content": "x", "function_call": {"name": "f"}},
        "on a user turn": {"role": "user", "content": "x", "tool_calls": [call]},
        "not objects": {"role": "assistant", "content": "x", "tool_calls": ["f()"]},
    }
    reasons = {
        "function_call": "messages[1]: a function_call (OpenAI's older form): write it as "
        "tool_calls",
        "on a user turn": "messages[1]: a user turn holds tool_calls; only an assistant turn calls",
        "not objects": "messages[1]: tool_calls must be a list of objects",
    }
    for name, turn in faults.items():
        with pytest.raises(SampleError) as err:
            normalize_sample({"messages": [user, turn]})
        assert str(err.value) == reasons[name]


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
    files = ShardFiles(out=out, rejected=rej, counts=counts)
    fields = {k: kw.pop(k) for k in ("fmt", "prompt_key", "id_key") if k in kw}
    fields["max_prompt_tokens"] = kw.pop("max_prompt_tokens", None)
    write_sample_shard(raw=raw, files=files, settings=SampleSettings(**fields), **kw)
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


def test_a_jsonl_file_whose_first_line_is_an_array_keeps_its_other_rows(tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text('[{"prompt": "a"}]\n{"prompt": "b"}\n{"prompt": "c"}\n')
    assert len(record_digests(raw, shard_size=2)) == 2  # parsing the workflow does not fail
    rows, bad, _ = _shard(tmp_path, raw)
    assert [r["messages"][0]["content"] for r in rows] == ["b", "c"]
    assert [(b["line"], b["reason"]) for b in bad] == [
        (1, "record is list, expected a JSON object")
    ]


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("raw.txt", '{"prompt": "a"}\n', r"raw\.txt: cannot tell .* \.jsonl .* \.json"),
        ("raw.json", '[{"prompt": "a"},\n {"prompt": }]', r"raw\.json:2: not valid JSON"),
        ("raw.json", '{"prompt": "a"}\n', r"raw\.json:1: .* JSON list .* not a dict"),
    ],
)
def test_a_file_that_is_not_what_its_name_says_fails_naming_file_and_line(
    tmp_path, name, text, error
):
    raw = tmp_path / name
    raw.write_text(text)
    with pytest.raises(ValueError, match=error):
        record_digests(raw, shard_size=2)


def test_ids_come_from_id_key_and_a_repeated_id_is_rejected_naming_the_first(tmp_path):
    raw = _write_jsonl(
        tmp_path / "raw.jsonl",
        [
            {"qid": 7, "prompt": "a"},
            {"qid": "x", "prompt": "b"},
            {"qid": 7, "prompt": "c"},  # line 3: 7 again
            {"prompt": "d"},  # line 4: no id
            {"qid": "x", "prompt": "e"},  # line 5: in the second shard, x from the first
        ],
    )
    first, bad, _ = _shard(tmp_path / "a", raw, id_key="qid", stop=4)
    assert [r["id"] for r in first] == ["d-7", "d-x"]
    assert [(b["line"], b["reason"]) for b in bad] == [
        (3, "duplicate id 'd-7' (first at line 1)"),
        (4, "missing id field `qid`"),
    ]
    second, bad, _ = _shard(tmp_path / "b", raw, id_key="qid", start=4, stop=8)
    assert second == [] and bad[0]["reason"] == "duplicate id 'd-x' (first at line 2)"


def test_an_id_holding_the_answer_separator_is_rejected_so_answer_ids_cannot_collide(tmp_path):
    # with `answers: 2`, generate names the second answer of `q` `q~1`: the record `q~1`
    # would share that id, one answer lost and the other row written twice
    raw = _write_jsonl(
        tmp_path / "raw.jsonl",
        [
            {"id": "q", "prompt": "What is 2+2?"},
            {"id": "q~1", "prompt": "What is 3+3?"},
            {"id": 7, "prompt": "What is 4+4?"},
        ],
    )
    rows, bad, counts = _shard(tmp_path, raw, id_key="id")
    assert [r["id"] for r in rows] == ["d-q", "d-7"]
    assert [(b["line"], b["reason"]) for b in bad] == [
        (2, "id 'q~1' holds '~', which generate uses to number a prompt's answers "
         "(<id>~1, <id>~2, ...)"),
    ]  # fmt: skip
    assert (counts["in"], counts["kept"], counts["rejected"]) == (3, 2, 1)
    assert json.loads(bad[0]["raw"])["id"] == "q~1"  # the record, in the shard's rejected file


def test_with_id_key_a_shard_digest_covers_the_ids_before_it_but_not_after(tmp_path):
    rows = [{"qid": i, "prompt": f"q{i}"} for i in range(4)]
    raw = _write_jsonl(tmp_path / "raw.jsonl", rows)
    before = record_digests(raw, shard_size=2, id_key="qid")
    assert record_digests(raw, shard_size=2) != before  # the ids are part of it
    _write_jsonl(raw, [{**rows[0], "qid": 3}] + rows[1:])  # shard 1's record 3 is now a dup
    changed = record_digests(raw, shard_size=2, id_key="qid")
    assert changed[0] != before[0] and changed[1] != before[1]
    _write_jsonl(raw, rows + [{"qid": 9, "prompt": "new"}])
    assert record_digests(raw, shard_size=2, id_key="qid")[:2] == before


def _prompt_bytes(content: str) -> bytes:
    return json.dumps({"prompt": content}).encode()


def test_a_prompt_over_max_prompt_tokens_is_rejected_and_the_rest_kept(tmp_path, target_dir):
    raw = tmp_path / "raw.jsonl"
    lines = [
        _prompt_bytes("What is 2 + 2?"),
        _prompt_bytes("word " * 400),  # a few hundred tokens: counted, then rejected
        _prompt_bytes("x" * 5_000_000),  # 5 MB: refused by its length, never tokenized
        _prompt_bytes("Name a colour."),
    ]
    raw.write_bytes(b"\n".join(lines) + b"\n")
    rows, bad, counts = _shard(tmp_path, raw, target_dir=target_dir, max_prompt_tokens=64)
    assert [r["messages"][0]["content"] for r in rows] == ["What is 2 + 2?", "Name a colour."]
    assert [b["line"] for b in bad] == [2, 3]
    assert re.fullmatch(r"prompt too long: \d+ tokens > max_prompt_tokens 64", bad[0]["reason"])
    assert "5,0" in bad[1]["reason"] and "characters cannot fit" in bad[1]["reason"]
    assert len(bad[1]["raw"]) <= 2000  # the reject keeps a head of the line, not 5 MB
    assert counts["in"] == counts["kept"] + counts["rejected"] == 4


def test_prompt_length_counts_what_generate_sends(target_dir, tokenizer):
    from specbuild.samples import PromptLength

    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! " * 50},  # replaced by generate: not counted
    ]
    sent = tokenizer.apply_chat_template(
        chat[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert PromptLength(target_dir, 8192).check(chat) == len(sent)
    with pytest.raises(SampleError, match=f"{len(sent)} tokens > max_prompt_tokens"):
        PromptLength(target_dir, len(sent) - 1).check(chat)


def test_a_conversation_opening_with_the_bots_greeting_is_repaired_and_says_so(
    tmp_path, target_dir, caplog
):
    turn = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]
    records = [
        {"conversations": turn},
        {"conversations": [{"from": "gpt", "value": "Welcome! Ask me anything."}, *turn]},
        {"conversations": [{"from": "system", "value": "Be kind."}, turn[1], turn[1], *turn]},
    ]
    raw = _write_jsonl(tmp_path / "raw.jsonl", records)
    with caplog.at_level("INFO", logger="specbuild"):
        rows, bad, counts = _shard(tmp_path, raw, target_dir=target_dir, max_prompt_tokens=64)
    assert bad == [] and counts["in"] == counts["kept"] == 3
    assert [[m["role"] for m in r["messages"]] for r in rows] == [
        ["user", "assistant"],
        ["user", "assistant"],
        ["system", "user", "assistant"],
    ]
    assert rows[0]["repairs"] == []
    assert rows[1]["repairs"] == ["dropped 1 assistant turn(s) before the first user turn"]
    assert rows[2]["repairs"] == ["dropped 2 assistant turn(s) before the first user turn"]
    assert f"repaired {raw}:2: dropped 1 assistant" in caplog.text
    assert "in=3 = kept 3 + rejected 0 (2 repaired)" in caplog.text


def test_a_conversation_the_template_cannot_render_is_rejected_with_its_line(tmp_path, target_dir):
    # a template that insists on alternating turns, as Llama-2 and Mistral templates do
    strict = tmp_path / "strict-target"
    strict.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (strict / name).write_bytes((target_dir / name).read_bytes())
    template = (target_dir / "chat_template.jinja").read_text()
    (strict / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if loop.index0 > 0 and m.role == messages[loop.index0 - 1]"
        ".role %}{{ raise_exception('Conversation roles must alternate') }}{%- endif %}"
        "{%- endfor %}" + template
    )
    records = [
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi?"}]},
        {"messages": [{"role": "user", "content": "Bye"}]},
    ]
    raw = _write_jsonl(tmp_path / "raw.jsonl", records)
    rows, bad, counts = _shard(tmp_path, raw, target_dir=strict, max_prompt_tokens=64)
    assert [r["id"] for r in rows] == ["d-0000000", "d-0000002"]
    (reject,) = bad
    assert reject["line"] == 2 and reject["file"] == str(raw)
    assert "chat template cannot render" in reject["reason"]
    assert "Conversation roles must alternate" in reject["reason"]
    assert counts["in"] == counts["kept"] + counts["rejected"] == 3
