"""Kimi-K2.5's architecture on the CPU: a random-weight DeepSeek-V3 target (MLA + MoE, the
narrow test widths of benchmarks/h200/random_deepseek.py) through every stage with the PyTorch
engines, as the real Snakefile runs them: the checkpoint names, the layer-id rule SGLang
applies to it, a drafter of its shapes, and the bench with its break-even column."""

from __future__ import annotations

import pytest
from workflow_helpers import link_target, make_workdir, snakemake, tiny_config, write_config

from specbuild.infra.io import read_json, read_jsonl

pytestmark = pytest.mark.workflow

NAME = "deepseek-v3-test"


def test_a_deepseek_v3_target_goes_through_every_stage(tmp_path, target_dir, deepseek_target):
    wd = make_workdir(tmp_path / "wf", target_dir)
    link_target(wd, deepseek_target, name=NAME)
    config = tiny_config(
        target={"name": NAME, "source": str(deepseek_target)},
        hidden={"layer_ids": [2, 3, 5]},  # SGLang's DeepSeek takes these unshifted: [3, 4, 6]
        train={"init": "random"},  # its last layer is a mixture of experts
    )
    write_config(wd, config)
    snakemake(wd, "--cores", "2", timeout=1800)

    drafter = read_json(wd / "results" / "drafter" / "base" / "config.json")
    assert drafter["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 4, 6]
    assert (drafter["target_hidden_size"], drafter["vocab_size"]) == (2048, 49152)
    bench = {(r["chain"], r["engine"]): r for r in _table(wd, "bench")}
    chain = bench[("2-1-3", "hf")]
    assert float(chain["break_even"]) > 0 and float(chain["accept_length"]) >= 1.0
    assert float(bench[("baseline", "hf")]["break_even"]) == 1.0
    metrics = sorted((wd / "results" / "train").rglob("metrics.jsonl"))
    assert metrics and any(row.get("acceptance_length") for row in read_jsonl(metrics[0]))


def _table(wd, name):
    import csv

    with open(wd / "results" / "tables" / f"{name}.csv") as fh:
        return list(csv.DictReader(fh))
