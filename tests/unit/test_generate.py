"""Stage `generate`: the hf backend on the real SmolLM2, keep vs regenerate, provenance."""

import json
import socket
import sys
from pathlib import Path

import pytest
import torch

from specbuild.backends import SamplingParams, make_backend
from specbuild.backends import openai as openai_backend
from specbuild.backends.base import Generation, GenerationRequest
from specbuild.backends.hf import split_reasoning
from specbuild.backends.user_turn import follow_up_seed, open_user_turn
from specbuild.engines.http import EngineUnavailable
from specbuild.generate import (
    GenerateSettings,
    answer_copies,
    generate_shard,
    output_ids,
    plan_generation,
)
from specbuild.infra.io import read_json, read_jsonl
from specbuild.rejects import ShardFiles
from specbuild.tokenization import tokenize_conversation

STUB = Path(__file__).resolve().parents[1] / "stubs" / "sglang_stub.py"

ASK = [{"role": "user", "content": "Name one primary color."}]


@pytest.fixture(scope="module")
def hf(target_dir):
    return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)


@pytest.mark.slow  # decodes with the real SmolLM2
def test_greedy_batches_match_one_by_one_and_report_finish_reasons(hf):
    reqs = [
        GenerationRequest("a", ASK),
        GenerationRequest("b", [{"role": "user", "content": "Hi"}]),
    ]
    short = hf.generate(reqs, SamplingParams(max_new_tokens=4))
    assert [g.finish_reason for g in short] == ["length", "length"]
    assert [g.completion_tokens for g in short] == [4, 4]
    full = hf.generate(reqs, SamplingParams(max_new_tokens=64))
    assert full[0].finish_reason == "stop" and full[0].content.strip()
    # padding in a batch must not change greedy output
    alone = hf.generate(reqs[:1], SamplingParams(max_new_tokens=64))
    assert alone[0].content == full[0].content
    assert full[0].prompt_tokens == len(hf._prompt_ids(reqs[0]))


def test_bf16_decodes_in_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, target_dir):
    import specbuild.backends.hf as hf_backend

    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(hf_backend, "cpu_bf16_supported", lambda native=native: native)
        backend = make_backend("hf", target_dir=str(target_dir), device="cpu", dtype="bfloat16")
        assert next(backend.lm.parameters()).dtype == want
        assert backend.dtype == str(want).removeprefix("torch.")
    assert hf_backend.compute_dtype("float16", "cpu") == "float16"  # only bf16 falls back


def test_reasoning_is_split_from_the_answer():
    assert split_reasoning("<think>\nplan\n</think>\n\nAnswer") == ("Answer", "plan")
    assert split_reasoning("Answer") == ("Answer", None)


