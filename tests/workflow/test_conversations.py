"""Conversations as users have them, through the real samples -> generate -> tokenize jobs:
a ShareGPT dump whose first record opens with the bot's greeting, and multi-turn records whose
assistant turns `regenerate` answers anew."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import DATASET, make_workdir, snakemake, tiny_config, write_config

from specbuild.infra.io import read_json, read_jsonl

pytestmark = pytest.mark.workflow

GREETING = {"from": "gpt", "value": "Hello! I am a dataset bot. Ask me anything."}


def _exchange(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


RECORDS = [
    # the dump's first record opens with the bot's greeting
    {"conversations": [GREETING, *_exchange("What is 2 + 3?", "dataset says five")]},
    {
        "conversations": _exchange("Say hi.", "dataset says hi")
        + _exchange("Now say bye.", "dataset says bye")
        + _exchange("And thanks.", "dataset says thanks")
    },
    *(
        {"conversations": _exchange(q, f"dataset answer {i}")}
        for i, q in enumerate(
            [
                "Name a colour.",
                "Say hello in French.",
                "What is 10 minus 4?",
                "Count to three.",
                "Is ice cold?",
                "Name a fruit.",
            ]
        )
    ),  # fmt: skip
]


def test_a_greeting_is_dropped_at_samples_and_only_target_text_is_trained(
    tmp_path, target_dir, tokenizer
):
    workdir = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config(generate={"max_new_tokens": 24})
    config["datasets"][DATASET] |= {"format": "sharegpt", "shard_size": len(RECORDS)}
    write_config(workdir, config)
    raw = workdir / "raw" / f"{DATASET}.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    snakemake(workdir, f"results/tokenized/{DATASET}/00000.jsonl", "--cores", "2")

    results = workdir / "results"
    samples = list(read_jsonl(results / "samples" / DATASET / "00000.jsonl"))
    assert len(samples) == len(RECORDS)
    assert samples[0]["repairs"] == ["dropped 1 assistant turn(s) before the first user turn"]
    assert all(r["repairs"] == [] for r in samples[1:])
    log = (workdir / "logs" / "samples" / DATASET / "00000.log").read_text()
    assert f"repaired raw/{raw.name}:1: dropped 1 assistant turn(s)" in log
    assert "kept 8 + rejected 0 (1 repaired)" in log

    generated = {r["id"]: r for r in read_jsonl(results / "generated" / DATASET / "00000.jsonl")}
    tokenized = {r["id"]: r for r in read_jsonl(results / "tokenized" / DATASET / "00000.jsonl")}
    meta = read_json(results / "tokenized" / DATASET / "00000.meta.json")
    rejected = list(read_jsonl(results / "tokenized" / DATASET / "00000.rejected.jsonl"))
    assert meta["in"] == meta["kept"] + meta["rejected"] == len(RECORDS)
    assert rejected == [] and sorted(tokenized) == sorted(generated) == [r["id"] for r in samples]
    # the three-question record was answered turn by turn on the target's own answers (as far
    # as they finished): every assistant turn is the target's, and only those are trained on
    multi = generated[samples[1]["id"]]["messages"]
    users = [m["content"] for m in multi if m["role"] == "user"]
    # greedy, so the same every run: the second answer is written after the first
    assert len(users) >= 2 and users == ["Say hi.", "Now say bye.", "And thanks."][: len(users)]
    assert [m["role"] for m in multi] == ["user", "assistant"] * len(users)
    for cid, row in tokenized.items():
        answers = [m["content"] for m in generated[cid]["messages"] if m["role"] == "assistant"]
        assert all("dataset" not in a for a in answers)
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert tokenizer.decode(masked) == "".join(f"{a}<|im_end|>" for a in answers)
        assert "dataset" not in tokenizer.decode(row["input_ids"])
