"""Helper stage `synthesize`: prompts written by the real SmolLM2 (hf) and through the
OpenAI-compatible client against the loopback SGLang stub."""

import json
import sys
from pathlib import Path

import pytest

from specbuild.backends import make_backend
from specbuild.backends.base import Generation, GenerationRequest, SamplingParams
from specbuild.infra.io import read_jsonl
from specbuild.rejects import ShardFiles, check_rejected_share
from specbuild.synthesize import PromptWriting, open_user_turn, synthesize_shard

STUB = Path(__file__).resolve().parents[1] / "stubs" / "sglang_stub.py"


def test_open_user_turn_stops_where_the_user_text_starts(tokenizer):
    prefix = open_user_turn(tokenizer)
    full = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert full.startswith(prefix + "Hi")
    assert prefix.endswith("<|im_start|>user\n")


def test_a_template_that_hides_the_user_text_is_refused(tokenizer):
    class Hiding:
        def apply_chat_template(self, messages, **_):
            return "<s>user says something</s>"

    with pytest.raises(ValueError, match="exactly once"):
        open_user_turn(Hiding())


def test_a_request_has_exactly_one_of_messages_and_prompt():
    with pytest.raises(ValueError, match="exactly one"):
        GenerationRequest("a")
    with pytest.raises(ValueError, match="exactly one"):
        GenerationRequest("a", [{"role": "user", "content": "x"}], prompt="x")


def _synth(tmp_path, target_dir, backend, *, start=0, stop=6, max_tokens=24, openers=()):
    out, rej = tmp_path / f"s{start}.jsonl", tmp_path / f"s{start}.rejected.jsonl"
    kept, bad = synthesize_shard(
        fingerprint=target_dir / "fingerprint.json",
        files=ShardFiles(out=out, rejected=rej, counts=tmp_path / f"s{start}.counts.json"),
        dataset="chat",
        start=start,
        stop=stop,
        backend=backend,
        writing=PromptWriting(
            SamplingParams(max_new_tokens=max_tokens, temperature=1.0, seed=7), tuple(openers)
        ),
        batch_size=4,
    )
    return kept, bad, list(read_jsonl(out)), list(read_jsonl(rej))


@pytest.mark.slow  # decodes with the real SmolLM2
def test_hf_writes_seeded_prompts_and_keeps_every_reject_with_a_reason(tmp_path, target_dir):
    def hf():
        return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)

    kept, bad, rows, rejects = _synth(tmp_path / "a", target_dir, hf, stop=4, max_tokens=64)
    assert kept + bad == 4 and len(rows) == kept and len(rejects) == bad
    assert kept >= 1
    ids = [r["id"] for r in rows] + [r["id"] for r in rejects]
    assert sorted(ids) == [f"chat-{i:07d}" for i in range(4)]
    for r in rows:
        [turn] = r["messages"]
        assert turn["role"] == "user" and turn["content"] == turn["content"].strip() != ""
        assert "<|im_" not in turn["content"]
        assert r["source"]["synthesized_by"] == "hf"
        assert r["source"]["seed"] == 7 + int(r["id"][-7:])
    assert all(r["reason"] for r in rejects)
    # the same seeds in the same batches write the same prompts
    again = _synth(tmp_path / "b", target_dir, hf, stop=4, max_tokens=64)[2]
    assert again == rows


class Recording:
    """A backend that keeps the requests it gets and answers each with `write(request)`."""

    name = model = "recording"

    def __init__(self, write):
        self.write, self.seen = write, []

    def generate(self, requests, sampling):
        self.seen.extend(requests)
        return [Generation(r.id, self.write(r), "stop", len(r.prompt), 3) for r in requests]

    def close(self):
        pass


def test_the_backend_gets_the_open_user_turn_as_token_ids(tmp_path, target_dir, tokenizer):
    # Ids, not text: a server tokenizing rendered text puts its own BOS before the template's.
    engine = Recording(lambda r: f"Question {r.seed}?")
    kept, bad, rows, _ = _synth(tmp_path, target_dir, lambda: engine, stop=3)
    seen = engine.seen
    prefix = open_user_turn(tokenizer)
    ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    assert [r.prompt for r in seen] == [ids] * 3 and tokenizer.decode(ids) == prefix
    assert (kept, bad) == (3, 0) and rows[0]["messages"][0]["content"] == "Question 7?"