def _samples(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _generate(tmp_path, target_dir, rows, *, backend, samples="s.jsonl", earlier=(), **kw):
    """generate_shard over `rows`, writing g.jsonl, r.jsonl and c.json in `tmp_path`; `kw`
    are the settings."""
    return generate_shard(
        samples=_samples(tmp_path / samples, rows),
        fingerprint=target_dir / "fingerprint.json",
        files=ShardFiles(
            out=tmp_path / "g.jsonl", rejected=tmp_path / "r.jsonl", counts=tmp_path / "c.json"
        ),
        backend=backend,
        settings=GenerateSettings(**{"mode": "regenerate", "batch_size": 4, **kw}),
        earlier=earlier,
    )


def test_keep_mode_reuses_dataset_answers_without_loading_a_model(tmp_path, target_dir):
    rows = [{"id": "d-0", "messages": ASK + [{"role": "assistant", "content": "Red."}]}]
    out = tmp_path / "g.jsonl"

    def no_model():
        raise AssertionError("keep mode must not build a backend when every answer exists")

    _generate(
        tmp_path,
        target_dir,
        rows,
        backend=no_model,
        mode="keep",
        sampling=SamplingParams(),
        batch_size=4,
    )
    (row,) = read_jsonl(out)
    assert row["messages"][-1]["content"] == "Red." and row["response_source"] == "dataset"


def test_regenerate_replaces_answers_and_records_provenance(tmp_path, target_dir, hf):
    rows = [
        {"id": "d-0", "messages": ASK + [{"role": "assistant", "content": "Red."}]},
        {"id": "d-1", "messages": ASK},
    ]
    out = tmp_path / "g.jsonl"
    _generate(
        tmp_path,
        target_dir,
        rows,
        backend=lambda: hf,
        sampling=SamplingParams(max_new_tokens=8),
        batch_size=4,
    )
    got = list(read_jsonl(out))
    fp = read_json(target_dir / "fingerprint.json")["fingerprint"]
    assert [r["id"] for r in got] == ["d-0", "d-1"]
    assert got[0]["messages"][-1]["content"] != "Red."
    assert got[0]["messages"][-1]["content"] == got[1]["messages"][-1]["content"]  # greedy
    assert {r["backend"] for r in got} == {"hf"} and {r["target_fingerprint"] for r in got} == {fp}
    assert all(r["usage"]["completion_tokens"] <= 8 + 1 for r in got)
    assert all(r["finish_reason"] in ("stop", "length") for r in got)


class RaisesOnHuge:
    """A backend that, like hf on a 5 MB prompt, raises for any batch holding a huge prompt."""

    name = model = "raises-on-huge"

    def __init__(self):
        self.calls: list[list[str]] = []

    def generate(self, requests, sampling):
        self.calls.append([r.id for r in requests])
        if any(len(r.messages[-1]["content"]) > 1000 for r in requests):
            raise RuntimeError(
                "DefaultCPUAllocator: not enough memory: you tried to allocate 623GB"
            )
        return [Generation(r.id, "ok", "stop", 3, 1) for r in requests]

    def close(self):
        pass


def test_a_record_the_backend_raises_on_is_rejected_and_the_rest_of_its_batch_kept(
    tmp_path, target_dir
):
    rows = [
        {"id": f"d-{i}", "messages": [{"role": "user", "content": "x" * (5000 if i == 2 else 5)}]}
        for i in range(6)
    ]
    engine = RaisesOnHuge()
    out, rej, counts = tmp_path / "g.jsonl", tmp_path / "r.jsonl", tmp_path / "c.json"
    kept, bad = _generate(
        tmp_path,
        target_dir,
        rows,
        backend=lambda: engine,
        sampling=SamplingParams(max_new_tokens=4),
        batch_size=4,
    )
    assert (kept, bad) == (5, 1)
    assert [r["id"] for r in read_jsonl(out)] == ["d-0", "d-1", "d-3", "d-4", "d-5"]
    (reject,) = read_jsonl(rej)
    assert reject["id"] == "d-2"
    assert reject["reason"].startswith("backend raised RuntimeError: DefaultCPUAllocator")
    # the failing batch was retried one request at a time; the next batch went whole
    assert engine.calls == [
        ["d-0", "d-1", "d-2", "d-3"],
        ["d-0"],
        ["d-1"],
        ["d-2"],
        ["d-3"],
        ["d-4", "d-5"],
    ]
    assert read_json(counts)["in"] == 6


def test_an_engine_that_refuses_every_connection_fails_the_job_and_publishes_nothing(
    tmp_path, target_dir, monkeypatch
):
    """An outage is no record's fault: rejecting every record with it as the reason would
    publish a finished-looking shard that a rerun never regenerates."""
    monkeypatch.setattr(openai_backend, "RETRY_BACKOFF_S", (0.0,))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = openai_backend.OpenAIBackend(base_url=f"http://127.0.0.1:{port}", model="m")
    rows = [{"id": f"d-{i}", "messages": [{"role": "user", "content": "hi"}]} for i in range(3)]
    with pytest.raises(EngineUnavailable, match=f"127.0.0.1:{port} unreachable after 2 tries"):
        _generate(
            tmp_path,
            target_dir,
            rows,
            backend=lambda: engine,
            sampling=SamplingParams(),
            batch_size=2,
        )
    assert not {"g.jsonl", "r.jsonl", "c.json"} & {p.name for p in tmp_path.iterdir()}


class Blank(RaisesOnHuge):
    """A backend whose answer to one prompt is empty (a server's, or a model's at once EOS)."""

    def generate(self, requests, sampling):
        return [Generation(r.id, "  " if r.id == "d-1" else "ok", "stop", 3, 1) for r in requests]


def test_an_empty_answer_is_rejected_with_its_reason_not_trained_on(tmp_path, target_dir):
    rows = [{"id": f"d-{i}", "messages": [{"role": "user", "content": "hi"}]} for i in range(3)]
    kept, bad = _generate(
        tmp_path, target_dir, rows, backend=Blank, sampling=SamplingParams(max_new_tokens=4)
    )
    assert (kept, bad) == (2, 1)
    (reject,) = read_jsonl(tmp_path / "r.jsonl")
    assert reject["id"] == "d-1" and reject["reason"].startswith("empty answer")


# Multi-turn self-written conversations (synthesize.turns > 1) --------------------------------

FOLLOW_UP = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)


