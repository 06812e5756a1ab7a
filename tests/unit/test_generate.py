"""Stage `generate`: the hf backend on the real SmolLM2, keep vs regenerate, provenance."""

import json

import pytest

from specbuild.backends import SamplingParams, make_backend
from specbuild.backends.base import Generation, GenerationRequest
from specbuild.backends.hf import split_reasoning
from specbuild.generate import generate_shard
from specbuild.io import read_json, read_jsonl

ASK = [{"role": "user", "content": "Name one primary color."}]


@pytest.fixture(scope="module")
def hf(target_dir):
    return make_backend("hf", target_dir=str(target_dir), device="cpu", batch_size=4)


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


def test_reasoning_is_split_from_the_answer():
    assert split_reasoning("<think>\nplan\n</think>\n\nAnswer") == ("Answer", "plan")
    assert split_reasoning("Answer") == ("Answer", None)


def _samples(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_keep_mode_reuses_dataset_answers_without_loading_a_model(tmp_path, target_dir):
    rows = [{"id": "d-0", "messages": ASK + [{"role": "assistant", "content": "Red."}]}]
    out = tmp_path / "g.jsonl"

    def no_model():
        raise AssertionError("keep mode must not build a backend when every answer exists")

    generate_shard(
        samples=_samples(tmp_path / "s.jsonl", rows),
        fingerprint=target_dir / "fingerprint.json",
        out=out,
        rejected=tmp_path / "r.jsonl",
        counts=tmp_path / "c.json",
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
    generate_shard(
        samples=_samples(tmp_path / "s.jsonl", rows),
        fingerprint=target_dir / "fingerprint.json",
        out=out,
        rejected=tmp_path / "r.jsonl",
        counts=tmp_path / "c.json",
        backend=lambda: hf,
        mode="regenerate",
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
    kept, bad = generate_shard(
        samples=_samples(tmp_path / "s.jsonl", rows),
        fingerprint=target_dir / "fingerprint.json",
        out=out,
        rejected=rej,
        counts=counts,
        backend=lambda: engine,
        mode="regenerate",
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
