"""A folder in Kimi-K2.5's own layout (tests/kimi_layout.py: remote-code tokenizer and config
behind `auto_map`, tensors under `language_model.`, the text model in `text_config`) through
target, samples, generate (kept answers of two-turn conversations), tokenize, hidden (hf),
vocab, train and export on the CPU, as the real Snakefile runs them, no row rejected; and the
same folder without target.trust_remote_code stopping at `target` with one message."""

from __future__ import annotations

import json
import shutil

import pytest
from workflow_helpers import make_workdir, snakemake, tiny_config, write_config

from specbuild.infra.io import read_json, read_jsonl

pytestmark = pytest.mark.workflow

NAME = "kimi-layout"
CONVERSATIONS = [
    [
        ("What is 2 + 3?", "<think>Two plus three.</think>5."),
        ("And times 4?", "<think>Five times four.</think>20."),
    ],
    [
        ("Name a colour of the sky.", "<think>Daytime sky.</think>Blue."),
        ("And at night?", "<think>No sun.</think>Black."),
    ],
    [
        ("Say hello in French.", "<think>French greeting.</think>Bonjour."),
        ("And goodbye?", "<think>French farewell.</think>Au revoir."),
    ],
]
STAGES = ("target", "samples", "generate", "tokenize", "hidden", "vocab", "train", "export")
OUTPUTS = ["results/drafter/base/config.json", "results/tables/rejects.md"]


def _messages(turns):
    out = []
    for user, answer in turns:
        reasoning, content = answer.removeprefix("<think>").split("</think>")
        out.append({"role": "user", "content": user})
        out.append({"role": "assistant", "content": content, "reasoning_content": reasoning})
    return out


def _workdir(tmp_path, target_dir, source, *, trust):
    wd = make_workdir(tmp_path / "wf", target_dir)
    shutil.rmtree(wd / "results" / "target")  # the target job runs here, on the Kimi folder
    raw = wd / "raw" / "chats.jsonl"
    raw.write_text("".join(json.dumps({"messages": _messages(c)}) + "\n" for c in CONVERSATIONS))
    config = tiny_config(
        target={"name": NAME, "source": str(source), "trust_remote_code": trust},
        generate={"mode": "keep"},
        vocab={"draft_size": 256},
        train={"init": "random", "epochs": 1},
    )
    config["datasets"] = {
        "chats": {"path": "raw/chats.jsonl", "format": "messages", "shard_size": 2}
    }
    config["train"].pop("eval_set", None)
    write_config(wd, config)
    return wd


def test_a_kimi_layout_folder_goes_from_target_to_an_exported_drafter(
    tmp_path, target_dir, kimi_layout_source
):
    wd = _workdir(tmp_path, target_dir, kimi_layout_source, trust=True)
    proc = snakemake(wd, "--cores", "2", *OUTPUTS, timeout=1800)
    for stage in STAGES:
        assert f"rule {stage}:" in proc.stdout + proc.stderr, stage

    fp = read_json(wd / "results" / "target" / NAME / "fingerprint.json")
    assert fp["trust_remote_code"] is True and fp["weights_hash"] == "full"
    for stage in ("samples", "generated", "tokenized"):
        counts = sorted((wd / "results" / stage / "chats").glob("*.counts.json"))
        assert counts, stage
        for path in counts:
            c = read_json(path)
            assert c["rejected"] == 0 and c["kept"] > 0, (path, c)
    # Kimi's template drops earlier turns' reasoning: a row per assistant turn, each trained on
    # its own answer with its reasoning, as the served target sees that turn
    from specbuild.eagle.target_info import load_tokenizer

    tok = load_tokenizer(wd / "results" / "target" / NAME)
    rows = [
        r
        for p in sorted((wd / "results" / "tokenized" / "chats").glob("*.jsonl"))
        if not p.name.endswith(".rejected.jsonl")
        for r in read_jsonl(p)
    ]
    assert len(rows) == 2 * len(CONVERSATIONS)
    trained = {r["id"].rsplit("#", 1)[1]: [] for r in rows}
    for r in rows:
        text = tok.decode([t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
        trained[r["id"].rsplit("#", 1)[1]].append(text)
    answers = [[a for _, a in c] for c in CONVERSATIONS]
    for k in ("1", "2"):
        got = sorted(trained[k])
        want = sorted(turns[int(k) - 1] for turns in answers)
        assert all(w in g for g, w in zip(got, want, strict=True)), (got, want)
    meta = [read_json(p) for p in (wd / "results" / "tokenized" / "chats").glob("*.meta.json")]
    assert sum(m["reasoning_tokens"] for m in meta) > 0
    drafter = read_json(wd / "results" / "drafter" / "base" / "config.json")
    # the text model's shapes (SmolLM2 inside text_config), not the wrapper's config
    assert (drafter["target_hidden_size"], drafter["hidden_size"]) == (576, 576)
    assert (drafter["vocab_size"], drafter["draft_vocab_size"]) == (49152, 256)


def test_the_same_folder_without_trust_remote_code_stops_at_target_naming_the_key(
    tmp_path, target_dir, kimi_layout_source
):
    wd = _workdir(tmp_path, target_dir, kimi_layout_source, trust=False)
    proc = snakemake(wd, "--cores", "1", f"results/target/{NAME}/fingerprint.json", check=False)
    assert proc.returncode != 0
    log = (wd / "logs" / "target" / f"{NAME}.log").read_text()
    assert "set target.trust_remote_code: true in the config" in log
    assert "Traceback" not in log and "[y/N]" not in proc.stdout + proc.stderr + log
    assert not (wd / "results" / "target" / NAME / "fingerprint.json").exists()