class Scripted:
    """Answers "answer <n>" to chat requests; writes follow-ups from raw prompts (token ids),
    and plays out one failure per conversation id named in `fail`."""

    name = model = "scripted"

    def __init__(self, fail: dict[str, str] | None = None):
        self.fail = fail or {}
        self.follow_ups: list[GenerationRequest] = []

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            if r.prompt is not None:
                self.follow_ups.append(r)
                finish = "length" if self.fail.get(r.id) == "follow-up" else "stop"
                out.append(Generation(r.id, f" And then {r.seed % 97}? ", finish, len(r.prompt), 5))
            else:
                n = sum(m["role"] == "user" for m in r.messages)
                fail = self.fail.get(r.id)
                finish = {f"answer {n}": "length", f"error {n}": "error"}.get(fail, "stop")
                out.append(Generation(r.id, f"answer {n}", finish, 10 * n, 3))
        return out

    def close(self):
        pass


def _turns(tmp_path, target_dir, engine, rows, *, turns, backend=None):
    out = tmp_path / "g.jsonl"
    _generate(
        tmp_path,
        target_dir,
        rows,
        backend=backend or (lambda: engine),
        sampling=SamplingParams(max_new_tokens=64),
        batch_size=2,
        turns=turns,
        follow_up=FOLLOW_UP,
    )
    return {r["id"]: r for r in read_jsonl(out)}, list(read_jsonl(tmp_path / "r.jsonl"))


def test_the_target_writes_each_follow_up_on_the_conversation_so_far(
    tmp_path, target_dir, tokenizer
):
    rows = [
        {"id": f"chat-{i}", "messages": [{"role": "user", "content": f"Q{i}"}]} for i in range(5)
    ]
    engine = Scripted(
        {"chat-1": "answer 1", "chat-2": "follow-up", "chat-3": "answer 2", "chat-4": "error 2"}
    )
    got, rejects = _turns(tmp_path, target_dir, engine, rows, turns=3)
    assert rejects == [] and sorted(got) == [r["id"] for r in rows]
    roles = {cid: [m["role"] for m in r["messages"]] for cid, r in got.items()}
    assert roles["chat-0"] == ["user", "assistant"] * 3
    assert roles["chat-1"] == ["user", "assistant"]  # answer cut at max_new_tokens: no follow-up
    assert roles["chat-2"] == ["user", "assistant"]  # its second user turn never finished
    assert roles["chat-3"] == ["user", "assistant"] * 2  # kept as cut, like a first answer
    assert roles["chat-4"] == ["user", "assistant"]  # a failed second answer: the first stays
    full = got["chat-0"]
    assert [m["content"] for m in full["messages"][1::2]] == ["answer 1", "answer 2", "answer 3"]
    assert full["messages"][2]["content"] == full["messages"][2]["content"].strip()
    assert full["usage"] == {"prompt_tokens": 10 + 20 + 30, "completion_tokens": 9}
    assert got["chat-3"]["finish_reason"] == "length"  # the last answer's
    assert got["chat-4"]["finish_reason"] == "stop"  # the failed answer left no trace
    # each follow-up continues the open user turn after the conversation so far, as token ids,
    # seeded by (seed, id, turn) alone
    first = next(r for r in engine.follow_ups if r.id == "chat-0")
    convo = full["messages"][:2]
    ids = tokenizer(open_user_turn(tokenizer, convo), add_special_tokens=False)["input_ids"]
    assert first.prompt == ids and tokenizer.decode(ids).endswith("<|im_start|>user\n")
    assert first.seed == follow_up_seed(5, "chat-0", 2) != follow_up_seed(5, "chat-0", 3)
    assert sorted((r.id, r.seed) for r in engine.follow_ups) == sorted(
        [(f"chat-{i}", follow_up_seed(5, f"chat-{i}", 2)) for i in (0, 2, 3, 4)]
        + [("chat-0", follow_up_seed(5, "chat-0", 3))]
    )
    # tokenize trains on every answer of the conversation, never on a user turn
    row = tokenize_conversation(
        tokenizer,
        full["messages"],
        row_id="x",
        finish_reason="stop",
        max_length=512,
        overlong="truncate",
    ).row
    masked = tokenizer.decode(
        [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    )
    assert masked == "answer 1<|im_end|>answer 2<|im_end|>answer 3<|im_end|>"


def test_one_turn_sends_no_follow_up(tmp_path, target_dir):
    engine = Scripted()
    got, _ = _turns(tmp_path, target_dir, engine, [{"id": "a", "messages": ASK}], turns=1)
    assert engine.follow_ups == [] and len(got["a"]["messages"]) == 2


@pytest.mark.slow  # decodes with the real SmolLM2
def test_hf_answers_the_follow_ups_smollm2_writes(tmp_path, target_dir):
    def hf():  # generate_shard closes the backend it built: a fresh one, not the fixture
        return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)

    rows = [
        {"id": "chat-0000000", "messages": ASK},
        {"id": "chat-0000001", "messages": [{"role": "user", "content": "Say hi to Bob."}]},
    ]
    got, rejects = _turns(tmp_path, target_dir, None, rows, turns=2, backend=hf)
    assert rejects == [] and len(got) == 2
    for r in got.values():
        roles = [m["role"] for m in r["messages"]]
        assert roles in (["user", "assistant"], ["user", "assistant"] * 2)
        assert all(m["content"].strip() and "<|im_" not in m["content"] for m in r["messages"])
    assert any(len(r["messages"]) == 4 for r in got.values())  # seeded: the same every run


