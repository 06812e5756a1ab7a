"""A tiny real run (real Snakemake, real SmolLM2) produces tokenized rows that keep their word."""

from __future__ import annotations

import pytest

from specbuild.infra.io import read_json, read_jsonl
from specbuild.tokenization import ROW_KEYS

pytestmark = pytest.mark.workflow


def _pairs(workdir):
    for tok_path in sorted((workdir / "results" / "tokenized").rglob("*[0-9].jsonl")):
        gen_path = workdir / "results" / "generated" / tok_path.parent.name / tok_path.name
        generated = {r["id"]: r for r in read_jsonl(gen_path)}
        yield tok_path, [(row, generated[row["id"]]) for row in read_jsonl(tok_path)]


def test_every_tokenized_row_is_consistent_and_masks_exactly_the_response(
    built_workflow, tokenizer
):
    n = 0
    for _, rows in _pairs(built_workflow.workdir):
        for row, gen in rows:
            assert tuple(row) == ROW_KEYS
            assert row["seq_len"] == len(row["input_ids"]) == len(row["loss_mask"])
            assert row["seq_len"] == row["n_prompt_tokens"] + row["n_response_tokens"]
            masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
            text = tokenizer.decode(masked, skip_special_tokens=True)
            assert text == gen["messages"][-1]["content"]
            assert row["finish_reason"] == gen["finish_reason"] in ("stop", "length")
            n += 1
    assert n > 0


def test_counts_are_conserved_from_samples_to_tokens(built_workflow):
    wd = built_workflow.workdir
    for meta_path in sorted((wd / "results" / "tokenized").rglob("*.meta.json")):
        meta = read_json(meta_path)
        shard = meta_path.name.removesuffix(".meta.json")
        samples = wd / "results" / "samples" / meta_path.parent.name / f"{shard}.jsonl"
        assert meta["in"] == len(list(read_jsonl(samples))) == meta["kept"] + meta["rejected"]
        assert meta["rows"] == meta["kept"]  # one-turn prompts: a row a record
        assert meta["tokenizer_fingerprint"] and meta["chat_template_sha256"]


def test_a_single_output_path_can_be_asked_for(built_workflow, tmp_path):
    from workflow_helpers import copy_workdir, snakemake

    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    target = wd / "results" / "tokenized" / "tiny" / "00000.jsonl"
    target.unlink()
    proc = snakemake(wd, "--cores", "1", "results/tokenized/tiny/00000.jsonl")
    assert target.exists() and "tokenize" in proc.stderr + proc.stdout


def test_the_html_report_shows_every_table_and_plot_in_its_category(built_workflow, tmp_path):
    import json
    import re

    from workflow_helpers import snakemake

    html = tmp_path / "report.html"
    snakemake(built_workflow.workdir, "--cores", "1", "--report", str(html))
    found = re.search(r"var categories = (\{.*?\});\s*\n", html.read_text(), re.S)
    categories = json.loads(found.group(1))
    files = {f for sub in categories.values() for names in sub.values() for f in names}
    assert set(categories) == {"Benchmark", "Data", "Training"}
    assert {"results/tables/bench.html", "results/plots/acceptance.png"} <= files
    assert {"results/tables/data.html", "results/tables/disk.html"} <= files
    assert {"results/tables/train.html", "results/plots/train.png"} <= files
