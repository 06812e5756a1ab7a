"""Stage `variants`: one table and one plot comparing every drafter variant of the build.

Every variant (`train.variants`, plus `base`, the recipe of `train` itself) trains on hidden
states of the same shards with the same draft vocabulary; only training keys (and, through
`train.datasets`, which shards) differ, so this is the cheap search a build system makes
possible: the shards are the expensive part and are shared.

    results/train/<variant>/metrics.jsonl (each variant's eval rows)
    results/bench/<engine>/<variant>/<chain>.jsonl (each benched variant's rows, hf and sglang)
      -> results/tables/variants.{csv,md,html}: per variant the keys it changes, the datasets
         it trained on, the best eval row's simulated acceptance length (at its ttt_steps and
         at each benched chain) and per-position accuracies, its step, epoch and trained
         tokens, the run's training tokens/s at that row; then per engine, set and chain the
         measured acceptance length (Σcompletion/Σverify over the set's requests, both turns:
         `bench.metrics`) and, where the engine reports it (hf), acceptance per draft position
      -> results/plots/variants.png: simulated and measured acceptance length by variant

The simulated acceptance length is training's own estimate (1 + sum over k of the product of
per-position accuracies up to k, on its eval samples); the bench measures the served one.
A variant left out of bench.variants has empty measured columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specbuild.bench.chain import BASELINE, Chain  # noqa: E402
from specbuild.io import atomic_path  # noqa: E402
from specbuild.report.tables import (  # noqa: E402
    build_bench,
    read_rows,
    simulated_accept_length,
    write_table,
)

__all__ = ["BASE", "variant_table", "plot_variants", "write_variants"]

BASE = "base"  # the recipe of `train` itself (config_check.train_variants)
SIMULATED = "simulated acceptance length"  # training's estimate at the variant's ttt_steps


def _best_row(path: str | os.PathLike) -> dict:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no eval rows; did training evaluate at all?")
    return max(rows, key=lambda r: r["acceptance_length"])


def _changes(changes: Mapping) -> str:
    if not changes:
        return "(the train recipe)"
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())


def _measured(rows: Sequence[str | os.PathLike], set_order: Sequence[str]) -> pd.DataFrame:
    """The bench table (`report.tables.build_bench`) of the variants' drafted rows that count
    verify steps."""
    if not rows:
        return pd.DataFrame(columns=["engine", "set", "config", "drafter", "accept_length"])
    bench = build_bench(read_rows(rows), set_order)
    return bench[(bench["config"] != BASELINE) & bench["accept_length"].notna()]


def variant_table(
    metrics: Mapping[str, str | os.PathLike],
    changes: Mapping[str, Mapping],
    *,
    datasets: Mapping[str, Sequence[str]] | None = None,
    rows: Sequence[str | os.PathLike] = (),
    set_order: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per variant, in `metrics` order (base first): training's best eval row and the
    acceptance each engine measured on each set at each chain (`rows`, the bench row files of
    the benched variants)."""
    measured = _measured(rows, set_order)
    chains = list(dict.fromkeys(measured["config"]))
    keys = zip(measured["engine"], measured["set"], measured["config"], strict=True)
    groups = list(dict.fromkeys(keys))
    # per-position columns only where the engine reported positions (hf; sglang does not)
    reported = [c for c in measured.columns if c.startswith("accept_pos")]
    positions = {
        key: [c for c in reported if measured.loc[_same(measured, key), c].notna().any()]
        for key in groups
    }
    table = []
    for name, path in metrics.items():
        best = _best_row(path)
        row = {"variant": name, "changes": _changes(changes.get(name, {}))}
        if datasets is not None:
            row["datasets"] = ", ".join(datasets[name])
        row[SIMULATED] = best["acceptance_length"]
        row |= {
            f"simulated {c}": simulated_accept_length(best, Chain.parse(c).steps) for c in chains
        }
        row |= {f"acc {k}": acc for k, acc in enumerate(best["acc"], 1)}
        row |= {
            "best step": best["step"],
            "epoch": best["epoch"],
            "trained tokens": best["tokens"],
            "training tokens_per_s": best.get("tokens_per_s"),
        }
        mine = measured[measured["drafter"] == name].set_index(["engine", "set", "config"])
        for key in groups:
            label = " ".join(key)
            found = mine.loc[key] if key in mine.index else None
            row[label] = None if found is None else found["accept_length"]
            for col in positions[key]:
                rate = None if found is None else found[col]
                row[f"{label} pos{col.removeprefix('accept_pos')}"] = rate
        table.append(row)
    return pd.DataFrame(table)


def _same(measured: pd.DataFrame, key: tuple[str, str, str]) -> pd.Series:
    engine, bench_set, config = key
    return (
        (measured["engine"] == engine)
        & (measured["set"] == bench_set)
        & (measured["config"] == config)
    )


def _bar_columns(table: pd.DataFrame) -> list[str]:
    """What the plot draws per variant: training's estimate at each benched chain (or at its
    ttt_steps when nothing was benched), then each engine, set and chain measured."""
    simulated = [c for c in table if c.startswith("simulated ") and c != SIMULATED]
    measured = [
        c
        for c in table.columns[table.columns.get_loc("training tokens_per_s") + 1 :]
        if " pos" not in c
    ]
    return (simulated or [SIMULATED]) + measured


def plot_variants(table: pd.DataFrame, path: str | os.PathLike) -> None:
    """Acceptance length per variant, simulated and measured side by side (one colour each),
    with the 1.0 of no drafter."""
    columns = _bar_columns(table)
    n = len(table)
    height = 0.8 / len(columns)
    fig, ax = plt.subplots(figsize=(7.0, (0.35 * len(columns) + 0.3) * n + 1.2))
    colors = plt.get_cmap("tab10").colors
    top = 1.1
    for i, col in enumerate(columns):
        ys = [v + (i - (len(columns) - 1) / 2) * height for v in range(n)]
        values = pd.to_numeric(table[col], errors="coerce")
        bars = ax.barh(ys, values.fillna(0), height, color=colors[i % 10], label=col)
        ax.bar_label(bars, labels=[_label(v) for v in values], padding=3, fontsize=7)
        top = max(top, float(values.max()) if values.notna().any() else 0)
    ax.set_yticks(range(n), table["variant"])
    ax.invert_yaxis()  # base on top, variants in config order below
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)  # 1.0: nothing accepted
    ax.set_xlim(0, top * 1.2)
    ax.set_xlabel("acceptance length (tokens per verify step)")
    ax.set_title("Drafter variants: training's estimate and measured acceptance")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _label(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3f}"


def write_variants(
    *,
    metrics: Mapping[str, str | os.PathLike],
    changes: Mapping[str, Mapping],
    table: str | os.PathLike,
    plot: str | os.PathLike,
    datasets: Mapping[str, Sequence[str]] | None = None,
    rows: Sequence[str | os.PathLike] = (),
    set_order: Sequence[str] = (),
) -> pd.DataFrame:
    """The table (`table` is its .md; .csv and .html beside it) and the plot."""
    df = variant_table(metrics, changes, datasets=datasets, rows=rows, set_order=set_order)
    write_table(df, Path(table).with_suffix(""))
    plot_variants(df, plot)
    return df