def test_sglang_conversations_go_on_through_the_stub_server(tmp_path, target_dir):
    def sglang():
        return make_backend(
            "sglang",
            target_dir=str(target_dir),
            launcher=(sys.executable, str(STUB)),
            startup_timeout_s=20,
        )

    rows = [
        {"id": f"chat-{i}", "messages": [{"role": "user", "content": f"Q {i}"}]} for i in range(3)
    ]
    got, rejects = _turns(tmp_path, target_dir, None, rows, turns=3, backend=sglang)
    assert rejects == [] and len(got) == 3
    for r in got.values():
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] * 3
        assert r["backend"] == "sglang"
    follow_ups = [r["messages"][2]["content"] for r in got.values()]
    assert len(set(follow_ups)) == 3  # each conversation its own seed


def test_a_near_duplicate_of_an_earlier_shards_prompt_is_rejected_before_any_answer(
    tmp_path, target_dir
):
    earlier = _samples(tmp_path / "00000.jsonl", [{"id": "d-0", "messages": ASK}])
    rows = [
        {"id": "d-1", "messages": [{"role": "user", "content": "NAME one primary color!"}]},
        {"id": "d-2", "messages": [{"role": "user", "content": "Name two primary colors."}]},
    ]
    asked: list[str] = []

    class Recording(Scripted):
        def generate(self, requests, sampling):
            asked.extend(r.id for r in requests)
            return super().generate(requests, sampling)

    out, rej, counts = tmp_path / "g.jsonl", tmp_path / "r.jsonl", tmp_path / "c.json"
    kept, bad = _generate(
        tmp_path,
        target_dir,
        rows,
        backend=Recording,
        samples="00001.jsonl",
        sampling=SamplingParams(max_new_tokens=8),
        batch_size=4,
        earlier=[earlier],
        near_duplicate_threshold=0.8,
    )
    assert (kept, bad) == (1, 1) and asked == ["d-2"]
    (reject,) = read_jsonl(rej)
    assert reject == {
        "id": "d-1",
        "reason": "near-duplicate of d-0 (Jaccard 1.00 >= 0.8 over 5-word shingles)",
    }
    assert read_json(counts)["in"] == 2 and [r["id"] for r in read_jsonl(out)] == ["d-2"]


# Dataset conversations of several turns, regenerated ------------------------------------------


class Recording(Scripted):
    """Scripted, keeping every chat request it answered."""

    def __init__(self, fail=None):
        super().__init__(fail)
        self.asked: list[GenerationRequest] = []

    def generate(self, requests, sampling):
        self.asked += [r for r in requests if r.prompt is None]
        return super().generate(requests, sampling)