def test_openers_start_each_prompt_in_turn_and_an_opener_alone_is_rejected(
    tmp_path, target_dir, tokenizer
):
    # request 2 writes nothing after its opener
    engine = Recording(lambda r: "" if r.id.endswith("2") else f" thing {r.seed}.")
    openers = ("Write", "Imagine you are")
    kept, bad, rows, rejects = _synth(
        tmp_path, target_dir, lambda: engine, start=1, stop=5, openers=openers
    )
    seen = engine.seen
    turn = open_user_turn(tokenizer)
    # prompt i opens with openers[i % 2], tokenized together with the turn's start
    assert [tokenizer.decode(r.prompt) for r in seen] == [
        turn + "Imagine you are",
        turn + "Write",
        turn + "Imagine you are",
        turn + "Write",
    ]
    assert seen[1].prompt == tokenizer(turn + "Write", add_special_tokens=False)["input_ids"]
    assert (kept, bad) == (3, 1)
    assert [r["messages"][0]["content"] for r in rows] == [
        "Imagine you are thing 8.",
        "Imagine you are thing 10.",
        "Write thing 11.",
    ]
    assert [r["source"]["opener"] for r in rows] == ["Imagine you are"] * 2 + ["Write"]
    assert rejects == [{"id": "chat-0000002", "reason": "empty prompt", "text": ""}]


def test_the_rules_sampling_param_unfolds_into_sampling_and_openers():
    fields = {"max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 3}
    assert PromptWriting.from_param(fields) == PromptWriting(SamplingParams(**fields), ())
    writing = PromptWriting.from_param(fields | {"openers": ["Write", "Explain"]})
    assert writing.openers == ("Write", "Explain") and writing.sampling.seed == 3


@pytest.mark.slow  # decodes with the real SmolLM2
def test_smollm2_continues_an_opener_into_a_request(tmp_path, target_dir):
    def hf():
        return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)

    kept, bad, rows, rejects = _synth(
        tmp_path, target_dir, hf, stop=2, max_tokens=64, openers=("Write a poem",)
    )
    assert kept + bad == 2 and kept >= 1
    for r in rows:
        text = r["messages"][0]["content"]
        assert text.startswith("Write a poem") and len(text) > len("Write a poem")


@pytest.mark.slow  # decodes with the real SmolLM2
def test_too_many_unfinished_prompts_fail_the_shards_check_and_the_rejects_stay(
    tmp_path, target_dir
):
    def hf():
        return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)

    kept, bad, _, rejects = _synth(tmp_path, target_dir, hf, stop=4, max_tokens=1)
    assert (kept, bad) == (0, 4)
    assert {r["reason"] for r in rejects} == {"prompt not finished within 1 tokens"}
    with pytest.raises(
        RuntimeError, match="4 of 4 rows rejected .*synthesize.max_rejected_fraction"
    ):
        check_rejected_share(
            counts=tmp_path / "s0.counts.json",
            out=tmp_path / "ok.json",
            limit=0.5,
            setting="datasets.chat.synthesize.max_rejected_fraction",
        )
    assert len(list(read_jsonl(tmp_path / "s0.rejected.jsonl"))) == 4


def test_sglang_writes_prompts_through_completions_with_a_seed_per_request(tmp_path, target_dir):
    def sglang():
        return make_backend(
            "sglang",
            target_dir=str(target_dir),
            launcher=(sys.executable, str(STUB)),
            startup_timeout_s=20,
        )

    kept, bad, rows, rejects = _synth(tmp_path, target_dir, sglang, stop=8, max_tokens=64)
    assert kept + bad == 8
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(set(texts)) == len(texts) == kept > 1  # a seed per request: no two alike
    assert {r["source"]["synthesized_by"] for r in rows} == {"sglang"}
    assert json.dumps(rows).count("chat-") == kept
