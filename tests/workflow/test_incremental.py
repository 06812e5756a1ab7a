"""Only stale steps rerun: a complete tiny run, then appended records and changed settings.

Each test states which jobs a change must schedule, as the exact (rule, wildcards) list of a
dry-run, and, where it runs them, that every other file kept its mtime and content. Appending
runs for real on a copy of the built workflow; setting changes are dry-runs against it.

What the stages after the shards read (so what a change must rerun):
  vocab    every tokenized shard of the base recipe's datasets
  align    the first hidden shard of each dataset (but those only a variant trains on)
  train    its variant's datasets' hidden shards, vocab, align   export  train (per variant)
  bench    a drafter chain: its variant's export; baseline: only the target and the prompts
  variants every variant's train metrics and its bench rows
  report_bench     every bench row file and train's metrics
  report_pipeline  every samples, generated, tokenized and hidden shard, vocab, align, train
  rejects_check    one shard's counts (the next stage waits for it)
  rejects          every shard's counts and every max_rejected_fraction (read by `all` only)
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from workflow_helpers import (
    DATASET,
    N_RECORDS,
    SHARD_SIZE,
    append_records,
    copy_workdir,
    planned_jobs,
    results_state,
    shard_jobs,
    snakemake,
    tiny_config,
    write_config,
)

from specbuild.hidden.shards import read_shard
from specbuild.infra.io import read_jsonl

pytestmark = pytest.mark.workflow

# Per-shard stages in DAG order, and the results folder each writes.
SHARD_STAGES = {
    "samples": "samples",
    "generate": "generated",
    "tokenize": "tokenized",
    "hidden": "hidden",
}
# Stages whose shards pass a rejected-row check (rules/rejects.smk), and its `stage` wildcard.
CHECKED = {"samples": "samples", "generate": "generated", "tokenize": "tokenized"}
# Jobs about rejected rows: a check per checked shard, and the one reject table over them all.
REJECT_RULES = {"rejects_check", "rejects"}
SHARDS = [f"{i:05d}" for i in range(-(-N_RECORDS // SHARD_SIZE))]


def is_drafter_dependent(job: tuple[str, str]) -> bool:
    """Jobs that read the trained drafter (or its metrics): they rerun after any retraining."""
    rule, wildcards = job
    if rule == "bench":
        return "chain=baseline" not in wildcards
    return rule in {"train", "export", "variants", "report_bench", "report_pipeline", "serve"}


def is_benchmarking(job: tuple[str, str]) -> bool:
    """The bench jobs and the tables of their rows (the variants table shows the measured
    acceptance of each variant)."""
    return job[0] in {"bench", "report_bench", "variants"}


def reads_tokens(job: tuple[str, str]) -> bool:
    """After new tokens: the vocab, the alignment check (via hidden) and the drafter's jobs."""
    return job[0] in {"vocab", "align"} or is_drafter_dependent(job)


def reads_features(job: tuple[str, str]) -> bool:
    """After new hidden states of every shard: vocab counts tokens, not features, so it stays."""
    return job[0] == "align" or is_drafter_dependent(job)


def reads_all_shards(job: tuple[str, str]) -> bool:
    """After new shards beyond the first: align reads only shard 00000, so it stays."""
    return job[0] == "vocab" or is_drafter_dependent(job)


def check_jobs(stages, shards, dataset: str = DATASET) -> list[tuple[str, str]]:
    """The rejected-row checks of these stages' shards, and the reject table when there are any
    (it reads every shard's counts)."""
    jobs = [
        ("rejects_check", f"stage={CHECKED[stage]}, dataset={dataset}, shard={shard}")
        for stage in stages
        if stage in CHECKED
        for shard in shards
    ]
    return jobs + [("rejects", "")] if jobs else []


def expected_jobs(built, first_shard_stage: str | None, shards, also) -> list[tuple[str, str]]:
    """Per-shard jobs from `first_shard_stage` on for `shards` (with their checks), plus the jobs
    of the built run (with their wildcards) that `also(job)` selects; stages the workflow lacks
    drop out."""
    rules = {rule for rule, _ in built.jobs}
    jobs = []
    if first_shard_stage is not None:
        names = list(SHARD_STAGES)
        stages = [r for r in names[names.index(first_shard_stage) :] if r in rules]
        jobs = shard_jobs(stages, shards) + check_jobs(stages, shards)
    jobs += [
        j for j in built.jobs if j[0] not in SHARD_STAGES and j[0] not in REJECT_RULES and also(j)
    ]
    return sorted(jobs)