def _dialog(n, *, end_with_user=False):
    msgs = []
    for i in range(1, n + 1):
        msgs += [
            {"role": "user", "content": f"Q{i}"},
            {"role": "assistant", "content": f"dataset answer {i}"},
        ]
    return msgs + ([{"role": "user", "content": "Q-last"}] if end_with_user else [])


def test_regenerate_answers_every_turn_on_the_targets_own_earlier_answers(
    tmp_path, target_dir, tokenizer
):
    system = {"role": "system", "content": "Be brief."}
    rows = [
        {"id": "three", "messages": [system, *_dialog(3)]},
        {"id": "two", "messages": _dialog(1, end_with_user=True)},
        {"id": "cut", "messages": _dialog(3)},
        # opens with the bot's greeting (a samples shard written before samples dropped it)
        {"id": "greet", "messages": [{"role": "assistant", "content": "Hi!"}, *_dialog(1)]},
    ]
    engine = Recording({"cut": "answer 2"})  # its second answer stops at max_new_tokens
    got, rejects = _turns(tmp_path, target_dir, engine, rows, turns=1)
    assert [r["id"] for r in rejects] == ["greet"]
    assert "before any user turn" in rejects[0]["reason"]
    counts = read_json(tmp_path / "c.json")
    assert (counts["in"], counts["kept"], counts["rejected"]) == (4, 3, 1)
    assert engine.follow_ups == []  # dataset turns: no user turn is written
    # round k asks the k-th question after the target's own k-1 answers, never the dataset's
    three = [r.messages for r in engine.asked if r.id == "three"]
    assert [[m["content"] for m in msgs] for msgs in three] == [
        ["Be brief.", "Q1"],
        ["Be brief.", "Q1", "answer 1", "Q2"],
        ["Be brief.", "Q1", "answer 1", "Q2", "answer 2", "Q3"],
    ]
    assert [m["content"] for m in got["three"]["messages"]] == [
        "Be brief.", "Q1", "answer 1", "Q2", "answer 2", "Q3", "answer 3",
    ]  # fmt: skip
    assert got["three"]["usage"] == {"prompt_tokens": 10 + 20 + 30, "completion_tokens": 9}
    # a conversation ending on a user turn gets its last answer too
    assert [m["content"] for m in got["two"]["messages"]] == [
        "Q1",
        "answer 1",
        "Q-last",
        "answer 2",
    ]
    # an answer cut at max_new_tokens ends its conversation: no question follows it
    assert [m["content"] for m in got["cut"]["messages"]] == ["Q1", "answer 1", "Q2", "answer 2"]
    assert got["cut"]["finish_reason"] == "length"
    # the loss covers only text the target wrote
    for cid, answers in (("three", 3), ("two", 2), ("cut", 2)):
        row = tokenize_conversation(
            tokenizer,
            got[cid]["messages"],
            row_id=cid,
            finish_reason="stop",
            max_length=512,
            overlong="truncate",
        ).row
        masked = tokenizer.decode(
            [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        )
        assert masked == "".join(f"answer {n}<|im_end|>" for n in range(1, answers + 1))
        assert "dataset answer" not in tokenizer.decode(row["input_ids"])


def test_keep_reuses_every_dataset_turn_and_answers_only_an_open_conversation(tmp_path, target_dir):
    rows = [
        {"id": "done", "messages": _dialog(2)},
        {"id": "open", "messages": _dialog(2, end_with_user=True)},
    ]
    engine = Recording()
    out = tmp_path / "g.jsonl"
    _generate(
        tmp_path,
        target_dir,
        rows,
        backend=lambda: engine,
        mode="keep",
        sampling=SamplingParams(),
        batch_size=4,
    )
    got = {r["id"]: r for r in read_jsonl(out)}
    assert got["done"]["messages"] == rows[0]["messages"]
    assert got["done"]["response_source"] == "dataset"
    assert [r.id for r in engine.asked] == ["open"]
    assert got["open"]["messages"] == rows[1]["messages"] + [
        {"role": "assistant", "content": "answer 3"}
    ]


def test_the_disk_estimate_counts_every_answer_regenerate_writes():
    from specbuild.generate import most_new_tokens

    def turn(role):
        return {"role": role, "content": "x"}

    three = {"messages": [turn("user"), turn("assistant")] * 3}  # 3 answers under regenerate
    open_ended = {"messages": [turn("user")]}
    rows = [three, open_ended]
    kw = {"turns": 1, "answer_tokens": 100, "follow_up_tokens": 20}
    assert most_new_tokens(rows, mode="regenerate", **kw) == (3 + 1) * 100
    assert most_new_tokens(rows, mode="keep", **kw) == 2 * 100
    # two more written turns a row: each a follow-up (20) and its answer (100)
    assert most_new_tokens(rows, mode="keep", **{**kw, "turns": 3}) == 2 * 100 + 2 * 2 * 120


def test_regenerate_rejects_a_tool_result_that_follows_an_assistant_turn(tmp_path, target_dir):
    def turn(role, content):
        return {"role": role, "content": content}

    rows = [
        # the assistant turn is the call; the tool's result answers it
        {
            "id": "call",
            "messages": [
                turn("user", "Weather in Oslo?"),
                turn("assistant", 'get_weather("Oslo")'),
                turn("tool", "4 C, rain"),
                turn("assistant", "4 C and raining."),
            ],
        },
        # a tool turn before any assistant turn is context the target answers on
        {"id": "context", "messages": [turn("user", "Sum it up."), turn("tool", "a document")]},
    ]
    engine = Recording()
    got, rejects = _turns(tmp_path, target_dir, engine, rows, turns=1)
    assert [r["id"] for r in rejects] == ["call"]
    assert "tool result after an assistant turn" in rejects[0]["reason"]
    assert list(got) == ["context"] and [r.id for r in engine.asked] == ["context"]
    counts = read_json(tmp_path / "c.json")
    assert (counts["in"], counts["kept"], counts["rejected"]) == (2, 1, 1)


def _msgs(*turns):
    """Messages from (role, text) pairs."""
    return [{"role": role, "content": text} for role, text in turns]


def test_the_plan_queues_each_later_answer_after_the_first_under_regenerate():
    two = _msgs(("user", "a"), ("assistant", "x"), ("user", "b"), ("assistant", "y"))
    plan = plan_generation(
        [{"id": "c", "messages": two}], mode="regenerate", duplicates={}, special_fault=_no_fault
    )
    assert plan.first == (GenerationRequest("c", _msgs(("user", "a"))),)
    assert plan.later == {"c": (_msgs(("user", "b")),)}
    assert plan.kept == {} and plan.bad == () and plan.n_answers == 2


def test_the_plan_under_keep_reuses_finished_conversations_and_asks_open_ones():
    rows = [
        {"id": "done", "messages": _msgs(("user", "a"), ("assistant", "x"))},
        {"id": "open", "messages": _msgs(("user", "a"), ("assistant", "x"), ("user", "b"))},
    ]
    plan = plan_generation(rows, mode="keep", duplicates={}, special_fault=_no_fault)
    assert plan.kept["done"]["messages"] == rows[0]["messages"]
    assert plan.kept["done"]["response_source"] == "dataset"
    assert [r.id for r in plan.first] == ["open"] and plan.later == {}


def test_the_plan_rejects_duplicates_first_then_rows_regenerate_cannot_answer():
    rows = [
        {"id": "forged", "messages": _msgs(("user", "<bad>"))},
        {"id": "bot-first", "messages": _msgs(("assistant", "hello"), ("user", "a"))},
        {"id": "dup", "messages": _msgs(("user", "a"))},
        {
            "id": "tool",
            "messages": _msgs(("user", "a"), ("assistant", "call"), ("tool", "42")),
        },
        {"id": "ok", "messages": _msgs(("user", "a"))},
    ]
    plan = plan_generation(
        rows,
        mode="regenerate",
        duplicates={"dup": "near-duplicate of ok"},
        special_fault=lambda m: "forged" if "<bad>" in m[0]["content"] else None,
    )
    assert [(b["id"], b["reason"][:14]) for b in plan.bad] == [
        ("dup", "near-duplicate"),
        ("forged", "forged"),
        ("bot-first", "an assistant t"),
        ("tool", "a tool result "),
    ]
    assert [r.id for r in plan.first] == ["ok"]
    with pytest.raises(ValueError, match="allowed regenerate, keep"):
        plan_generation(rows, mode="rewrite", duplicates={}, special_fault=_no_fault)


def _no_fault(messages):
    return None


# Several answers per prompt (datasets.<name>.answers) ----------------------------------------

SAMPLED = SamplingParams(max_new_tokens=16, temperature=0.8, seed=3)


def _fresh_hf(target_dir):
    # generate_shard closes the backend it built: a fresh one, not the module's fixture
    return lambda: make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)


