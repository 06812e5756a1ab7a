"""Every table (.csv, .md, .html) and plot the report rules write, which of them the HTML
report shows (with its category and caption: report/<name>_table.rst, _plot.rst), and what
they read. Which exist follows the config."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from specbuild.workflow.bench_plan import bench_engines, bench_row_files, bench_runs, sweeps
from specbuild.workflow.paths import HIDDEN_SHARD
from specbuild.workflow.shards import ShardIndex
from specbuild.workflow.tuning_plan import tuning_points

__all__ = [
    "ReportFile",
    "bench_report_files",
    "bench_report_inputs",
    "pipeline_report_files",
    "pipeline_report_inputs",
    "report_paths",
    "train_curves_dir",
    "train_metrics_variant",
    "tuning_report_files",
]


@dataclass(frozen=True)
class ReportFile:
    """An output of a report rule; with a caption, the HTML report shows it (Snakemake's
    report() flag, applied in rules/common.smk)."""

    path: str
    caption: str | None = None  # relative to rules/, where the flag is applied
    category: str | None = None
    subcategory: str | None = None


def table(name: str, category: str, subcategory: str) -> list[ReportFile]:
    """results/tables/<name>.{html,csv,md}; the HTML one in the report, captioned by
    report/<name>_table.rst."""
    caption = f"../report/{name}_table.rst"
    return [
        ReportFile(f"results/tables/{name}.html", caption, category, subcategory),
        ReportFile(f"results/tables/{name}.csv"),
        ReportFile(f"results/tables/{name}.md"),
    ]


def plot(name: str, category: str, subcategory: str) -> list[ReportFile]:
    """results/plots/<name>.png in the report, captioned by report/<name>_plot.rst."""
    caption = f"../report/{name}_plot.rst"
    return [ReportFile(f"results/plots/{name}.png", caption, category, subcategory)]


def bench_report_files(config: Mapping, variants: Collection[str]) -> list[ReportFile]:
    """The bench's tables and plots; the sweep's where a served engine sweeps."""
    engines = bench_engines(config)
    if not engines:
        return []
    out = table("bench", "Benchmark", "Acceptance")
    out += plot("acceptance", "Benchmark", "Acceptance")
    # acceptance per draft position: the hf engine reports it
    if "hf" in engines and config["bench"]["chains"]:
        out += table("positions", "Benchmark", "Acceptance")
        out += plot("positions", "Benchmark", "Acceptance")
    if config["report"]["train_metrics"]:
        out += table("train_vs_bench", "Benchmark", "Acceptance")
    # ours against drafters built elsewhere (another trainer's export), paired per request
    if config["bench"]["drafters"]:
        out += table("peers", "Benchmark", "Peers")
    out += table("latency", "Benchmark", "Speed")
    out += plot("speedup", "Benchmark", "Speed")
    # only where a job sweeps: a served bench of drafters outside sweep_drafters and no
    # baseline has no sweep rows
    if any(sweeps(config, e, d) for e in engines for d, _ in bench_runs(config, variants, e)):
        out += table("sweep", "Benchmark", "Concurrency")
        out += plot("sweep", "Benchmark", "Concurrency")
    return out


def pipeline_report_files(config: Mapping) -> list[ReportFile]:
    out = table("data", "Data", "Samples and tokens")
    out += table("vocab", "Data", "Vocabulary")
    out += table("align", "Data", "Alignment")
    out += table("disk", "Data", "Disk use")
    if config["report"]["train_metrics"]:
        out += table("train", "Training", "Curves")
        out += plot("train", "Training", "Curves")
    return out


def tuning_report_files(config: Mapping) -> list[ReportFile]:
    if not tuning_points(config):
        return []
    return table("tuning", "Tuning", "Points") + plot("tuning", "Tuning", "Points")


def report_paths(config: Mapping, variants: Collection[str]) -> list[str]:
    """Everything the HTML report shows, as plain paths: an input flagged report() would take
    its caption relative to the including file (the Snakefile, for `all`), not to rules/."""
    files = (
        bench_report_files(config, variants)
        + pipeline_report_files(config)
        + tuning_report_files(config)
    )
    return [f.path for f in files]


def bench_report_inputs(config: Mapping, variants: Collection[str]) -> dict:
    inputs: dict = {"rows": bench_row_files(config, variants)}
    if config["report"]["train_metrics"]:
        inputs["train"] = config["report"]["train_metrics"]
    return inputs


def pipeline_report_inputs(config: Mapping, shards: ShardIndex) -> dict:
    inputs: dict = {
        "samples": shards.expand("results/samples/{dataset}/{shard}.counts.json"),
        "generated": shards.expand("results/generated/{dataset}/{shard}.counts.json"),
        "tokenized": shards.expand("results/tokenized/{dataset}/{shard}.meta.json"),
        "hidden": shards.expand(HIDDEN_SHARD),
        "vocab": "results/vocab/vocab_stats.json",
        "align": "results/align/report.json",
    }
    if config["report"]["train_metrics"]:
        inputs["train"] = config["report"]["train_metrics"]
    return inputs


def train_metrics_variant(config: Mapping, variants: Collection[str]) -> str | None:
    """The variant whose metrics report.train_metrics names (results/train/<variant>/...), whose
    bench rows train_vs_bench compares; None for metrics trained elsewhere."""
    for variant in variants:
        if config["report"]["train_metrics"] == f"results/train/{variant}/metrics.jsonl":
            return variant
    return None


def train_curves_dir(config: Mapping) -> str | None:
    """TensorBoard events beside the training metrics (rules/train.smk writes both)."""
    metrics = config["report"]["train_metrics"]
    return os.path.join(os.path.dirname(metrics), "tensorboard") if metrics else None
