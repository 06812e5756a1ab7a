"""The bench's part of the report: its tables (`report.tables`) and plots (`report.plots`)
from every bench row file; the sweep's only where a served engine swept, per-position
acceptance where declared (the hf engine), training's estimate where its metrics are given,
ours against drafters built elsewhere where any is benched."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from specbuild.report import plots, tables

__all__ = ["write_bench_report"]


def write_bench_report(
    *,
    rows: Sequence[str | os.PathLike],
    set_order: Sequence[str],
    outputs: Sequence[str | os.PathLike],
    train_metrics: str | os.PathLike | None = None,
    train_drafter: str | None = None,
    peers: Sequence[str] = (),
) -> dict:
    """Write bench, positions, latency (+ sweep, train_vs_bench) tables and their plots into
    the folders of the declared `outputs`; raise if one of those was not written.
    `train_drafter` names the drafter `train_metrics` trained (None: unknown, every drafter's
    rows sit beside it). `peers`: the drafters built elsewhere (bench.drafters), each set
    against each of ours in the peers table where the rule declares it."""
    tables_dir, plots_dir = tables.output_folders(outputs)
    df = tables.read_rows(rows)
    out = {
        "bench": tables.build_bench(df, set_order),
        "latency": tables.build_latency(df, set_order),
    }
    declared = {Path(p).stem for p in outputs}
    if "positions" in declared:  # only the hf engine reports acceptance per position
        out["positions"] = tables.build_positions(out["bench"])
    if "peers" in declared:
        out["peers"] = tables.build_peers(df, peers, set_order)
    if (df["phase"] == "sweep").any():
        out["sweep"] = tables.build_sweep(df)
    if train_metrics:
        best = tables.best_train_row(train_metrics)
        out["train_vs_bench"] = tables.build_train_vs_bench(out["bench"], best, train_drafter)
    for name, table in out.items():
        tables.write_table(table, Path(tables_dir) / name)
    figures = Path(plots_dir)
    plots.plot_acceptance(out["bench"], figures / "acceptance.png")
    if "positions" in out:
        plots.plot_positions(out["positions"], out["bench"], figures / "positions.png")
    plots.plot_speedup(out["bench"], figures / "speedup.png")
    if "sweep" in out:
        plots.plot_sweep(out["sweep"], figures / "sweep.png")
    tables.check_written(outputs)
    return out