@pytest.mark.slow  # decodes with the real SmolLM2
def test_two_answers_a_prompt_are_two_samples_sampled_apart(tmp_path, target_dir):
    rows = [
        {"id": "d-0", "messages": ASK},
        {"id": "d-1", "messages": [{"role": "user", "content": "Say hi to Bob."}]},
    ]
    kept, bad = _generate(
        tmp_path, target_dir, rows, backend=_fresh_hf(target_dir), sampling=SAMPLED, answers=2
    )
    got = list(read_jsonl(tmp_path / "g.jsonl"))
    assert (kept, bad) == (4, 0)
    assert [r["id"] for r in got] == ["d-0", "d-0~1", "d-1", "d-1~1"]  # a row's answers follow it
    for r in got:  # every answer is to its own sample's prompt
        assert r["messages"][:-1] == rows[r["id"].startswith("d-1")]["messages"]
        assert r["messages"][-1]["role"] == "assistant" and r["backend"] == "hf"
    text = {r["id"]: r["messages"][-1]["content"] for r in got}
    assert any(text[i] != text[f"{i}~1"] for i in ("d-0", "d-1"))
    counts = read_json(tmp_path / "c.json")
    assert counts["in"] == counts["kept"] + counts["rejected"] == len(rows) * 2


@pytest.mark.slow  # decodes with the real SmolLM2
def test_one_answer_a_prompt_samples_as_a_shard_did_before_the_setting(tmp_path, target_dir):
    # two batches of two at a temperature: a seed attached to a request would reseed the
    # second batch (hf seeds per batch by its first request) and change its answers
    rows = [
        {"id": f"d-{i}", "messages": [{"role": "user", "content": f"Count to {i}."}]}
        for i in range(4)
    ]
    runs = {}
    for answers in (None, 1):
        out = tmp_path / f"answers-{answers}"
        out.mkdir()
        extra = {} if answers is None else {"answers": answers}
        _generate(
            out,
            target_dir,
            rows,
            backend=_fresh_hf(target_dir),
            sampling=SAMPLED,
            batch_size=2,
            **extra,
        )
        runs[answers] = (out / "g.jsonl").read_bytes(), read_json(out / "c.json")["in"]
    assert runs[1] == runs[None] and runs[1][1] == 4
    # as generate did before: the shard's seed once, the model built, then its batches in
    # order, no request seeded
    torch.manual_seed(SAMPLED.seed)
    hf = _fresh_hf(target_dir)()
    reqs = [GenerationRequest(r["id"], r["messages"]) for r in rows]
    want = [g.content for b in (reqs[:2], reqs[2:]) for g in hf.generate(b, SAMPLED)]
    got = [r["messages"][-1]["content"] for r in read_jsonl(tmp_path / "answers-1" / "g.jsonl")]
    assert got == want


