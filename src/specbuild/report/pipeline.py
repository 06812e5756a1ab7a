"""The build's part of the report: what the pipeline kept, made and spent, from its own files.

data    per dataset and stage (samples, generate, tokenize): records in, kept, rejected (the
        shards' .rejected.jsonl files), and the tokenized shards' rows and totals
        (`specbuild.tokenization.META_TOTALS`: truncation, turns dropped, tokens, response and
        reasoning tokens)
vocab   the draft vocabulary's coverage of the loss-masked target tokens (vocab_stats.json)
align   training features vs the serving engine's, per layer (results/align/report.json)
disk    files and bytes of every results folder the report reads; bytes per token of hidden
train   training's evaluations (metrics.jsonl) and train.png: the training loss of every
        progress line (TensorBoard events beside the metrics, when present), eval loss,
        accuracy per TTT step and simulated acceptance length, by optimizer step
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specbuild.align import ALIGN_KEYS
from specbuild.infra.io import read_json, read_jsonl
from specbuild.report.plots import plot_train
from specbuild.report.tables import check_written, format_cell, output_folders, write_table
from specbuild.tokenization import META_TOTALS

__all__ = [
    "PipelineFiles",
    "build_data",
    "build_vocab",
    "build_align",
    "build_disk",
    "build_train",
    "read_train_loss",
    "write_pipeline_report",
]

log = logging.getLogger("specbuild")


def build_data(
    datasets: Sequence[str],
    *,
    samples: Sequence[str | os.PathLike],
    generated: Sequence[str | os.PathLike],
    tokenized: Sequence[str | os.PathLike],
) -> pd.DataFrame:
    """One line per dataset and stage from the shards' counts (`samples`, `generated`: their
    .counts.json; `tokenized`: their .meta.json, which adds its rows and META_TOTALS)."""
    out = []
    for d in datasets:
        for stage, paths in (
            ("samples", samples),
            ("generate", generated),
            ("tokenize", tokenized),
        ):
            counts = [read_json(p) for p in paths if Path(p).parent.name == d]
            line = {"dataset": d, "stage": stage, "shards": len(counts)}
            for key in ("in", "kept", "rejected", "rows", *META_TOTALS):
                # a meta older than `kept` (records) had one row a record
                values = [
                    c.get(key, c.get("rows")) if key == "kept" else c.get(key) for c in counts
                ]
                line[key] = sum(values) if counts and None not in values else None
            out.append(line)
    table = pd.DataFrame(out)
    table.insert(6, "rejected_share", table["rejected"] / table["in"].where(table["in"] > 0))
    return table


def build_vocab(stats_path: str | os.PathLike) -> pd.DataFrame:
    """The vocab stats as quantity / value lines (coverage by the K most frequent tokens too)."""
    stats = read_json(stats_path)
    lines = [(k, v) for k, v in stats.items() if not isinstance(v, (dict, list))]
    top = sorted((stats.get("coverage_at") or {}).items(), key=lambda kv: int(kv[0]))
    lines += [(f"coverage_top_{k}", v) for k, v in top]
    return pd.DataFrame([(k, format_cell(v)) for k, v in lines], columns=["quantity", "value"])


def build_align(report_path: str | os.PathLike) -> pd.DataFrame:
    """Per layer: agreement of the training features with the serving engine's."""
    report = read_json(report_path)
    layers = pd.DataFrame(report["layers"], columns=list(ALIGN_KEYS))
    layers.insert(0, "training_features", ", ".join(report["shard_backends"]))
    layers.insert(1, "serving_engine", report["serving_backend"])
    return layers


def build_disk(paths: Sequence[str | os.PathLike], tokens: int) -> pd.DataFrame:
    """Files and bytes of each results folder holding one of `paths` (all of it, at report
    time), and the hidden states' bytes per tokenized token."""
    folders = dict.fromkeys(Path(*Path(p).parts[:2]) for p in paths)
    out = []
    for folder in folders:
        files = [f for f in folder.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        per = size / tokens if folder.name == "hidden" and tokens else None
        out.append({"folder": str(folder), "files": len(files), "bytes": size,
                    "mib": size / 2**20, "bytes_per_token": per})  # fmt: skip
    return pd.DataFrame(out)


def build_train(metrics_path: str | os.PathLike) -> pd.DataFrame:
    """Training's evaluations: step, epoch, tokens, eval loss, accuracy per TTT step,
    simulated acceptance length."""
    out = []
    for r in read_jsonl(metrics_path):
        if "acceptance_length" not in r:
            continue
        row = {k: r.get(k) for k in ("step", "epoch", "tokens", "eval_loss")}
        row |= {f"acc_{k}": a for k, a in enumerate(r.get("acc") or [], 1)}
        out.append(row | {"acceptance_length": r["acceptance_length"]})
    return pd.DataFrame(out)


def read_train_loss(curves_dir: str | os.PathLike | None) -> pd.DataFrame:
    """`train/loss` by step from the TensorBoard events training wrote (empty without them)."""
    if not curves_dir or not Path(curves_dir).is_dir():
        return pd.DataFrame(columns=["step", "loss"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(curves_dir), size_guidance={"scalars": 0})
    events.Reload()
    if "train/loss" not in events.Tags().get("scalars", []):
        return pd.DataFrame(columns=["step", "loss"])
    return pd.DataFrame([(e.step, e.value) for e in events.Scalars("train/loss")],
                        columns=["step", "loss"])  # fmt: skip


@dataclass(frozen=True)
class PipelineFiles:
    """The build's files the report reads: every shard of each stage, the vocab's stats, the
    align report, and training's metrics (None: no training in this build)."""

    samples: Sequence[str | os.PathLike]
    generated: Sequence[str | os.PathLike]
    tokenized: Sequence[str | os.PathLike]
    hidden: Sequence[str | os.PathLike]
    vocab_stats: str | os.PathLike
    align_report: str | os.PathLike
    train_metrics: str | os.PathLike | None = None


def write_pipeline_report(
    *,
    datasets: Sequence[str],
    files: PipelineFiles,
    outputs: Sequence[str | os.PathLike],
    curves_dir: str | os.PathLike | None = None,
) -> dict[str, pd.DataFrame]:
    """Write the data, vocab, align, disk (and train) tables and train.png into the folders
    of the declared `outputs`."""
    f = files
    tables_dir, plots_dir = output_folders(outputs)
    data = build_data(datasets, samples=f.samples, generated=f.generated, tokenized=f.tokenized)
    tokens = int(data.loc[data["stage"] == "tokenize", "tokens"].sum())
    inputs = [*f.samples, *f.generated, *f.tokenized, *f.hidden, f.vocab_stats, f.align_report]
    out = {
        "data": data,
        "vocab": build_vocab(f.vocab_stats),
        "align": build_align(f.align_report),
        "disk": build_disk(inputs + ([f.train_metrics] if f.train_metrics else []), tokens),
    }
    if f.train_metrics:
        out["train"] = build_train(f.train_metrics)
        loss = read_train_loss(curves_dir)
        log.info("training curves: %d eval rows, %d loss points", len(out["train"]), len(loss))
        plot_train(out["train"], loss, plots_dir / "train.png")
    for name, table in out.items():
        write_table(table, tables_dir / name)
    check_written(outputs)
    return out