def dry_run_with(built, tmp_path, **sections) -> list[tuple[str, str]]:
    """The jobs a dry-run schedules when keys of config sections change (the rest kept)."""
    changed = write_config(tmp_path, tiny_config(**sections), name="changed.yaml")
    return planned_jobs(built.workdir, "--configfile", str(changed))


def test_complete_run_leaves_no_job_to_schedule(built_workflow):
    assert built_workflow.jobs, "the first run scheduled nothing"
    assert planned_jobs(built_workflow.workdir) == []
    # The plain command users type (profiles/default supplies the cores) says the same.
    proc = snakemake(built_workflow.workdir, "--dry-run")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_passing_the_unchanged_config_again_schedules_nothing(built_workflow, tmp_path):
    # Guards the tests below: a --configfile equal to the built config is no change.
    assert dry_run_with(built_workflow, tmp_path) == []


def test_generation_temperature_reruns_from_generate_down(built_workflow, tmp_path):
    jobs = dry_run_with(built_workflow, tmp_path, generate={"temperature": 0.7})
    assert jobs == expected_jobs(built_workflow, "generate", SHARDS, reads_tokens)


def test_a_datasets_own_answer_cap_reruns_its_generate_only_when_it_changes_the_cap(
    built_workflow, tmp_path
):
    # datasets.<name>.max_new_tokens overrides generate.max_new_tokens for that dataset: the
    # value reaches the job, not the key, so naming today's cap again reruns nothing.
    cap = tiny_config()["generate"]["max_new_tokens"]
    same = tiny_config()
    same["datasets"][DATASET]["max_new_tokens"] = cap
    config = write_config(tmp_path, same, name="same_cap.yaml")
    assert planned_jobs(built_workflow.workdir, "--configfile", str(config)) == []
    longer = tiny_config()
    longer["datasets"][DATASET]["max_new_tokens"] = cap + 4
    config = write_config(tmp_path, longer, name="longer_cap.yaml")
    jobs = planned_jobs(built_workflow.workdir, "--configfile", str(config))
    assert jobs == expected_jobs(built_workflow, "generate", SHARDS, reads_tokens)


def test_tokenize_max_length_reruns_from_tokenize_down_but_not_generate(built_workflow, tmp_path):
    jobs = dry_run_with(built_workflow, tmp_path, tokenize={"max_length": 200})
    assert jobs == expected_jobs(built_workflow, "tokenize", SHARDS, reads_tokens)


def test_aux_layer_ids_rerun_hidden_and_after_but_not_generate_or_tokenize(
    built_workflow, tmp_path
):
    jobs = dry_run_with(built_workflow, tmp_path, hidden={"layer_ids": [2, 14, 25]})
    assert jobs == expected_jobs(built_workflow, "hidden", SHARDS, reads_features)