class ByIdAndSeed(Recording):
    """Recording, each answer naming the conversation and seed it was asked with."""

    def generate(self, requests, sampling):
        out = super().generate(requests, sampling)
        for r, g in zip(requests, out, strict=True):
            if r.prompt is None:
                g.content += f" ({r.id}, seed {r.seed})"
        return out


def test_each_answer_of_a_prompt_builds_on_its_own_answers_with_its_own_seed(tmp_path, target_dir):
    rows = [
        {"id": "two", "messages": _dialog(2)},
        {"id": "bot-first", "messages": [{"role": "assistant", "content": "Hi!"}, *_dialog(1)]},
        {"id": "one", "messages": _dialog(1)},
    ]
    engine = ByIdAndSeed({"one~1": "error 1", "two~2": "error 2"})
    kept, bad = _generate(
        tmp_path, target_dir, rows, backend=lambda: engine, sampling=SAMPLED, answers=3
    )
    got = {r["id"]: r for r in read_jsonl(tmp_path / "g.jsonl")}
    assert list(got) == ["two", "two~1", "two~2", "one", "one~2"]
    # answer 0 keeps the shard's seed (none on the request), answer k gets seed + k, every turn
    assert [m["content"] for m in got["two~1"]["messages"]] == [
        "Q1", "answer 1 (two~1, seed 4)", "Q2", "answer 2 (two~1, seed 4)",
    ]  # fmt: skip
    assert got["two"]["messages"][1]["content"] == "answer 1 (two, seed None)"
    # its second question follows its own first answer
    second = [r.messages for r in engine.asked if r.id == "two~2"][1]
    assert [m["content"] for m in second] == ["Q1", "answer 1 (two~2, seed 5)", "Q2"]
    assert len(got["two~2"]["messages"]) == 2  # its failed second answer ended it early
    rejects = list(read_jsonl(tmp_path / "r.jsonl"))
    assert [r["id"] for r in rejects] == ["bot-first", "bot-first~1", "bot-first~2", "one~1"]
    assert rejects[-1]["reason"] == "backend error: error"
    counts = read_json(tmp_path / "c.json")
    assert (counts["in"], counts["kept"], counts["rejected"]) == (9, 5, 4) == (9, kept, bad)


def test_follow_up_turns_of_each_answer_are_written_and_answered_apart(tmp_path, target_dir):
    engine = ByIdAndSeed()
    _generate(
        tmp_path,
        target_dir,
        [{"id": "c", "messages": ASK}],
        backend=lambda: engine,
        sampling=SAMPLED,
        turns=2,
        follow_up=FOLLOW_UP,
        answers=2,
    )
    got = {r["id"]: r for r in read_jsonl(tmp_path / "g.jsonl")}
    assert [m["role"] for m in got["c~1"]["messages"]] == ["user", "assistant"] * 2
    assert got["c~1"]["messages"][3]["content"] == "answer 2 (c~1, seed 4)"
    assert got["c"]["messages"][3]["content"] == "answer 2 (c, seed None)"
    assert sorted((r.id, r.seed) for r in engine.follow_ups) == [
        ("c", follow_up_seed(5, "c", 2)),
        ("c~1", follow_up_seed(5, "c~1", 2)),
    ]


@pytest.mark.parametrize(
    ("ids", "answers", "shared"),
    [
        (["d-q", "d-q~1"], 2, "'d-q~1': answer 1 of 'd-q' and sample 'd-q~1'"),
        (["d-q", "d-q"], 1, "'d-q': sample 'd-q' and sample 'd-q'"),
    ],
    ids=["answer-id-taken", "repeated-id"],
)
def test_a_shard_where_two_rows_would_share_an_id_fails_before_any_answer(
    tmp_path, target_dir, ids, answers, shared
):
    # an older samples shard, or one edited by hand: samples itself rejects both records
    rows = [{"id": i, "messages": ASK} for i in ids]

    def no_model():
        raise AssertionError("the ids are checked before any answer is asked for")

    with pytest.raises(ValueError) as err:
        _generate(tmp_path, target_dir, rows, backend=no_model, sampling=SAMPLED, answers=answers)
    assert str(err.value).startswith(f"{tmp_path / 's.jsonl'}: 1 id(s) would each name two rows")
    assert shared in str(err.value)
    assert not (tmp_path / "g.jsonl").exists() and not (tmp_path / "c.json").exists()


def test_output_ids_are_each_answer_of_each_sample_in_order():
    rows = [{"id": "d-a"}, {"id": "d-b"}]
    assert output_ids("s.jsonl", rows, 2) == ["d-a", "d-a~1", "d-b", "d-b~1"]


@pytest.mark.parametrize(
    ("mode", "temperature"), [("regenerate", 0.0), ("keep", 0.8)], ids=["greedy", "keep"]
)
def test_several_answers_need_sampling_and_regenerate(tmp_path, target_dir, mode, temperature):
    with pytest.raises(ValueError, match="answers 2 needs mode regenerate and a temperature > 0"):
        _generate(
            tmp_path,
            target_dir,
            [{"id": "a", "messages": ASK}],
            backend=Scripted,
            mode=mode,
            sampling=SamplingParams(temperature=temperature),
            answers=2,
        )


def test_answer_copies_leave_one_answer_as_planned():
    plan = plan_generation(
        [{"id": "c", "messages": _msgs(("user", "a"))}],
        mode="regenerate",
        duplicates={},
        special_fault=_no_fault,
    )
    assert answer_copies(plan, 1, seed=7) is plan
    two = answer_copies(plan, 2, seed=7)
    assert [(r.id, r.seed) for r in two.first] == [("c", None), ("c~1", 8)]
    assert two.later == {"c": (), "c~1": ()} and two.n_answers == 2