def test_fp8_storage_rebuilds_hidden_and_after_and_trains_on_fp8_aux_and_last(
    built_workflow, tmp_path
):
    """hidden.storage fp8-g<N> reruns what reads features, nothing upstream of hidden, and the
    fp8 shards (aux and last, N-channel scales) verify, align, train and export end to end."""
    jobs = dry_run_with(built_workflow, tmp_path, hidden={"storage": "fp8-g64"})
    assert jobs == expected_jobs(built_workflow, "hidden", SHARDS, reads_features)
    workdir = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    fp8 = write_config(tmp_path, tiny_config(hidden={"storage": "fp8-g64"}), name="fp8.yaml")
    kept = {stage: results_state(workdir, stage) for stage in ("tokenized", "vocab")}
    snakemake(workdir, "--cores", "2", "--configfile", str(fp8))
    assert {stage: results_state(workdir, stage) for stage in kept} == kept
    for path in sorted((workdir / "results" / "hidden").rglob("*.safetensors")):
        tensors, meta = read_shard(path)
        assert meta["dtype"] == "fp8", path
        for key, layers in (("aux", 3), ("last", 1)):
            assert tensors[key].dtype == torch.float8_e4m3fn
            assert tensors[f"{key}_scale"].shape == (tensors[key].shape[0], layers * 576 // 64)
    assert (workdir / "results" / "drafter" / "base" / "model.safetensors").exists()
    assert planned_jobs(workdir, "--configfile", str(fp8)) == []


def test_training_hyperparameter_reruns_train_export_and_the_drafter_benches(
    built_workflow, tmp_path
):
    # The no-drafter baseline bench reads only the target and the prompts: it stays.
    jobs = dry_run_with(built_workflow, tmp_path, train={"lr": 3e-3})
    assert jobs == expected_jobs(built_workflow, None, [], is_drafter_dependent)
    assert ("bench", "engine=hf, drafter=base, chain=2-1-3") in jobs


def test_benchmark_setting_reruns_only_benchmarking(built_workflow, tmp_path):
    jobs = dry_run_with(built_workflow, tmp_path, bench={"max_new_tokens": 12})
    assert jobs == expected_jobs(built_workflow, None, [], is_benchmarking)
    assert ("bench", "engine=hf, drafter=none, chain=baseline") in jobs


def test_appending_records_reruns_only_the_partial_and_new_shards(built_workflow, tmp_path):
    workdir = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    rules = {rule for rule, _ in built_workflow.jobs}
    folders = [folder for stage, folder in SHARD_STAGES.items() if stage in rules]
    before = {f: results_state(workdir, f) for f in folders}
    assert planned_jobs(workdir) == []  # the copy is as up to date as the original

    # 6 -> 9 records in shards of 4: shard 00000 is full and stays, 00001 grows from 2 to 4
    # records, 00002 is new with 1.
    append_records(workdir, 9)
    new_shards = expected_jobs(built_workflow, "samples", ["00001", "00002"], reads_all_shards)
    assert planned_jobs(workdir) == new_shards

    snakemake(workdir, "--cores", "2")
    after = {f: results_state(workdir, f) for f in folders}
    for folder in folders:
        old = {p: v for p, v in before[folder].items() if f"/{DATASET}/00000." in p}
        assert old, f"no files of shard 00000 under results/{folder}"
        assert {p: after[folder].get(p) for p in old} == old, (
            f"results/{folder}/ shard 00000 changed"
        )
        grown = [p for p in before[folder] if f"/{DATASET}/00001." in p]
        assert grown and any(after[folder][p][0] != before[folder][p][0] for p in grown), (
            f"results/{folder}/ shard 00001 was not rebuilt"
        )
        assert any(f"/{DATASET}/00002." in p for p in after[folder]), f"no shard 00002 in {folder}"
    assert planned_jobs(workdir) == []


def test_a_synthetic_dataset_adds_only_its_own_shards_written_by_the_target(
    built_workflow, tmp_path
):
    # 5 self-written prompts in shards of 2: synthesize (not samples) starts each new shard;
    # the tiny dataset's shards stay; align now also reads the new dataset's first shard.
    changed = tiny_config()
    changed["datasets"]["chat"] = {"synthesize": {"count": 5}, "shard_size": 2}
    config = write_config(tmp_path, changed, name="synthetic.yaml")
    jobs = planned_jobs(built_workflow.workdir, "--configfile", str(config))
    stages = ["synthesize", "generate", "tokenize", "hidden"]
    shards = ("00000", "00001", "00002")
    new = [(r, f"dataset=chat, shard={s}") for r in stages for s in shards]
    rules = {rule for rule, _ in built_workflow.jobs}
    new = [j for j in new if j[0] in rules | {"synthesize"}]
    checks = check_jobs(["samples", "generate", "tokenize"], shards, dataset="chat")
    after = [
        j
        for j in built_workflow.jobs
        if j[0] not in SHARD_STAGES and j[0] not in REJECT_RULES and reads_tokens(j)
    ]
    assert jobs == sorted(new + checks + after)


def test_reject_limits_are_checks_changing_them_reruns_only_the_reject_table(
    built_workflow, tmp_path
):
    # No shard, no feature and no training reruns: the outputs cannot depend on a limit.
    limits = {"max_rejected_fraction": 0.5}
    jobs = dry_run_with(built_workflow, tmp_path, samples=limits, generate=limits, tokenize=limits)
    assert jobs == [("rejects", "")]


def test_a_new_limit_given_with_a_new_temperature_still_reruns_from_generate(
    built_workflow, tmp_path
):
    # Guards the trap rules/rejects.smk avoids: a job downstream of a rerun job (by an
    # ancient() input) is not checked for its own changes, so the temperature would be lost.
    jobs = dry_run_with(
        built_workflow, tmp_path, generate={"temperature": 0.7, "max_rejected_fraction": 0.5}
    )
    assert jobs == expected_jobs(built_workflow, "generate", SHARDS, reads_tokens)


def test_a_shard_over_its_limit_stops_before_generate_and_a_raised_limit_reruns_no_shard(
    built_workflow, tmp_path
):
    # Shard 00001 grows from 2 records to 4: a good one (record 6) and a broken line (7).
    # (A broken line alone would leave the kept rows as they were: nothing after the check
    # would need a rerun, the reject table alone would fail.)
    workdir = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    append_records(workdir, N_RECORDS + 1)
    with open(workdir / "raw" / f"{DATASET}.jsonl", "a") as fh:
        fh.write("not json\n")
    target = f"results/tokenized/{DATASET}/00001.jsonl"
    generated_before = results_state(workdir, "generated")
    proc = snakemake(workdir, "--cores", "2", target, check=False)
    out = proc.stdout + proc.stderr
    rejected = f"results/samples/{DATASET}/00001.rejected.jsonl"
    copy = f"logs/checks/samples/{DATASET}/00001.rejected.jsonl"
    assert proc.returncode != 0
    assert "1 of 4 rows rejected (25.0% > samples.max_rejected_fraction 5.0%)" in out
    assert rejected in out and copy in out
    for path in (rejected, copy):  # the rejects the message names are there, with the line
        (row,) = read_jsonl(workdir / path)
        assert row["line"] == 8 and row["reason"].startswith("malformed JSON")
    # the check stopped the shard before generate
    assert results_state(workdir, "generated") == generated_before
    samples_before = results_state(workdir, "samples")

    raised = tiny_config(samples={"max_rejected_fraction": 0.5})
    raised = write_config(tmp_path, raised, name="raised.yaml")
    # the target first: --configfile takes every word after it as a config file
    then = planned_jobs(workdir, target, "--configfile", str(raised))
    assert then == sorted(
        shard_jobs(["generate", "tokenize"], ["00001"])
        + [
            ("rejects_check", f"stage=samples, dataset={DATASET}, shard=00001"),
            ("rejects_check", f"stage=generated, dataset={DATASET}, shard=00001"),
        ]
    )
    snakemake(workdir, target, "--cores", "2", "--configfile", str(raised))
    assert results_state(workdir, "samples") == samples_before  # the samples shard was kept
    assert (workdir / target).exists()


def test_adding_a_variant_runs_only_its_training_export_and_benches_and_removing_it_only_tables(
    built_workflow, tmp_path
):
    # The shards, vocab, base drafter and benches stay; the tables compare one more variant.
    long = {"variants": {"long": {"epochs": 2}}}
    jobs = dry_run_with(built_workflow, tmp_path, train=long)
    assert jobs == [
        ("bench", "engine=hf, drafter=long, chain=2-1-3"),
        ("export", "variant=long"),
        ("report_bench", ""),
        ("train", "variant=long"),
        ("variants", ""),
    ]
    workdir = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    with_long = write_config(tmp_path, tiny_config(train=long), name="long.yaml")
    kept = ("hidden", "vocab", "drafter", "bench")
    before = {stage: results_state(workdir, stage) for stage in kept}
    snakemake(workdir, "--cores", "2", "--configfile", str(with_long))
    assert results_state(workdir, "hidden") == before["hidden"]
    assert results_state(workdir, "vocab") == before["vocab"]
    drafters = results_state(workdir, "drafter")
    assert {k: v for k, v in drafters.items() if "/base/" in k} == before["drafter"]
    assert "results/drafter/long/model.safetensors" in drafters
    benches = results_state(workdir, "bench")
    assert {k: v for k, v in benches.items() if "/long/" not in k} == before["bench"]
    long_rows = list(read_jsonl(workdir / "results/bench/hf/long/2-1-3.jsonl"))
    assert long_rows and {(r["drafter"], r["chain"]) for r in long_rows} == {("long", "2-1-3")}
    table = (workdir / "results" / "tables" / "variants.md").read_text()
    assert "| base |" in table and "| long |" in table and "epochs=2" in table
    assert "hf gsm8k 2-1-3" in table  # the measured acceptance beside training's estimate
    bench_table = (workdir / "results" / "tables" / "bench.md").read_text()
    assert bench_table.startswith("| engine | set | chain | drafter | device |")
    assert "| hf | gsm8k | 2-1-3 | long |" in bench_table
    # back to the built config: only the tables are rewritten, without the removed variant
    assert planned_jobs(workdir) == [("report_bench", ""), ("variants", "")]


def test_a_variant_left_out_of_bench_variants_is_trained_and_tabled_but_never_benched(
    built_workflow, tmp_path
):
    jobs = dry_run_with(
        built_workflow,
        tmp_path,
        train={"variants": {"long": {"epochs": 2}}},
        bench={"variants": ["base"]},
    )
    assert jobs == [("export", "variant=long"), ("train", "variant=long"), ("variants", "")]
    # and benching only the new one drops base's rows from the tables, rerunning no bench
    jobs = dry_run_with(
        built_workflow,
        tmp_path,
        train={"variants": {"long": {"epochs": 2}}},
        bench={"variants": ["long"]},
    )
    assert ("bench", "engine=hf, drafter=long, chain=2-1-3") in jobs
    assert not [j for j in jobs if j[0] == "bench" and "drafter=long" not in j[1]]


def test_a_variant_training_on_one_more_dataset_adds_its_shards_and_reruns_nothing_of_base(
    built_workflow, tmp_path
):
    # The base recipe names its datasets, so the new one is the variant's alone: the shared
    # vocabulary, the alignment gate and the base drafter stay; the variant counts its own.
    workdir = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    extra = workdir / "raw" / "extra.jsonl"
    extra.write_text("".join(f'{{"prompt": "{p}"}}\n' for p in ["Spell cat.", "Add 1 and 1."]))
    config = tiny_config(
        datasets={"extra": {"path": "raw/extra.jsonl", "format": "prompt", "shard_size": 4}},
        train={"datasets": [DATASET], "variants": {"more": {"datasets": [DATASET, "extra"]}}},
    )
    changed = write_config(tmp_path, config, name="more.yaml")
    jobs = planned_jobs(workdir, "--configfile", str(changed))
    extra_shard = "dataset=extra, shard=00000"
    assert jobs == sorted(
        [(stage, extra_shard) for stage in SHARD_STAGES]
        + [("rejects_check", f"stage={stage}, {extra_shard}") for stage in CHECKED.values()]
        + [("rejects", ""), ("report_pipeline", "")]
        + [("variant_vocab", "variant=more")]
        + [("train", "variant=more"), ("export", "variant=more")]
        + [("bench", "engine=hf, drafter=more, chain=2-1-3")]
        + [("report_bench", ""), ("variants", "")]
    )
    snakemake(workdir, "variants", "--cores", "2", "--configfile", str(changed))
    trained = {
        v: int(re.search(r"(\d+) train / ", (workdir / f"logs/train/{v}.log").read_text())[1])
        for v in ("base", "more")
    }
    assert trained["more"] == trained["base"] + 2  # the two extra prompts, trained on
    stats = {
        v: json.loads((workdir / f"results/vocab/{v}vocab_stats.json").read_text())
        for v in ("", "more/")
    }
    assert stats["more/"]["masked_tokens"] > stats[""]["masked_tokens"]  # the extra answers
    table = (workdir / "results" / "tables" / "variants.md").read_text()
    assert f'| more | datasets=["{DATASET}", "extra"] | {DATASET}, extra |' in table
    assert "| vocab coverage |" in table


def test_a_drafter_built_elsewhere_is_benched_beside_ours_and_rewrites_only_the_bench_tables(
    built_workflow, tmp_path
):
    # any exported folder works; the base drafter's stands in for another trainer's export
    jobs = dry_run_with(
        built_workflow, tmp_path, bench={"drafters": {"theirs": "results/drafter/base/"}}
    )
    assert jobs == [("bench", "engine=hf, drafter=theirs, chain=2-1-3"), ("report_bench", "")]
